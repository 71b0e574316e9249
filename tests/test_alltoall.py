"""All-to-all and barrier through the public API, on real multi-rank jobs.

Each team size runs ONE job that batches every check (sizes x dtypes x buffer kinds, ops in
flight together, a sub-team, barrier, buffer-protocol objects), so the suite stays fast on a
2-core machine. Every rank checks its destination element by element against numpy.

Rank r's source block for peer j holds values f(r, j, k) (k = index in the block), so a block
that lands at the wrong offset, comes from the wrong rank, or is shifted shows up.
The random size is drawn from OFFLOAD_TEST_SEED (printed; set it to replay a run).
"""
from __future__ import annotations

import importlib.util

import pytest

from _mp import run_ranks

# Shared by the rank scripts: the reference pattern and one checked all-to-all.
COMMON = r'''
SEED = int(os.environ["A2A_SEED"])
MIB = 1 << 20
DTYPES = [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.float64)]
GUARD = 64  # elements of sentinel on each side of a numpy destination
print(f"seed={SEED}")


def cast(v, dt):
    """int64 values -> dt, exactly representable and still telling (r, j, k) apart."""
    if dt == np.uint8:
        return (v % 251).astype(dt)
    if dt == np.float32:
        return (v % (1 << 20)).astype(dt) + np.float32(0.25)
    if dt == np.float64:
        return v.astype(dt) + 0.5
    return v.astype(dt)


def block(r, j, count, dt, salt=0):
    """What rank r sends to peer j: count elements of dt."""
    k = np.arange(count, dtype=np.int64)
    return cast(k * 31 + (r * 7919 + j * 104729 + salt * 1299709 + 17), dt)


def fill_src(src, me, n, count, dt, salt=0):
    for j in range(n):
        src[j * count:(j + 1) * count] = block(me, j, count, dt, salt)


def sentinel(dt):
    return np.array(0xAB, dtype=np.int64).astype(dt) if dt.kind in "iu" else dt.type(-7.75)


def check_dst(dst, me, n, count, dt, what, salt=0):
    """dst on team rank `me` holds block(i, me) from every team rank i."""
    for i in range(n):
        check_equal(dst[i * count:(i + 1) * count], block(i, me, count, dt, salt),
                    f"{what}: block from team rank {i}")


def make_buffers(ctx, kind, n, count, dt):
    """(src, dst, guard_check) for one case; dst is prefilled with a sentinel."""
    total = n * count
    if kind == "empty":
        src = ctx.empty(total, dt)
        dst = ctx.empty(total, dt)
        dst[:] = sentinel(dt)
        assert src.dtype == dt and src.shape == (total,) and src.flags.writeable
        return src, dst, lambda what: None
    src = np.empty(total, dt)
    big = np.full(total + 2 * GUARD, sentinel(dt), dt)
    dst = big[GUARD:GUARD + total]

    def guards(what):
        check_equal(big[:GUARD], np.full(GUARD, sentinel(dt), dt), f"{what}: guard before dst")
        check_equal(big[GUARD + total:], np.full(GUARD, sentinel(dt), dt),
                    f"{what}: guard after dst")

    return src, dst, guards


def run_case(ctx, team, kind, count, dt, salt=0):
    n, me = team.size, team.rank
    what = f"n={n} team={team.id} rank={me} kind={kind} dtype={dt} count/peer={count}"
    src, dst, guards = make_buffers(ctx, kind, n, count, dt)
    fill_src(src, me, n, count, dt, salt)
    src_before = src.copy()
    req = team.alltoall(src, dst)
    req.wait(timeout=60)
    assert req.test(), what
    check_dst(dst, me, n, count, dt, what, salt)
    check_equal(src, src_before, f"{what}: src must not change")
    guards(what)
'''

