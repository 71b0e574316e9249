"""GPU staging: what it costs against host buffers, and the copy rates it reaches.

    dpa-offload run -n 2 -- python scripts/bench_gpu.py [--sizes 1M,16M] [--iters 10]

Per size (bytes per peer), an all-to-all with torch CUDA tensors (staged, or GPUDirect on a
card) against the same all-to-all with host tensors, each iteration after a barrier and
ended by ``wait()`` (the GPU result is then in place). Also the D2H and H2D rates of the
driver calls the staging uses (pinned job-shared memory, one 2-D copy, one direction at a
time). Rank 0 prints its own medians over iterations.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time
from typing import Any

import numpy as np
import torch

import offload_lib as ol
from offload_lib import _cuda
from offload_lib.bench import _timed, parse_sizes


def copy_rates(ctx: Any, nbytes: int, iters: int) -> dict[str, float]:
    """GB/s of the staging's D2H and H2D copies on a pinned ctx.empty buffer."""
    drv = _cuda.driver()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = ctx.empty(nbytes, np.uint8)
    drv.host_register(host.ctypes.data, nbytes)
    stream = torch.cuda.current_stream().cuda_stream or 1
    cuda_ctx = drv.device_of(dev.data_ptr())[0]
    rates = {}
    with drv.scope(cuda_ctx):
        for name, to_device in (("d2h", False), ("h2d", True)):
            c = _cuda.Copy2D.flat(*((dev.data_ptr(), host.ctypes.data) if to_device else
                                    (host.ctypes.data, dev.data_ptr())), nbytes)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                drv.copy_async(c, to_device, stream)
                drv.event_synchronize(drv.event_record(stream))
                times.append(time.perf_counter() - t0)
            rates[name] = nbytes / float(np.median(times)) / 1e9
    drv.host_unregister(host.ctypes.data)
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("64K,1M,16M"))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", help="rank 0 writes the rows here too")
    args = p.parse_args()
    torch.cuda.set_device(0)
    with ol.init() as ctx:
        team, n = ctx.world, ctx.size
        barrier = lambda: team.barrier().wait()  # noqa: E731
        rows = []
        for size in args.sizes:
            count = size // 4
            src_h = torch.arange(n * count, dtype=torch.float32) + 1000 * ctx.rank
            dst_h = torch.empty_like(src_h)
            src_d, dst_d = src_h.cuda(), torch.empty_like(src_h, device="cuda")
            host_t, _ = _timed(lambda: team.alltoall(src_h, dst_h).wait(), barrier, args.warmup,
                           args.iters)
            gpu_t, _ = _timed(lambda: team.alltoall(src_d, dst_d).wait(), barrier, args.warmup,
                          args.iters)
            if not torch.equal(dst_d.cpu(), dst_h):
                raise SystemExit(f"rank {ctx.rank}: GPU result differs from host at {size} B")
            rows.append({"size": size, "host_us": float(np.median(host_t)) * 1e6,
                         "gpu_us": float(np.median(gpu_t)) * 1e6})
        rates = copy_rates(ctx, max(args.sizes) * n, args.iters)
        stats = ctx.stats()["gpu"]
        if ctx.rank == 0:
            print(f"# scripts/bench_gpu.py, n={n}, {torch.cuda.get_device_name(0)}, "
                  f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
            print(f"# path: {stats['path']}; all-to-all, float32, bytes per peer; "
                  "overhead = gpu / host time")
            print(f"{'size':>10} {'host_us':>10} {'gpu_us':>10} {'overhead':>9}")
            for r in rows:
                print(f"{r['size']:>10} {r['host_us']:>10.1f} {r['gpu_us']:>10.1f} "
                      f"{r['gpu_us'] / r['host_us']:>9.2f}")
            print(f"# staging copies, {max(args.sizes) * n} B: D2H {rates['d2h']:.1f} GB/s, "
                  f"H2D {rates['h2d']:.1f} GB/s")
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"rows": rows, "rates": rates, "stats": stats}, f, indent=1)


if __name__ == "__main__":
    main()
