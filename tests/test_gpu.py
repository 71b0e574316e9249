"""GPU buffers through the staging path, on the fake CUDA driver (tests/fake_cuda.py).

Every rank's "producer kernel" writes its source on the user's stream only after a delay,
and a "consumer kernel" queued right after the collective snapshots the destination: the
results must be exact in the snapshot (stream order: after the producer, visible to the next
kernel) and in the buffer after ``wait()``. The real-GPU versions are in test_gpu_cuda.py.
"""
from __future__ import annotations

import os

import pytest

from _mp import run_ranks

TESTS = os.path.dirname(os.path.abspath(__file__))

PRELUDE = f'''
import sys
sys.path.insert(0, {TESTS!r})
from fake_cuda import FakeDriver, DeviceArray, DLPackOnly, LEGACY_STREAM
from offload_lib import _cuda
drv = FakeDriver()
_cuda.use(drv)
ctx = ol.init()
team = ctx.world
n, me = team.size, team.rank
USER = drv.stream_create()  # the user's stream

def produce(arr, values, delay=0.02 * (rank + 1)):
    """Queue a kernel writing values into arr after a delay; it runs on arr's stream."""
    values = np.ascontiguousarray(values).reshape(arr.shape)
    def kernel():
        time.sleep(delay)
        arr.host()[...] = values
    drv.kernel(arr.stream, kernel)

def consume(arr):
    """Queue a kernel snapshotting arr; returns the dict it fills."""
    out = {{}}
    drv.kernel(arr.stream, lambda: out.__setitem__("v", arr.host().copy()))
    return out

def dev(shape, dtype, **kw):
    return DeviceArray(drv, shape, dtype, stream=kw.pop("stream", USER), **kw)

def pattern(src, dst, count, dtype):
    k = np.arange(count, dtype=np.int64)
    return ((src * 37 + dst * 11 + k) % 120).astype(dtype)
'''


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.timeout(120)
def test_staged_collectives_are_exact_and_stream_ordered(n):
    run_ranks(n, PRELUDE + r'''
for dtype, count in (("float32", 1), ("int64", 1000), ("float32", 300_000)):
    # 300k float32 per peer with gpu_piece 64K: several pieces, their copies overlapping
    src, dst = dev(n * count, dtype), dev(n * count, dtype)
    produce(src, np.concatenate([pattern(me, j, count, dtype) for j in range(n)]))
    req = team.alltoall(src, dst)
    seen = consume(dst)
    req.wait(timeout=60)
    want = np.concatenate([pattern(i, me, count, dtype) for i in range(n)])
    drv.synchronize(USER)
    check_equal(seen["v"], want, f"alltoall {dtype} x{count}: next kernel's view")
    check_equal(dst.host(), want, f"alltoall {dtype} x{count}: after wait")

    # all-gather
    src, dst = dev(count, dtype), dev(n * count, dtype)
    produce(src, pattern(me, 0, count, dtype))
    req = team.allgather(src, dst)
    seen = consume(dst)
    counts = req.wait(timeout=60)  # summed over the staged pieces
    assert counts.bytes_injected == count * np.dtype(dtype).itemsize, counts
    drv.synchronize(USER)
    check_equal(seen["v"], np.concatenate([pattern(i, 0, count, dtype) for i in range(n)]),
                f"allgather {dtype} x{count}")

    # broadcast from every root
    for root in range(n):
        buf = dev(count, dtype)
        if me == root:
            produce(buf, pattern(root, 5, count, dtype))
        req = team.broadcast(buf, root)
        seen = consume(buf)
        req.wait(timeout=60)
        drv.synchronize(USER)
        check_equal(seen["v"], pattern(root, 5, count, dtype), f"broadcast {dtype} root {root}")

st = ctx.stats()["gpu"]
assert st["path"] == "staged" and st["pieces"] > st["ops"], st
assert st["d2h_bytes"] > 0 and st["h2d_bytes"] > 0, st
print("gpu stats", st)
ctx.close()
''', timeout=100, env={"OFFLOAD_GPU_PIECE": "64K"})