PER_SIZE = COMMON + r'''
ctx = ol.init()
team = ctx.world
n = size
assert team.size == n and team.rank == rank and ctx.size == n and ctx.rank == rank

rng = np.random.default_rng(SEED)
rand_count = int(rng.integers(2, 6000))  # same on every rank: same seed
print(f"random count per peer: {rand_count}")

# 1. sizes x dtypes x buffer kinds
for dt in DTYPES:
    counts = [0, 1, 7, 4096, MIB // dt.itemsize, rand_count]
    for count in counts:
        for kind in ("numpy", "empty"):
            run_case(ctx, team, kind, count, dt)

# 2. two (three) ops in flight: different buffers, dtypes and sizes; waited out of order
s1, d1, g1 = make_buffers(ctx, "numpy", n, 1000, np.dtype(np.int64))
s2, d2, g2 = make_buffers(ctx, "empty", n, 333, np.dtype(np.float32))
s3, d3, g3 = make_buffers(ctx, "numpy", n, 5, np.dtype(np.uint8))
fill_src(s1, rank, n, 1000, s1.dtype, salt=1)
fill_src(s2, rank, n, 333, s2.dtype, salt=2)
fill_src(s3, rank, n, 5, s3.dtype, salt=3)
r1 = team.alltoall(s1, d1)
r2 = team.alltoall(s2, d2)
r3 = team.alltoall(s3, d3)
r2.wait(timeout=60)
r3.wait(timeout=60)
r1.wait(timeout=60)
check_dst(d1, rank, n, 1000, s1.dtype, "in flight #1", salt=1)
check_dst(d2, rank, n, 333, s2.dtype, "in flight #2", salt=2)
check_dst(d3, rank, n, 5, s3.dtype, "in flight #3", salt=3)
g1("in flight #1")
g3("in flight #3")

# 2b. more ops in flight than the firmware's per-team window (8): intake must back-pressure,
# not drop or reorder; completion polled with test() for half of them
many = []
for i in range(20):
    dt = DTYPES[i % len(DTYPES)]
    s, d, g = make_buffers(ctx, "empty" if i % 3 == 0 else "numpy", n, 3 + i, dt)
    fill_src(s, rank, n, 3 + i, dt, salt=100 + i)
    many.append((team.alltoall(s, d), s, d, g, dt, i))
for req, s, d, g, dt, i in reversed(many):
    if i % 2:
        deadline = time.monotonic() + 60
        while not req.test():
            assert time.monotonic() < deadline, f"op {i} of 20 never completed"
            time.sleep(0.0005)
    else:
        req.wait(timeout=60)
    check_dst(d, rank, n, 3 + i, dt, f"20 in flight, op {i}", salt=100 + i)
    g(f"20 in flight, op {i}")
del many

# 2c. ranks mixing buffer kinds in one op: shared-memory and process_vm paths together
for count in (1, 4096, 100_000):
    kind = "empty" if rank % 2 else "numpy"
    run_case(ctx, team, kind, count, np.dtype(np.int64), salt=9)
    run_case(ctx, team, "numpy" if rank % 2 else "empty", count, np.dtype(np.float32), salt=10)

# 3. buffer-protocol objects
import array
c = 13
ba_src = bytearray(np.concatenate([block(rank, j, c, np.dtype(np.uint8)) for j in range(n)]).tobytes())
ba_dst = bytearray(n * c)
team.alltoall(ba_src, ba_dst).wait(timeout=60)
check_dst(np.frombuffer(ba_dst, np.uint8), rank, n, c, np.dtype(np.uint8), "bytearray")

ms, md = np.empty(n * c, np.int64), np.zeros(n * c, np.int64)
fill_src(ms, rank, n, c, ms.dtype, salt=4)
team.alltoall(memoryview(ms), memoryview(md)).wait(timeout=60)
check_dst(md, rank, n, c, md.dtype, "memoryview(int64)", salt=4)

aa_src = array.array("d", np.concatenate([block(rank, j, c, np.dtype(np.float64), 5) for j in range(n)]))
aa_dst = array.array("d", bytes(8 * n * c))
team.alltoall(aa_src, aa_dst).wait(timeout=60)
check_dst(np.frombuffer(aa_dst, np.float64), rank, n, c, np.dtype(np.float64), "array.array('d')", salt=5)

# numpy src into a memoryview of a bytearray dst (same dtype: uint8)
mixed_dst = bytearray(n * c)
u8 = np.empty(n * c, np.uint8)
fill_src(u8, rank, n, c, u8.dtype, salt=6)
team.alltoall(u8, memoryview(mixed_dst)).wait(timeout=60)
check_dst(np.frombuffer(mixed_dst, np.uint8), rank, n, c, np.dtype(np.uint8), "numpy->memoryview", salt=6)

# 4. barrier: nobody leaves before everybody arrived (staggered arrival; times exchanged
# with an all-to-all; CLOCK_MONOTONIC is system-wide)
for rep in range(3):
    time.sleep(0.02 * ((rank + rep) % n))
    t_in = time.monotonic()
    team.barrier().wait(timeout=60)
    t_out = time.monotonic()
    times = np.array([t_in, t_out] * n, np.float64)
    got = np.zeros_like(times)
    team.alltoall(times, got).wait(timeout=60)
    arrivals = got[0::2]
    assert t_out >= arrivals.max(), (
        f"barrier rep {rep}: rank {rank} left at {t_out} before rank "
        f"{int(arrivals.argmax())} arrived at {arrivals.max()}")
# back-to-back barriers, several in flight
reqs = [team.barrier() for _ in range(5)]
for r in reqs:
    r.wait(timeout=60)

# 5. a sub-team (collective over all ranks; members in a non-sorted order) running an
# all-to-all while the other ranks idle in a world barrier
members = list(range(n - 1, -1, -2))  # e.g. n=5: [4, 2, 0]
sub = ctx.create_team(members)
if rank in members:
    assert sub is not None, f"rank {rank} is in {members} but got None"
    assert sub.size == len(members) and sub.rank == members.index(rank), repr(sub)
    assert sub.ranks == tuple(members)
    for dt, count in ((np.dtype(np.int64), 777), (np.dtype(np.float32), 0),
                      (np.dtype(np.uint8), 4096)):
        for kind in ("numpy", "empty"):
            run_case(ctx, sub, kind, count, dt, salt=7)
    sub.barrier().wait(timeout=60)
else:
    assert sub is None, f"rank {rank} is not in {members} but got {sub!r}"
team.barrier().wait(timeout=60)
# the world still works after the sub-team ran
run_case(ctx, team, "numpy", 64, np.dtype(np.float64), salt=8)

st = ctx.stats()
assert st["bytes"] > 0 and st["chunks"] > 0, st
ctx.close()
print("ok")
'''


