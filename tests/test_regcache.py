"""host_post's registration cache (host/src/host_mr.c, offload_lib/_regcache.py): a buffer
used again is not registered again, and memory freed and allocated again at the same
address is never reached through the old registration."""
from __future__ import annotations

import pytest

from _mp import run_ranks

REPEATED = r'''
ctx = ol.init()
n = ctx.size
src = np.arange(64 * n, dtype=np.int64) + 1000 * rank
dst = np.zeros(64 * n, np.int64)
before = ctx.stats()
for i in range(100):
    dst[:] = -1
    ctx.world.alltoall(src, dst).wait(timeout=20)
    check_equal(dst[64 * 0:64], np.arange(64 * rank, 64 * rank + 64) + 0, f"op {i}")
after = ctx.stats()
made = after["registrations"] - before["registrations"]
hits = after["cache_hits"] - before["cache_hits"]
assert (made, hits) == (2, 198), f"100 all-to-alls: {made} registrations, {hits} cache hits"
assert after["cached_registrations"] == before["cached_registrations"] + 2

# Views of the same array share its registrations (the view keeps the array alive).
big = np.zeros(128 * n, np.int64)
mark = ctx.stats()
for i in range(10):
    ctx.world.alltoall(src, big[:64 * n]).wait(timeout=20)
now = ctx.stats()
assert now["registrations"] - mark["registrations"] == 1, "a view is registered once"
assert now["cache_hits"] - mark["cache_hits"] == 19

# An exporter that cannot be weakly referenced (bytearray) is registered per op.
raw = bytearray(src.nbytes)
mark = ctx.stats()
for i in range(3):
    ctx.world.alltoall(src, np.frombuffer(raw, np.int64)).wait(timeout=20)
now = ctx.stats()
# np.frombuffer makes a new array each time (a new exporter, whose cookie ends with it)
assert now["registrations"] - mark["registrations"] == 3, now
check_equal(np.frombuffer(raw, np.int64)[:64], np.arange(64 * rank, 64 * rank + 64), "bytearray")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_repeated_one_shot_alltoall_registers_each_buffer_once(n):
    run_ranks(n, REPEATED, timeout=90)


# The same address, another exporter: the first array's memory (an mmap) is unmapped and a
# new one mapped where it was; the cache must register the new memory, not hand back the
# registration made for the old (on a card: pinned pages that no longer belong to it).
SAME_ADDRESS = r'''
import gc, mmap
ctx = ol.init()
n = ctx.size
nbytes = 64 * 8 * n


def mapped():
    m = mmap.mmap(-1, nbytes)
    return m, np.frombuffer(m, np.int64)


src = np.arange(64 * n, dtype=np.int64) + 1000 * rank
m, dst = mapped()
addr = dst.ctypes.data
ctx.world.alltoall(src, dst).wait(timeout=20)
ctx.world.alltoall(src, dst).wait(timeout=20)
first = ctx.stats()
assert first["cached_registrations"] >= 2
reused = 0
for attempt in range(5):
    del dst
    gc.collect()
    m.close()
    gone = ctx.stats()
    # the dead exporter's registration was dropped at once, not kept for a later hit
    assert gone["cached_registrations"] == first["cached_registrations"] - 1, (first, gone)
    m, dst = mapped()
    dst[:] = -1
    reused += dst.ctypes.data == addr
    ctx.world.alltoall(src, dst).wait(timeout=20)
    check_equal(dst, np.concatenate([np.arange(64 * rank, 64 * rank + 64) + 1000 * s
                                     for s in range(n)]), f"attempt {attempt}")
    now = ctx.stats()
    assert now["registrations"] == gone["registrations"] + 1, (gone, now)
    assert now["cache_hits"] == gone["cache_hits"] + 1, "only src may hit"
    first = now
assert reused, "the kernel never mapped the new memory where the old was: nothing tested"
del dst
gc.collect()
m.close()
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2])
def test_memory_freed_and_mapped_again_at_the_same_address_is_registered_again(n):
    run_ranks(n, SAME_ADDRESS, timeout=90)
