"""torch.distributed all_to_all_single: the "dpa" backend against gloo, in the same processes.

    dpa-offload run -n 4 -- python scripts/bench_torch.py [--sizes 1K,64K,1M] [--iters 20]

Per size (bytes per peer): every rank checks one op of each backend against the expected
blocks, then times ``dist.all_to_all_single`` on the default "dpa" group and on a gloo group
over the same CPU tensors, each iteration after a barrier, dpa and gloo alternating by size.
Rank 0 prints the median over iterations of the slowest rank, busbw (nccl-tests:
bytes*(n-1)/n/time) and ratio = gloo time / dpa time (> 1: dpa is faster); cpu_us is the
median calling-thread CPU time of rank 0's dpa op.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import offload_lib.torch as olt
from offload_lib.bench import _timed, parse_sizes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}


def expected_blocks(rank: int, n: int, count: int, dtype: torch.dtype, sender: bool) -> torch.Tensor:
    """Rank ``rank``'s src (sender) or the dst it must receive: block (i -> j) holds
    i*n + j + k*... wrapped to stay exact in bf16."""
    k = torch.arange(count, dtype=torch.int64)
    peers = torch.arange(n, dtype=torch.int64)[:, None]
    src, dst = (rank, peers) if sender else (peers, rank)
    return ((src * 31 + dst * 7 + k[None, :]) % 128).to(dtype).reshape(-1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1K,64K,1M"),
                   help="bytes per peer, comma separated (K/M suffixes)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--json", help="rank 0 also writes the rows as JSON here")
    args = p.parse_args()

    dist.init_process_group("dpa")
    gloo = dist.new_group(backend="gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for size in args.sizes:
        count = max(1, size // itemsize)
        src = expected_blocks(rank, n, count, dtype, sender=True)
        want = expected_blocks(rank, n, count, dtype, sender=False)
        dst = {"dpa": torch.empty_like(src), "gloo": torch.empty_like(src)}
        groups = {"dpa": None, "gloo": gloo}
        entry: dict[str, Any] = {"size": count * itemsize}
        for name in ("dpa", "gloo"):
            out, group = dst[name], groups[name]
            out.fill_(-1)
            dist.all_to_all_single(out, src, group=group)
            if not torch.equal(out, want):
                raise SystemExit(f"{name} all_to_all_single gave a WRONG RESULT on rank {rank} "
                                 f"at {size} bytes per peer")
            # each backend's own barrier, as the MPI comparisons use comm.Barrier: a gloo
            # barrier leaves gloo's threads busy on the cores the next op needs
            wall, cpu = _timed(lambda: dist.all_to_all_single(out, src, group=group),
                              lambda: dist.barrier(group=group), args.warmup, args.iters)
            per_rank: list[Any] = [None] * n
            dist.all_gather_object(per_rank, wall, group=gloo)
            t = float(np.median(np.max(np.asarray(per_rank), axis=0)))
            entry[f"{name}_us"] = t * 1e6
            entry[f"{name}_busbw"] = count * itemsize * (n - 1) / t / 1e9 if t > 0 else 0.0
            entry[f"{name}_cpu_us"] = float(np.median(cpu)) * 1e6
            if not torch.equal(out, want):
                raise SystemExit(f"{name}: wrong result after the timed loop on rank {rank}")
        entry["ratio"] = entry["gloo_us"] / entry["dpa_us"]
        rows.append(entry)

    if rank == 0:
        cfg = olt.context().config.as_dict()
        print(f"# dpa-offload run -n {n} -- python scripts/bench_torch.py {' '.join(sys.argv[1:])}")
        print(f"# date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}  "
              f"host: {platform.node()} ({os.cpu_count()} CPUs)  torch {torch.__version__}")
        print(f"# dist.all_to_all_single, {args.dtype}, n={n}; dpa: backend "
              f"{olt.context().backend}, dpa_threads {cfg['dpa_threads']}; gloo: same tensors")
        print("# time: median over iterations of the slowest rank; ratio = gloo/dpa time")
        print(f"{'size':>10} {'dpa_us':>10} {'dpa_GB/s':>9} {'cpu_us':>8} "
              f"{'gloo_us':>10} {'gloo_GB/s':>9} {'ratio':>7}")
        for r in rows:
            print(f"{r['size']:>10} {r['dpa_us']:>10.1f} {r['dpa_busbw']:>9.2f} "
                  f"{r['dpa_cpu_us']:>8.1f} {r['gloo_us']:>10.1f} {r['gloo_busbw']:>9.2f} "
                  f"{r['ratio']:>7.2f}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"n": n, "dtype": args.dtype, "rows": rows}, f, indent=1)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see tests/test_torch_backend.py: gloo's threads race interpreter exit


if __name__ == "__main__":
    main()
