"""A process that claims a rank of a live job, or joins it with another size, is refused
without disturbing the live ranks (their registrations, control words and segment size)."""
from __future__ import annotations

import pytest

from _mp import run_ranks

INTRUDERS = r'''
import subprocess
ctx = ol.init()
src = np.arange(4 * size, dtype=np.int32) + 100 * rank
dst = np.zeros_like(src)
ctx.world.alltoall(src, dst).wait(timeout=10)
if rank == 0:
    for what, extra in (("same rank", {"OFFLOAD_RANK": "1"}),
                        ("other size", {"OFFLOAD_RANK": "0", "OFFLOAD_SIZE": "3"})):
        env = dict(os.environ, OFFLOAD_BOOTSTRAP_TIMEOUT="2", **extra)
        p = subprocess.run([sys.executable, "-c", "import offload_lib as ol; ol.init()"],
                           env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, f"{what}: the intruder joined the job"
        assert "OffloadError" in p.stderr, p.stderr
ctx.world.barrier().wait(timeout=10)
dst[:] = 0
ctx.world.alltoall(src, dst).wait(timeout=10)
expected = np.concatenate([np.arange(4 * rank, 4 * rank + 4, dtype=np.int32) + 100 * s
                           for s in range(size)])
check_equal(dst, expected, "after the intruders")
ctx.close()
'''


@pytest.mark.timeout(90)
def test_intruders_are_refused_and_the_job_goes_on():
    run_ranks(2, INTRUDERS, timeout=60)


FRESH_DESTINATIONS = r'''
ctx = ol.init()
src = np.arange(16 * size, dtype=np.int32) + 1000 * rank
expected = np.concatenate([np.arange(16 * rank, 16 * rank + 16, dtype=np.int32) + 1000 * s
                           for s in range(size)])
# More ctx.empty() segments over the job's life than a peer can keep mapped at once (256):
# peers must drop the mappings of freed segments.
for i in range(300):
    dst = ctx.empty(16 * size, np.int32)
    ctx.world.alltoall(src, dst).wait(timeout=10)
    check_equal(dst, expected, f"destination {i}")
    del dst
ctx.close()
'''


@pytest.mark.timeout(120)
def test_many_short_lived_shared_destinations():
    run_ranks(2, FRESH_DESTINATIONS, timeout=90)


# More peers' segments alive at once than a rank keeps mapped (EMU_MAX_MAPS, 256), as in a
# job past 256 ranks writing into ctx.empty() destinations: idle mappings are dropped and
# mapped again when needed. Blocks past eager_max, so that the peers' NICs write into the
# segments (RemoteAccessError once 256 peer segments were mapped, before the eviction).
LIVE_DESTINATIONS = r'''
ctx = ol.init()
per = 2048
src = np.arange(per * size, dtype=np.int64) + 1_000_000 * rank
dsts = [ctx.empty(per * size, np.int64) for _ in range(150)]
for i, d in enumerate(dsts):
    ctx.world.alltoall(src, d).wait(timeout=20)
want = np.concatenate([np.arange(per * rank, per * rank + per) + 1_000_000 * p
                       for p in range(size)])
for i, d in enumerate(dsts):  # written first, checked after the last: every mapping stayed right
    check_equal(d, want, f"destination {i}")
ctx.close()
'''


@pytest.mark.timeout(120)
def test_more_live_shared_destinations_than_a_rank_keeps_mapped():
    run_ranks(3, LIVE_DESTINATIONS, timeout=90)
