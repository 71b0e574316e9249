#!/usr/bin/env python3
"""A barrier and a small all-to-all, warm and with the caches cold, on ours or Open MPI (issue 16).

    dpa-offload run -n 1 -- python scripts/small_op_cold.py
    mpirun -n 1 python scripts/small_op_cold.py --mpi

Where ranks outnumber the cores, another rank runs between two calls of one rank, and
every call finds its code and data out of the caches. This runs each call ``--calls``
times back to back (warm), then with 8 MiB of other memory touched before each call
(cold), and prints the medians.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np


def _medians(barrier: Callable[[], None], alltoall: Callable[[], None], calls: int
             ) -> dict[str, tuple[float, float]]:
    junk = np.zeros(8 << 20, np.uint8)  # past this VM's L2 (512 KiB per core)
    out = {}
    for mode in ("warm", "cold"):
        tb, ta = np.empty(calls), np.empty(calls)
        for i in range(calls):
            if mode == "cold":
                junk[::64] += 1
            t0 = time.perf_counter()
            barrier()
            t1 = time.perf_counter()
            if mode == "cold":
                junk[::64] += 1
            t2 = time.perf_counter()
            alltoall()
            t3 = time.perf_counter()
            tb[i], ta[i] = t1 - t0, t3 - t2
        out[mode] = (float(np.median(tb)) * 1e6, float(np.median(ta)) * 1e6)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="bytes per peer")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--mpi", action="store_true", help="Open MPI (mpi4py) instead")
    args = ap.parse_args()
    if args.mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        src = np.arange(args.size // 4 * comm.size, dtype=np.float32)
        dst = np.empty_like(src)
        r = _medians(comm.Barrier, lambda: comm.Alltoall(src, dst), args.calls)
        rank = comm.rank
    else:
        import offload_lib as ol

        with ol.init() as ctx:
            team = ctx.world
            src = np.arange(args.size // 4 * ctx.size, dtype=np.float32)
            dst = np.empty_like(src)
            r = _medians(lambda: team.barrier().wait(),
                         lambda: team.alltoall(src, dst).wait(), args.calls)
            rank = ctx.rank
    for mode, (b, a) in r.items():
        print(f"rank {rank} {mode}: barrier {b:.2f} us, all-to-all {a:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
