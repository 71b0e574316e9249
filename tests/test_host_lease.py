"""The host's lease (emulator/emu_drive.c): after a host thread drove small ops, peers'
writes do not wake its rank's progress thread for a while, since the host is normally back
within microseconds (its wait()). A host that goes off to other work instead must not
hold its ops, nor its peers', for longer than the lease: its progress thread takes over.

Rank 0 runs small ops back to back first (its progress thread then sleeps under leases),
then posts a 16 KiB-per-peer all-to-all (small, but rendezvous: each peer's data moves
only once rank 0's firmware answers the peer's arrival) and sleeps in Python, outside the
library, for 1.5 s before it waits. The others post 0.3 ms after it, within its lease;
their ops must end while rank 0 is still away, within 200 ms (the lease is 1 ms; left
asleep past it, they would take the 1.5 s).
"""
from __future__ import annotations

import pytest

from _mp import run_ranks

AWAY = r'''
ctx = ol.init()
n, me = ctx.size, ctx.rank
team = ctx.world
small = np.arange(256 * n, dtype=np.float32)
small_out = np.empty_like(small)
for _ in range(300):
    team.alltoall(small, small_out).wait(timeout=20)
count = 4096  # 16 KiB per peer: above eager_max, below the bulk class
src = np.arange(count * n, dtype=np.float32) + 1e6 * me
dst = np.zeros_like(src)
want = np.concatenate([np.arange(count * me, count * (me + 1), dtype=np.float32) + 1e6 * p
                       for p in range(n)])
team.barrier().wait(timeout=20)
if me == 0:
    req = team.alltoall(src, dst)
    time.sleep(1.5)  # other work, outside the library
    req.wait(timeout=20)
else:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 3e-4:  # rank 0 has left by now, within its lease
        pass
    t0 = time.perf_counter()
    team.alltoall(src, dst).wait(timeout=20)
    took = time.perf_counter() - t0
    assert took < 0.2, f"rank {me} waited {took * 1e3:.0f} ms for rank 0's absent host"
check_equal(dst, want, "all-to-all with rank 0 away")
team.barrier().wait(timeout=20)
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_a_host_gone_to_other_work_leaves_its_ops_to_the_progress_thread(n):
    run_ranks(n, AWAY, timeout=90, env={"OFFLOAD_EAGER_MAX": "8192"})
