#!/usr/bin/env python3
"""What one small op's calls cost where nothing waits: one rank, ``timeit`` (issue 16).

    dpa-offload run -n 1 -- python scripts/small_op_calls.py

The best of three batches of ``--number`` calls each, per call: a kept 1 KiB all-to-all
posted and waited, a barrier, the kept command's check alone, and ``ffi.from_buffer``
(what a check in Python paid per array). At one rank the library's own C is ~1.2 us of an
all-to-all; the rest is the Python layer around it.
"""
from __future__ import annotations

import argparse
import timeit

import numpy as np

import offload_lib as ol
from offload_lib._native import ffi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=200000)
    args = ap.parse_args()
    with ol.init() as ctx:
        team = ctx.world
        src = np.arange(256 * ctx.size, dtype=np.float32)
        dst = np.empty_like(src)
        team.alltoall(src, dst).wait()  # the full way once: the next calls take the kept one
        env = {"team": team, "src": src, "dst": dst, "ffi": ffi, "cache": team._alltoalls}
        for name, stmt in (("alltoall + wait (kept)", "team.alltoall(src, dst).wait()"),
                           ("barrier + wait", "team.barrier().wait()"),
                           ("kept command's check", "cache.get(src, dst)"),
                           ("ffi.from_buffer", "ffi.from_buffer(src)")):
            best = min(timeit.repeat(stmt, globals=env, number=args.number, repeat=3))
            print(f"{name:24s} {best / args.number * 1e6:.3f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