@pytest.mark.parametrize(
    "n",
    [
        pytest.param(1, marks=pytest.mark.timeout(90)),
        pytest.param(2, marks=pytest.mark.timeout(90)),
        pytest.param(3, marks=pytest.mark.timeout(90)),
        pytest.param(4, marks=pytest.mark.timeout(120)),
        pytest.param(5, marks=pytest.mark.timeout(120)),
        pytest.param(8, marks=pytest.mark.timeout(180)),
    ],
)
def test_alltoall_team_size(n, test_seed):
    """Sizes 0/1/7/4096/1 MiB/random x 4 dtypes x numpy/ctx.empty, ops in flight, buffer
    protocol, barrier, sub-team: all in one job of n ranks."""
    timeout = {1: 60, 2: 60, 3: 60, 4: 90, 5: 90, 8: 150}[n]
    out = run_ranks(n, PER_SIZE, timeout=timeout, env={"A2A_SEED": str(test_seed)})
    for r in range(n):
        assert out[r].splitlines()[-1] == "ok", out[r]


PERSISTENT = COMMON + r'''
ctx = ol.init()
team = ctx.world
n, count, iters = size, 1000, 200
src = np.empty(n * count, np.float64)
big = np.full(n * count + 2 * GUARD, -1.0)
dst = big[GUARD:GUARD + n * count]
p = team.alltoall_init(src, dst)
assert "idle" in repr(p), repr(p)
for it in range(iters):
    fill_src(src, rank, n, count, src.dtype, salt=it)  # new data every time, same buffer
    dst[:] = -1.0
    assert p.post() is p
    assert "posted" in repr(p), repr(p)
    p.wait(timeout=60)
    check_dst(dst, rank, n, count, dst.dtype, f"persistent iteration {it}", salt=it)
assert p.test() is True
check_equal(big[:GUARD], np.full(GUARD, -1.0), "guard before dst")
check_equal(big[-GUARD:], np.full(GUARD, -1.0), "guard after dst")

# a persistent op on ctx.empty() buffers, interleaved with one-shot ops on other buffers
es, ed = ctx.empty(n * 64, np.int64), ctx.empty(n * 64, np.int64)
q = team.alltoall_init(es, ed)
os_, od = np.empty(n * 8, np.uint8), np.zeros(n * 8, np.uint8)
for it in range(20):
    fill_src(es, rank, n, 64, es.dtype, salt=1000 + it)
    fill_src(os_, rank, n, 8, os_.dtype, salt=2000 + it)
    q.post()
    one = team.alltoall(os_, od)
    one.wait(timeout=60)
    q.wait(timeout=60)
    check_dst(ed, rank, n, 64, ed.dtype, f"persistent(empty) iteration {it}", salt=1000 + it)
    check_dst(od, rank, n, 8, od.dtype, f"one-shot next to persistent, iteration {it}",
              salt=2000 + it)
p.free()
p.free()  # harmless
assert "freed" in repr(p), repr(p)
with q:
    pass  # __exit__ frees
assert "freed" in repr(q), repr(q)
ctx.close()
print("ok")
'''