@pytest.mark.timeout(120)
def test_staged_alltoallv_rows_and_mixed_buffers():
    run_ranks(3, PRELUDE + r'''
rng = np.random.default_rng(5)
counts = rng.integers(0, 40, (n, n))
counts[1, :] = 0  # a rank that sends nothing
sends, recvs = counts[me], counts[:, me]
src = dev(int(sends.sum()) + 3, "int32")
vals = np.concatenate([pattern(me, j, int(c), "int32") for j, c in enumerate(sends)] +
                      [np.full(3, -7, np.int32)])
produce(src, vals)
dst = dev(int(recvs.sum()) + 5, "int32")
drv.kernel(USER, lambda: dst.host().fill(-1))
got = team.alltoallv(src, sends, dst).wait(timeout=60)
check_equal(got, recvs.astype(np.int64), "received counts")
drv.synchronize(USER)
want = np.concatenate([pattern(i, me, int(c), "int32") for i, c in enumerate(recvs)])
check_equal(dst.host()[:want.size], want, "alltoallv data")
check_equal(dst.host()[want.size:], np.full(5, -1, np.int32), "alltoallv: past the data")

# slots: rank s's data at [s*slot, s*slot + count)
slot = int(counts.max())
dst = dev(n * slot, "int32")
drv.kernel(USER, lambda: dst.host().fill(-1))
team.alltoallv(src, sends, dst, slot=slot).wait(timeout=60)
drv.synchronize(USER)
for i, c in enumerate(recvs.tolist()):
    check_equal(dst.host()[i * slot:i * slot + c], pattern(i, me, c, "int32"), f"slot {i}")
    check_equal(dst.host()[i * slot + c:(i + 1) * slot], np.full(slot - c, -1, np.int32),
                f"slot {i} tail")

# rows gathered from a GPU table (MoE dispatch)
table = dev((6, 4), "float32")
produce(table, np.arange(24, dtype=np.float32).reshape(6, 4) + 100 * me)
rows = np.array([5, 0, 2])  # to ranks 0, 1, 2: one row each
per_rank = np.ones(n, np.int64)
out = dev((n, 4), "float32")
got = team.alltoallv_rows(table, rows, per_rank, out).wait(timeout=60)
drv.synchronize(USER)
want = np.stack([np.arange(24, dtype=np.float32).reshape(6, 4)[rows[me]] + 100 * i
                 for i in range(n)])
check_equal(out.host(), want, "rows from a GPU table")

# GPU rows placed by index into host tables (MoE combine): row j of ours lands at row
# me + 1 of rank j's table
landing = np.full((n + 2, 4), -1, np.float32)
got = team.alltoallv_place(table, per_rank, landing, np.full(n, me + 1)).wait(timeout=60)
check_equal(got, np.ones(n, np.int64), "placed rows received")
want = np.full((n + 2, 4), -1, np.float32)
for i in range(n):
    want[i + 1] = np.arange(24, dtype=np.float32).reshape(6, 4)[me] + 100 * i
check_equal(landing, want, "GPU rows placed in a host table")

# host src, GPU dst and the reverse; a DLPack-only exporter
count = 1000
host_src = np.concatenate([pattern(me, j, count, "float32") for j in range(n)])
gpu_dst = dev(n * count, "float32")
team.alltoall(host_src, gpu_dst).wait(timeout=60)
drv.synchronize(USER)
want = np.concatenate([pattern(i, me, count, "float32") for i in range(n)])
check_equal(gpu_dst.host(), want, "host -> GPU")
host_dst = np.empty(n * count, np.float32)
gpu_src = dev(n * count, "float32", stream=LEGACY_STREAM)
produce(gpu_src, host_src)
team.alltoall(DLPackOnly(gpu_src), host_dst).wait(timeout=60)
check_equal(host_dst, want, "GPU (DLPack) -> host")

# a host op right after a staged one keeps its place in the team's order on every rank
a_src, a_dst = dev(n * 64, "int64"), dev(n * 64, "int64")
produce(a_src, np.concatenate([pattern(me, j, 64, "int64") for j in range(n)]), delay=0.1 * me)
staged = team.alltoall(a_src, a_dst)
if me == 0:
    time.sleep(0.05)  # rank 0's staged op reaches the ring first, the others' much later
h_src = np.concatenate([pattern(me, j, 8, "int64") + 1 for j in range(n)])
h_dst = np.empty_like(h_src)
team.alltoall(h_src, h_dst).wait(timeout=60)
staged.wait(timeout=60)
drv.synchronize(USER)
check_equal(h_dst, np.concatenate([pattern(i, me, 8, "int64") + 1 for i in range(n)]), "host op")
check_equal(a_dst.host(), np.concatenate([pattern(i, me, 64, "int64") for i in range(n)]),
            "staged op before it")
ctx.close()
''', timeout=100)


