"""GPU buffers on a real GPU: torch CUDA tensors and cupy arrays against host results.

Skipped where no CUDA device is visible (CI); scripts/gpu_check.sh runs them on a GPU
machine. Every rank uses device 0. A producer kernel delayed with torch.cuda._sleep (or a
cupy kernel queued behind a long copy) checks that the collective waits for the stream, and
a clone queued right after the call checks that the next kernel sees the result.
"""
from __future__ import annotations

import importlib.util

import pytest

from _mp import run_ranks


def _torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _cupy_cuda() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


needs_torch = pytest.mark.skipif(not _torch_cuda(), reason="no CUDA device visible to torch")
needs_cupy = pytest.mark.skipif(not _cupy_cuda(), reason="no CUDA device visible to cupy")

TORCH = r'''
import torch
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
ctx = ol.init()
team = ctx.world
n, me = team.size, team.rank

def pattern(src, dst, count, dtype):
    k = torch.arange(count, dtype=torch.int64)
    return ((src * 37 + dst * 11 + k) % 120).to(dtype)

def late(host):
    """host's values on the GPU, written by a copy queued behind a ~20 ms kernel."""
    out = torch.empty_like(host, device=dev)
    torch.cuda._sleep(20_000_000)
    out.copy_(host.pin_memory(), non_blocking=True)
    return out
'''


@needs_torch
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.timeout(180)
def test_torch_cuda_collectives_match_host(n):
    run_ranks(n, TORCH + r'''
for dtype in (torch.float32, torch.bfloat16, torch.int64):
    for count in (1, 4099, 600_000):
        src_h = torch.cat([pattern(me, j, count, dtype) for j in range(n)])
        want = torch.cat([pattern(i, me, count, dtype) for i in range(n)])
        dst = torch.full_like(src_h, -1, device=dev)
        req = team.alltoall(late(src_h), dst)
        seen = dst.clone()  # the next kernel on the stream
        req.wait(timeout=60)
        assert torch.equal(seen.cpu(), want), f"alltoall {dtype} {count}: next kernel"
        assert torch.equal(dst.cpu(), want), f"alltoall {dtype} {count}"

        got = torch.empty(n * count, dtype=dtype, device=dev)
        team.allgather(late(pattern(me, 0, count, dtype)), got)
        assert torch.equal(got.clone().cpu(), torch.cat([pattern(i, 0, count, dtype)
                                                         for i in range(n)])), "allgather"
        for root in range(n):
            buf = late(pattern(root, 3, count, dtype)) if me == root else \
                torch.zeros(count, dtype=dtype, device=dev)
            team.broadcast(buf, root).wait(timeout=60)
            assert torch.equal(buf.cpu(), pattern(root, 3, count, dtype)), f"bcast {root}"

counts = torch.tensor([[(i * 7 + j * 3) % 50 for j in range(n)] for i in range(n)])
src = late(torch.cat([pattern(me, j, int(c), torch.float32) for j, c in enumerate(counts[me])]))
dst = torch.full((int(counts[:, me].sum()) + 4,), -1.0, device=dev)
got = team.alltoallv(src, counts[me].numpy(), dst).wait(timeout=60)
assert (got == counts[:, me].numpy()).all(), got
want = torch.cat([pattern(i, me, int(c), torch.float32) for i, c in enumerate(counts[:, me])])
assert torch.equal(dst[:want.numel()].cpu(), want) and (dst[want.numel():] == -1).all()
assert ctx.stats()["gpu"]["path"] in ("staged", "gpudirect")
print("gpu stats", ctx.stats()["gpu"])
ctx.close()
''', timeout=170)


@needs_torch
@pytest.mark.timeout(180)
def test_torch_dispatcher_and_process_group_on_cuda():
    run_ranks(2, TORCH + r'''
import torch.distributed as dist
import offload_lib.torch as olt
from offload_lib import moe
tokens, hidden, experts, k = 64, 32, 4, 2
g = torch.Generator().manual_seed(me)
x = torch.randint(-50, 50, (tokens, hidden), generator=g).to(torch.bfloat16)
idx = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :k]
w = torch.randint(1, 5, (tokens, k), generator=g).float() / 4
ref = moe.Dispatcher(team, experts, hidden, tokens, torch.bfloat16)
rx, ridx, rw, rh = ref.dispatch(x, idx, w)
rx = rx.clone()
out_ref = ref.combine(rx * 2, rh)
d = moe.Dispatcher(team, experts, hidden, tokens, torch.bfloat16)
gx, gidx, gw, gh = d.dispatch(x.to(dev), idx.to(dev), w.to(dev))
assert gx.is_cuda and gidx.is_cuda and gw.is_cuda
assert torch.equal(gx.cpu(), rx) and torch.equal(gidx.cpu(), ridx) and torch.equal(gw.cpu(), rw)
out = d.combine(gx * 2, gh)
assert out.is_cuda and torch.equal(out.cpu(), out_ref), "combine"
ctx.close()

dist.init_process_group("dpa")
a = torch.arange(8, dtype=torch.float32, device=dev) + 100 * me
b = torch.empty_like(a)
dist.all_to_all_single(b, a)
want = torch.cat([torch.arange(4 * me, 4 * me + 4, dtype=torch.float32) + 100 * i
                  for i in range(2)])
assert torch.equal(b.cpu(), want), b
dist.destroy_process_group()
''', timeout=170)


@needs_cupy
@pytest.mark.timeout(120)
def test_cupy_arrays_match_host():
    run_ranks(2, r'''
import cupy as cp
ctx = ol.init()
team = ctx.world
n, me = team.size, team.rank
count = 300_000
host = np.concatenate([np.full(count, 10 * me + j, np.float32) for j in range(n)])
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    src = cp.asarray(host)
    dst = cp.full(n * count, -1, cp.float32)
    req = team.alltoall(src, dst)
    seen = dst.copy()
req.wait(timeout=60)
want = np.concatenate([np.full(count, 10 * i + me, np.float32) for i in range(n)])
check_equal(cp.asnumpy(seen, stream=stream), want, "cupy alltoall: next kernel")
ctx.close()
''', timeout=100)