@pytest.mark.timeout(90)
def test_persistent_alltoall_200_posts(test_seed):
    out = run_ranks(3, PERSISTENT, timeout=75, env={"A2A_SEED": str(test_seed)})
    assert all(o.splitlines()[-1] == "ok" for o in out), out


TORCH = COMMON + r'''
import torch
ctx = ol.init()
team = ctx.world
n = size
for tdt, ndt in ((torch.float32, np.float32), (torch.int64, np.int64), (torch.uint8, np.uint8),
                 (torch.float64, np.float64)):
    for count in (0, 1, 7, 4096):
        dt = np.dtype(ndt)
        ref = np.empty(n * count, dt)
        fill_src(ref, rank, n, count, dt)
        src = torch.from_numpy(ref.copy())
        dst = torch.zeros(n * count, dtype=tdt)
        team.alltoall(src, dst).wait(timeout=60)
        check_dst(dst.numpy(), rank, n, count, dt, f"torch {tdt} count={count}")
ctx.close()
print("ok")
'''


@pytest.mark.timeout(90)
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (optional; not installed for these tests)")
def test_alltoall_torch_cpu_tensors(test_seed):
    out = run_ranks(3, TORCH, timeout=75, env={"A2A_SEED": str(test_seed)})
    assert all(o.splitlines()[-1] == "ok" for o in out), out


# Back-to-back small ops on the same arrays (the prepared fast path, the eager protocol's
# slots reused many times over, a pass that reaps its own writes' completions and moves
# the op on at once): every op's data is new and checked whole.
BACK_TO_BACK = COMMON + r'''
ctx = ol.init()
team = ctx.world
n = size
for count, dt, ops in ((256, np.dtype(np.float32), 1500), (1, np.dtype(np.uint8), 300),
                       (1000, np.dtype(np.int64), 200)):
    src, dst = np.empty(n * count, dt), np.empty(n * count, dt)
    for it in range(ops):
        fill_src(src, rank, n, count, dt, salt=it)
        dst[:] = 0
        team.alltoall(src, dst).wait()
        check_dst(dst, rank, n, count, dt, f"back to back {dt} x {count}, op {it}", salt=it)
ctx.close()
print("ok")
'''


@pytest.mark.timeout(150)
def test_alltoall_small_back_to_back(test_seed):
    out = run_ranks(4, BACK_TO_BACK, timeout=120, env={"A2A_SEED": str(test_seed)})
    assert all(o.splitlines()[-1] == "ok" for o in out), out