@pytest.mark.timeout(120)
def test_gpu_errors_are_clear_and_never_hang_the_stream():
    run_ranks(2, PRELUDE + r'''
def refused(fn, words):
    try:
        fn()
    except ol.InvalidArgument as e:
        assert all(w in str(e) for w in words), e
        return
    raise AssertionError(f"accepted: {words}")

a, b = dev(8, "float32"), dev(8, "float32")
refused(lambda: team.alltoall(a, dev(8, "float32", strides=(8,))), ["contiguous"])
refused(lambda: team.alltoall(a, dev(8, "float32", readonly=True)), ["read-only"])
refused(lambda: team.alltoall(a, dev(8, "float64")), ["float64"])
refused(lambda: team.alltoall(a, dev(8, "float32", stream=LEGACY_STREAM)), ["streams"])
refused(lambda: team.alltoall_init(a, b), ["persistent", "GPU"])
refused(lambda: team.alltoall(a, dev(6, "float32")), ["elements"])
refused(lambda: team.alltoallv_place(dev((2, 4), "float32"), [1, 1], dev((2, 4), "float32"),
                                     [0, 1]), ["host memory"])

# A destination too small on rank 1: its wait() says so, rank 0 learns rank 1 failed, and
# both users' streams go on (the completion word is raised on errors too).
src = dev(10, "int32")
produce(src, np.arange(10, dtype=np.int32))
dst = dev(10 if me == 0 else 7, "int32")
req = team.alltoallv(src, [5, 5], dst)
after = consume(dst)
try:
    req.wait(timeout=60)
    raise AssertionError("a too-small GPU destination was accepted")
except ol.OffloadError as e:
    print("error:", e)
    assert ("too small" in str(e)) if me == 1 else ("rank 1" in str(e)), e
drv.synchronize(USER, timeout=10)
assert "v" in after
ctx.close()
''', timeout=60)


# A staged GPU op called before a host persistent request's post() takes its place in line
# first, on every rank, whenever its producer finishes: rank 1's producer is slow and it
# posts at once, rank 0's is quick and it posts after its staged op left. A post() that
# went past the staged op (the persistent request was made before the stager existed)
# would pair rank 0's staged op with rank 1's persistent one.
@pytest.mark.timeout(120)
def test_persistent_post_waits_for_staged_ops_called_before():
    run_ranks(2, PRELUDE + r'''
count = 64
a = np.repeat(np.arange(n, dtype=np.float32), count) + 10 * me
b = np.zeros(n * count, np.float32)
p = team.alltoall_init(a, b)           # no GPU buffer yet: no stager
assert p._staged is False
gsrc, gdst = dev(n * 16, "float32"), dev(n * 16, "float32")
produce(gsrc, np.full(n * 16, 100 + me, np.float32), delay=0.4 if me == 1 else 0.01)
req = team.alltoall(gsrc, gdst)
assert p._staged is True
if me == 0:
    time.sleep(0.2)                    # its staged op is in the queue by now
p.post()
p.wait(timeout=60)
req.wait(timeout=60)
check_equal(b, np.repeat(10 * np.arange(n, dtype=np.float32), count) + me, "persistent")
drv.synchronize(USER, timeout=10)
check_equal(gdst.host(), np.repeat(100 + np.arange(n, dtype=np.float32), 16), "staged")
p.free()
ctx.close()
''', timeout=90)


@pytest.mark.timeout(120)
def test_moe_dispatcher_on_gpu_arrays_matches_host():
    run_ranks(3, PRELUDE + r'''
from fake_cuda import FakeCupy
from offload_lib import moe
cp = FakeCupy(drv, USER)
sys.modules["cupy"] = cp  # the Dispatcher reaches the library of the arrays it is given
tokens, hidden, experts, k = 40, 16, 2 * n, 2
for dtype in ("float32", "float16"):
    rng = np.random.default_rng([7, me])
    x = rng.integers(-50, 50, (tokens, hidden)).astype(dtype)
    idx = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k].astype(np.int64)
    idx[0, 1] = -1  # a dropped slot
    w = (rng.integers(1, 5, (tokens, k)) / 4).astype(np.float32)
    ref = moe.Dispatcher(team, experts, hidden, tokens, dtype)
    r_x, r_idx, r_w, r_h = ref.dispatch(x, idx, w)
    r_x = r_x.copy()
    out_ref = ref.combine(r_x * 2, r_h)

    d = moe.Dispatcher(team, experts, hidden, tokens, dtype)
    g_x, g_idx, g_w, g_h = d.dispatch(cp.asarray(x), cp.asarray(idx), cp.asarray(w))
    assert isinstance(g_x, cp.ndarray) and isinstance(g_idx, cp.ndarray), type(g_x)
    check_equal(g_x.get(), r_x, f"{dtype} recv_x")
    check_equal(g_idx.get(), r_idx, f"{dtype} recv_topk_idx")
    check_equal(g_w.get(), r_w, f"{dtype} recv_topk_weights")
    out = d.combine(cp.asarray(g_x.get() * 2), g_h)
    check_equal(out.get(), out_ref, f"{dtype} combine")
st = ctx.stats()["gpu"]
assert st["ops"] >= 4 and st["d2h_bytes"] and st["h2d_bytes"], st
ctx.close()
''', timeout=100)


