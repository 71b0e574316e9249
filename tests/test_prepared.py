"""The small op's fast path (offload_lib/_prepared.py): team.alltoall (and an eager
team.allreduce into another array) on the same numpy arrays as a call before posts the
command that call encoded. It must give exactly what the full
way gives, every time, and anything the full check looked at that changed since (dtype,
writability, contiguity, size, address, the arrays themselves) must take the full way
again: the same errors, never a command for memory that is no longer what it was."""
from __future__ import annotations

import pytest

from _mp import run_ranks

EXACT = r'''
ctx = ol.init()
n = ctx.size
team = ctx.world
src = np.zeros(32 * n, np.int64)
dst = np.zeros(32 * n, np.int64)
for i in range(200):
    src[:] = np.arange(32 * n) + 1000 * rank + 10**6 * i  # new data every op
    dst[:] = -1
    team.alltoall(src, dst).wait(timeout=20)
    for s in range(n):
        check_equal(dst[32 * s:32 * (s + 1)],
                    np.arange(32 * rank, 32 * rank + 32) + 1000 * s + 10**6 * i, f"op {i} from {s}")
# The calls after the first took the kept command.
assert len(team._alltoalls._entries) == 1, team._alltoalls._entries

# Several pairs in turn (more than the cache keeps), views and sub-teams: each exact.
pairs = [(np.arange(8 * n, dtype=np.float32) + k + 100 * rank, np.zeros(8 * n, np.float32))
         for k in range(12)]
for rnd in range(3):
    for k, (s_, d_) in enumerate(pairs):
        d_[:] = -1
        team.alltoall(s_, d_).wait(timeout=20)
        for s in range(n):
            check_equal(d_[8 * s:8 * (s + 1)],
                        np.arange(8 * rank, 8 * rank + 8, dtype=np.float32) + k + 100 * s,
                        f"pair {k} round {rnd}")
assert len(team._alltoalls._entries) <= 8

# The command posted last is tried first (TeamCore's memo, kept.c), also once the cache
# evicted it: still exact, for the arrays it was encoded for.
a = np.arange(8 * n, dtype=np.int32) + 7 * rank
b = np.zeros(8 * n, np.int32)
for i in range(2):  # the second call posts the kept command and leaves it in the memo
    team.alltoall(a, b).wait(timeout=20)
others = [(np.zeros(8 * n, np.int32), np.zeros(8 * n, np.int32)) for _ in range(9)]
for s_, d_ in others:  # the full way (their first call): keep() evicts a's entry
    team.alltoall(s_, d_).wait(timeout=20)
assert (id(a), id(b)) not in team._alltoalls._entries
a += 1000
b[:] = -1
team.alltoall(a, b).wait(timeout=20)
for s in range(n):
    want = np.arange(8 * rank, 8 * rank + 8, dtype=np.int32) + 7 * s + 1000
    check_equal(b[8 * s:8 * (s + 1)], want, f"evicted, from {s}")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_repeated_alltoall_on_the_same_arrays_is_exact(n):
    run_ranks(n, EXACT, timeout=90)


# One rank: what changes in a live array between two calls is seen by the second.
CHANGED = r'''
import gc, warnings
ctx = ol.init()
team = ctx.world


def fresh(dtype=np.float32, count=64):
    return np.arange(count, dtype=dtype), np.zeros(count, dtype)


src, dst = fresh()
team.alltoall(src, dst).wait(timeout=20)
team.alltoall(src, dst).wait(timeout=20)
check_equal(dst, src, "same arrays")

# dst made read-only: the same error as the full check gives, nothing posted.
dst.flags.writeable = False
try:
    team.alltoall(src, dst)
    raise AssertionError("a read-only dst was posted")
except ol.InvalidArgument as e:
    assert "read-only" in str(e), e
dst.flags.writeable = True
team.alltoall(src, dst).wait(timeout=20)

# src reinterpreted as another dtype of the same size: src and dst differ now.
src.dtype = np.int32
try:
    team.alltoall(src, dst)
    raise AssertionError("differing dtypes were posted")
except ol.InvalidArgument as e:
    assert "int32" in str(e) and "float32" in str(e), e
src.dtype = np.float32
team.alltoall(src, dst).wait(timeout=20)
check_equal(dst, src, "dtype back")

# Both reinterpreted alike (float64 halves the count): valid, and still exact.
src.dtype = np.float64
dst.dtype = np.float64
dst[:] = 0
team.alltoall(src, dst).wait(timeout=20)
check_equal(dst, src, "both float64")
src.dtype = dst.dtype = np.float32

# Strides set in place (deprecated by numpy, still possible): no longer contiguous.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    s2, d2 = fresh()
    team.alltoall(s2, d2).wait(timeout=20)
    s2.shape = (2, 32)
    try:
        s2.strides = (4, 8)  # in bounds, not contiguous
        strided = True
    except (AttributeError, ValueError):
        strided = False  # a numpy that forbids it
    if strided:
        try:
            team.alltoall(s2, d2)
            raise AssertionError("a strided src was posted")
        except ol.InvalidArgument as e:
            assert "contiguous" in str(e), e

