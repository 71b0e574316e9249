#!/usr/bin/env python3
"""A barrier + small all-to-all loop, split into where its time goes (issue 16).

    dpa-offload run -n 4 -- python scripts/small_op_skew.py --out /tmp/skew
    mpirun -n 4 --oversubscribe --bind-to none python scripts/small_op_skew.py --mpi --out /tmp/skew

Each rank stamps (CLOCK_MONOTONIC, one clock for every process) its barrier's entry and
exit and its all-to-all's end, every iteration; rank 0 then prints what `bench` reports
(the op's time at the slowest rank, median), each rank's own op time, how far apart the
ranks leave the barrier, the op's time after the last rank left it, and the loop's
iteration. With ``--mpi`` the same loop runs on Open MPI (mpi4py), for the comparison.
"""
from __future__ import annotations

import argparse
import glob
import os
import time

import numpy as np


def _loop(barrier, alltoall, iters: int, warmup: int) -> np.ndarray:
    t = np.empty((iters, 3))
    for i in range(-warmup, iters):
        t0 = time.perf_counter()
        barrier()
        t1 = time.perf_counter()
        alltoall()
        t2 = time.perf_counter()
        if i >= 0:
            t[i] = (t0, t1, t2)
    return t


def _report(out: str) -> None:
    stamps = np.stack([np.load(f) for f in sorted(glob.glob(os.path.join(out, "r*.npy")))])
    enter, leave, done = stamps[:, :, 0], stamps[:, :, 1], stamps[:, :, 2]
    us = 1e6
    slowest = (done - leave).max(axis=0) * us
    rows = {
        "op, slowest rank (bench's time)": slowest,
        "barrier exit spread": (leave.max(axis=0) - leave.min(axis=0)) * us,
        "op after the last rank left the barrier": (done.max(axis=0) - leave.max(axis=0)) * us,
        "iteration": np.diff(enter[0]) * us,
    }
    for name, v in rows.items():
        print(f"{name:42s} median {np.median(v):7.1f} us  p90 {np.percentile(v, 90):7.1f} us")
    own = [float(np.median((done[r] - leave[r]) * us)) for r in range(stamps.shape[0])]
    print(f"{'op, each rank (median)':42s} " + " ".join(f"{x:.1f}" for x in own))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="bytes per peer")
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--mpi", action="store_true", help="run the loop on Open MPI instead")
    ap.add_argument("--out", required=True, help="a directory for the ranks' stamps")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        n, rank = comm.size, comm.rank
        src = np.arange(args.size // 4 * n, dtype=np.float32)
        dst = np.empty_like(src)
        t = _loop(comm.Barrier, lambda: comm.Alltoall(src, dst), args.iters, args.warmup)
        np.save(os.path.join(args.out, f"r{rank}.npy"), t)
        comm.Barrier()
    else:
        import offload_lib as ol

        with ol.init() as ctx:
            team, n, rank = ctx.world, ctx.size, ctx.rank
            src = np.arange(args.size // 4 * n, dtype=np.float32)
            dst = np.empty_like(src)
            t = _loop(lambda: team.barrier().wait(), lambda: team.alltoall(src, dst).wait(),
                      args.iters, args.warmup)
            np.save(os.path.join(args.out, f"r{rank}.npy"), t)
            team.barrier().wait()
    if rank == 0:
        _report(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
