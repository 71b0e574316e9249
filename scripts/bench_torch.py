"""torch.distributed collectives: the "dpa" backend against gloo, in the same processes.

    dpa-offload run -n 4 -- python scripts/bench_torch.py [--op all_to_all_single] \
        [--sizes 1K,64K,1M] [--iters 20]

``--op``: all_to_all_single (size: bytes per peer), all_reduce (size: the tensor) or
reduce_scatter_tensor (size: the whole input), SUM for the reductions. Per size every rank
checks one op of each backend against the expected result, then times the op on the default
"dpa" group and on a gloo group over the same CPU tensors, each iteration after a barrier,
dpa and gloo alternating by size. Rank 0 prints the median over iterations of the slowest
rank, busbw as nccl-tests defines it (all-to-all and reduce-scatter: bytes*(n-1)/n/time;
allreduce: bytes*2(n-1)/n/time; bytes = size*n for all-to-all) and ratio = gloo time / dpa
time (> 1: dpa is faster); cpu_us is the median calling-thread CPU time of rank 0's dpa op.
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


OPS = ("all_to_all_single", "all_reduce", "reduce_scatter_tensor")


def case(op: str, rank: int, n: int, size: int, dtype: torch.dtype,
         itemsize: int) -> tuple[int, torch.Tensor, torch.Tensor, float]:
    """(elements, this rank's input, the result it must get, bytes busbw divides by time).
    Reduction inputs are small integers, so every order of summation is exact in any dtype."""
    if op == "all_to_all_single":
        count = max(1, size // itemsize)
        src = expected_blocks(rank, n, count, dtype, sender=True)
        want = expected_blocks(rank, n, count, dtype, sender=False)
        return count, src, want, count * itemsize * (n - 1)
    count = max(n, size // itemsize // n * n)
    def part(r: int) -> torch.Tensor:
        return ((torch.arange(count, dtype=torch.int64) * 3 + r * 5) % 8).to(dtype)
    total = sum(part(r).to(torch.float64) for r in range(n)).to(dtype)
    if op == "all_reduce":
        return count, part(rank), total, count * itemsize * 2 * (n - 1) / n
    block = count // n
    return count, part(rank), total[rank * block:(rank + 1) * block].clone(), \
        count * itemsize * (n - 1) / n


def make_op(op: str, src: torch.Tensor, want: torch.Tensor,
            group: Any) -> tuple[Any, Any, torch.Tensor]:
    """A callable running one op on ``group``, one that restores its input, and the tensor
    its result lands in. all_reduce is in place (as DDP calls it): the timed loop lets the
    values grow (x n per op, exact and finite for the default iterations) rather than time a
    copy; the check before and after restores the input first."""
    if op == "all_to_all_single":
        out = torch.full_like(want, -1)
        return (lambda: dist.all_to_all_single(out, src, group=group)), (lambda: None), out
    if op == "all_reduce":
        buf = src.clone()
        return (lambda: dist.all_reduce(buf, group=group)), (lambda: buf.copy_(src)), buf
    out = torch.full_like(want, -1)
    return ((lambda: dist.reduce_scatter_tensor(out, src, group=group)), (lambda: None),
            out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=OPS, default="all_to_all_single")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1K,64K,1M"),
                   help="bytes (per peer for all_to_all_single), comma separated (K/M)")
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
        count, src, want, busbytes = case(args.op, rank, n, size, dtype, itemsize)
        groups = {"dpa": None, "gloo": gloo}
        entry: dict[str, Any] = {"size": count * itemsize}
        for name in ("dpa", "gloo"):
            group = groups[name]
            run, reset, out = make_op(args.op, src, want, group)
            reset()
            run()
            if not torch.equal(out, want):
                raise SystemExit(f"{name} {args.op} gave a WRONG RESULT on rank {rank} "
                                 f"at {size} bytes")
            # each backend's own barrier, as the MPI comparisons use comm.Barrier: a gloo
            # barrier leaves gloo's threads busy on the cores the next op needs
            wall, cpu = _timed(run, lambda: dist.barrier(group=group), args.warmup,
                               args.iters)
            per_rank: list[Any] = [None] * n
            dist.all_gather_object(per_rank, wall, group=gloo)
            t = float(np.median(np.max(np.asarray(per_rank), axis=0)))
            entry[f"{name}_us"] = t * 1e6
            entry[f"{name}_busbw"] = busbytes / t / 1e9 if t > 0 else 0.0
            entry[f"{name}_cpu_us"] = float(np.median(cpu)) * 1e6
            reset()
            run()
            if not torch.equal(out, want):
                raise SystemExit(f"{name}: wrong result after the timed loop on rank {rank}")
        entry["ratio"] = entry["gloo_us"] / entry["dpa_us"]
        rows.append(entry)

    if rank == 0:
        cfg = olt.context().config.as_dict()
        print(f"# dpa-offload run -n {n} -- python scripts/bench_torch.py {' '.join(sys.argv[1:])}")
        print(f"# date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}  "
              f"host: {platform.node()} ({os.cpu_count()} CPUs)  torch {torch.__version__}")
        print(f"# dist.{args.op}, {args.dtype}, n={n}; dpa: backend "
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