@pytest.mark.timeout(120)
def test_ranks_with_buffers_in_different_places_post_the_same_ops():
    # Rank 1 passes host memory where rank 0 passes GPU memory; with 64 KiB pieces the op is
    # cut, and both must cut it the same way (rank 1 packs its host memory into staging).
    run_ranks(2, PRELUDE + r'''
count = 100_000
vals = np.concatenate([pattern(me, j, count, "float32") for j in range(n)])
want = np.concatenate([pattern(i, me, count, "float32") for i in range(n)])
if me == 0:
    src, dst = dev(n * count, "float32"), dev(n * count, "float32")
    produce(src, vals)
else:
    src, dst = dev(n * count, "float32"), np.full(n * count, -1, np.float32)
    produce(src, vals)
team.alltoall(src, dst).wait(timeout=60)
drv.synchronize(USER)
check_equal(dst.host() if me == 0 else dst, want, "alltoall, GPU and host destinations")

g_src = vals[:count].copy() if me == 1 else dev(count, "float32")
if me == 0:
    produce(g_src, vals[:count])
g_dst = dev(n * count, "float32") if me == 1 else np.full(n * count, -1, np.float32)
team.allgather(g_src, g_dst).wait(timeout=60)
drv.synchronize(USER)
check_equal(g_dst.host() if me == 1 else g_dst,
            np.concatenate([pattern(i, 0, count, "float32") for i in range(n)]),
            "allgather, host and GPU buffers")
st = ctx.stats()["gpu"]
assert st["pieces"] >= 2 * st["ops"], st
ctx.close()
''', timeout=100, env={"OFFLOAD_GPU_PIECE": "64K"})


@pytest.mark.timeout(120)
def test_empty_buffers_cuda_errors_and_cancel():
    run_ranks(2, PRELUDE + r'''
# Empty GPU buffers take no staging memory, however many (the job has 256 segments).
for i in range(300):
    team.alltoall(dev(0, "float32"), dev(0, "float32")).wait(timeout=10)

# A CUDA error while landing the result: wait() raises it, the stream still goes on.
src, dst = dev(n * 4, "int32"), dev(n * 4, "int32")
produce(src, np.arange(n * 4, dtype=np.int32))
drv.fail_h2d = 1
req = team.alltoall(src, dst)
after = consume(dst)
try:
    req.wait(timeout=30)
    raise AssertionError("the injected CUDA error was lost")
except RuntimeError as e:
    assert "injected" in str(e), e
drv.synchronize(USER, timeout=10)
assert "v" in after

# Cancel: rank 1's producer never finishes in time, rank 0 cancels its op. The stream goes
# on, wait() raises Canceled, and the team fails later ops (the NCCL-abort rule).
src, dst = dev(n * 4, "int32"), dev(n * 4, "int32")
produce(src, np.arange(n * 4, dtype=np.int32), delay=1.0 if me == 1 else 0)
req = team.alltoall(src, dst)
if me == 0:
    time.sleep(0.05)
    assert req.cancel() is True
    try:
        req.wait(timeout=10)
        raise AssertionError("a cancelled op completed")
    except ol.Canceled:
        pass
    drv.synchronize(USER, timeout=10)
else:
    try:
        req.wait(timeout=30)
    except ol.OffloadError as e:
        print("rank 1 after the cancel:", type(e).__name__, e)
    drv.synchronize(USER, timeout=10)
ctx.close()
''', timeout=100, env={"OFFLOAD_OP_TIMEOUT": "3"})


def test_fake_driver_implements_the_real_drivers_methods():
    import inspect

    from fake_cuda import FakeDriver

    from offload_lib._cuda import Driver

    real = {n: inspect.signature(f) for n, f in inspect.getmembers(Driver, inspect.isfunction)
            if not n.startswith("_")}
    fake = dict(inspect.getmembers(FakeDriver, inspect.isfunction))
    for name, sig in real.items():
        assert name in fake, f"FakeDriver lacks {name}"
        assert list(inspect.signature(fake[name]).parameters) == list(sig.parameters), name