# New arrays in the place (and maybe under the id) of dead ones: their own memory.
for i in range(20):
    s3, d3 = fresh(np.int64, 16)
    s3 += i
    team.alltoall(s3, d3).wait(timeout=20)
    check_equal(d3, s3, f"fresh pair {i}")
    del s3, d3
    gc.collect()
ctx.close()

# A closed context refuses, also on the fast path.
try:
    team.alltoall(src, dst)
    raise AssertionError("posted on a closed context")
except ol.OffloadError as e:
    assert "closed" in str(e), e
'''


@pytest.mark.timeout(60)
def test_what_changed_in_an_array_takes_the_full_check_again():
    run_ranks(1, CHANGED, timeout=45)


# close() from another thread while this one loops on the fast path: the loop ends with
# OffloadError, promptly, and nothing hangs or crashes.
CLOSE_RACE = r'''
import threading
ctx = ol.init()
team = ctx.world
src = np.arange(16 * size, dtype=np.int64)
dst = np.zeros_like(src)
team.alltoall(src, dst).wait(timeout=20)
errors = []


def loop():
    try:
        while True:
            team.alltoall(src, dst).wait(timeout=20)
    except ol.OffloadError as e:
        errors.append(e)


t = threading.Thread(target=loop)
t.start()
time.sleep(0.3)
ctx.close()
t.join(timeout=30)
assert not t.is_alive(), "the loop hung after close()"
assert errors and not isinstance(errors[0], ol.Timeout), errors
'''


@pytest.mark.timeout(60)
def test_close_from_another_thread_ends_a_fast_path_loop():
    run_ranks(1, CLOSE_RACE, timeout=45)


# The allreduce's kept command (eager-sized, out apart from buf, op named by a string): the
# same exactness; another op on the same arrays, a read-only out, a dtype changed in place,
# in place and above eager_max all take the full way (and the full way's errors).
ALLREDUCE = r'''
ctx = ol.init()
n = ctx.size
team = ctx.world
buf = np.zeros(64, np.float32)
out = np.zeros(64, np.float32)
for i in range(100):
    buf[:] = np.arange(64) + rank + i
    out[:] = -1
    op = ("sum", "max", "min")[i % 3]
    team.allreduce(buf, op, out=out).wait(timeout=20)
    ranks = np.arange(n, dtype=np.float32)[:, None]
    want = {"sum": np.sum, "max": np.max, "min": np.min}[op](np.arange(64) + ranks + i, axis=0)
    check_equal(out, want.astype(np.float32), f"op {i} ({op})")
# One entry per (buf, out) pair, whose op is the last one posted.
assert len(team._allreduces._entries) == 1, team._allreduces._entries
team.allreduce(buf, "sum", out=out).wait(timeout=20)
team.allreduce(buf, "sum", out=out).wait(timeout=20)
assert team._allreduces.get(buf, out, "sum") is not None

out.flags.writeable = False
try:
    team.allreduce(buf, "sum", out=out)
    raise AssertionError("a read-only out was posted")
except ol.InvalidArgument as e:
    assert "read-only" in str(e), e
out.flags.writeable = True

buf.dtype = np.int32
try:
    team.allreduce(buf, "sum", out=out)
    raise AssertionError("differing dtypes were posted")
except ol.InvalidArgument as e:
    assert "must match" in str(e), e
buf.dtype = np.float32

# In place, eager-sized: kept as well (src and dst under one cookie: one registration with
# both rights, cached), exact whatever the data and op of each call.
x = np.ones(16, np.float32)
for i in range(30):
    x[:] = rank + 1 + i
    op = ("sum", "max")[i % 2]
    team.allreduce(x, op).wait(timeout=20)
    want = n * (n + 1) / 2 + n * i if op == "sum" else n + i
    check_equal(x, np.full(16, want, np.float32), f"in place {i} ({op})")
assert team._allreduces.get(x, x, "max") is not None
regs = ctx.stats()["registrations"]
for _ in range(10):
    team.allreduce(x, "max").wait(timeout=20)
assert ctx.stats()["registrations"] == regs, ("in place registered per op", regs, ctx.stats())
x.flags.writeable = False
try:
    team.allreduce(x)
    raise AssertionError("a read-only buffer was reduced in place")
except ol.InvalidArgument as e:
    assert "read-only" in str(e), e
# Above eager_max: never kept, exact.
big = np.ones(4096, np.float32)
big_out = np.zeros_like(big)
for _ in range(2):
    team.allreduce(big, out=big_out).wait(timeout=20)
check_equal(big_out, np.full(4096, n, np.float32), "rendezvous")
assert team._allreduces.get(big, big_out, "sum") is None
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 3])
def test_repeated_allreduce_on_the_same_arrays_is_exact(n):
    run_ranks(n, ALLREDUCE, timeout=90)
