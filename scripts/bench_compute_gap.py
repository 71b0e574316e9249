#!/usr/bin/env python3
"""All-to-all between bouts of compute, ours and Open MPI's taking turns (issue 16).

    mpirun --oversubscribe -n 4 python scripts/bench_compute_gap.py --buffers numpy \
        --size 1M --gap-ms 1 --work mem

``dpa-offload bench`` times ops back to back; a training step computes between them. Here
every rank works for ``--gap-ms`` before each op's barrier: ``mem`` copies a 16 MiB array
(the caches lose the op's buffers), ``cpu`` sums a small one (they keep them), ``sleep``
sleeps. Then the op is timed from the barrier's return to its completion, as in ``bench``.
One op of ours and one of Open MPI's in turn per iteration, so that both see the same
machine. Prints the median over iterations of the slowest rank's time, and Open MPI's time
over ours (its busbw ratio: above 1, ours is faster).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import offload_lib as ol
from offload_lib.bench import summarize
from offload_lib.bench.runner import _taking_turns
from offload_lib.config import parse_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buffers", choices=("numpy", "shared"), default="numpy")
    ap.add_argument("--size", default="1M", help="bytes per peer (K/M suffixes)")
    ap.add_argument("--gap-ms", type=float, default=1.0)
    ap.add_argument("--work", choices=("mem", "cpu", "sleep"), default="mem")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.size
    count = parse_size(args.size) // 4
    with ol.init() as ctx:
        team = ctx.world
        if args.buffers == "shared":
            src, dst = ctx.empty(count * n, np.float32), ctx.empty(count * n, np.float32)
        else:
            src, dst = np.empty(count * n, np.float32), np.empty(count * n, np.float32)
        src[:] = comm.rank
        mpi_src, mpi_dst = np.full(count * n, comm.rank, np.float32), np.empty(count * n, np.float32)
        big, big_out = np.ones(4 << 20, np.float32), np.empty(4 << 20, np.float32)
        small = np.ones(1024, np.float32)

        def work() -> None:
            if args.work == "sleep":
                time.sleep(args.gap_ms / 1e3)
                return
            end = time.perf_counter() + args.gap_ms / 1e3
            while time.perf_counter() < end:
                if args.work == "mem":
                    np.copyto(big_out, big)
                else:
                    small.sum()

        def ours_barrier() -> None:
            work()
            team.barrier().wait()

        def mpi_barrier() -> None:
            work()
            comm.Barrier()

        (ours, _), (theirs, _) = _taking_turns(
            [(lambda: team.alltoall(src, dst).wait(), ours_barrier),
             (lambda: comm.Alltoall(mpi_src, mpi_dst), mpi_barrier)], args.warmup, args.iters)
        expect = np.repeat(np.arange(n, dtype=np.float32), count)
        assert np.array_equal(dst, expect) and np.array_equal(mpi_dst, expect)
        per_rank = comm.gather((ours, theirs))
        if comm.rank == 0:
            o, m = (summarize([r[k] for r in per_rank]) * 1e6 for k in (0, 1))
            print(f"n={n} {args.buffers} {args.size} per peer, {args.gap_ms} ms of {args.work} "
                  f"before each op: ours {o:.0f} us, Open MPI {m:.0f} us, busbw ratio {m / o:.2f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
