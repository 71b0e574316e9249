#!/usr/bin/env python3
"""Where a small all-to-all's CPU goes, per rank (issue 16).

    dpa-offload run -n 4 -- python scripts/small_op_cpu.py --size 1K --iters 3000

Each rank runs ``--iters`` of ``team.alltoall(src, dst).wait()`` on the same numpy arrays,
each after a barrier as ``dpa-offload bench`` times them (``--no-barrier``: back to back).
Per rank, per op: wall (slowest rank's median is what bench reports), the calling thread's
CPU (``time.thread_time``, median) and, over the whole loop (barriers included), its user
and system time, voluntary and involuntary switches (``getrusage(RUSAGE_THREAD)``) and the
progress threads' CPU (``/proc/self/task/*/schedstat``), the loop's wall time per
iteration (``loop_wall_us``) and, from ``ctx.stats()``, the host's waits, sleeps and
hand-off yields, wake-ups handed over, firmware passes and idle ones per iteration.
(Posting a kept command and waiting are one C call each, offload_lib._fast: ``perf
record`` splits the rest.)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

import offload_lib as ol
from offload_lib.config import parse_size


def _progress_cpu_ns() -> int:
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("dpa-r"):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1K", help="bytes per peer")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--no-barrier", action="store_true")
    args = ap.parse_args()
    with ol.init() as ctx:
        n, me, team = ctx.size, ctx.rank, ctx.world
        count = parse_size(args.size) // 4
        src = np.arange(count * n, dtype=np.float32) + me * 1e6
        dst = np.empty_like(src)
        barrier = (lambda: None) if args.no_barrier else (lambda: team.barrier().wait())
        wall, cpu = np.empty(args.iters), np.empty(args.iters)
        for _ in range(args.warmup):
            barrier()
            team.alltoall(src, dst).wait()
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        pc0 = _progress_cpu_ns()
        st0, l0 = ctx.stats(), time.perf_counter()
        for i in range(args.iters):
            barrier()
            c0, t0 = time.thread_time(), time.perf_counter()
            team.alltoall(src, dst).wait()
            t1, c1 = time.perf_counter(), time.thread_time()
            wall[i], cpu[i] = t1 - t0, c1 - c0
        l1, st1 = time.perf_counter(), ctx.stats()
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        pc1 = _progress_cpu_ns()
        want = np.concatenate([np.arange(count * me, count * (me + 1), dtype=np.float32)
                               + q * 1e6 for q in range(n)])
        assert np.array_equal(dst, want), "wrong result"
        k = args.iters
        row = {
            "rank": me, "wall_us": float(np.median(wall)) * 1e6, "cpu_us": float(np.median(cpu)) * 1e6,
            "loop_user_us": (ru1.ru_utime - ru0.ru_utime) / k * 1e6,
            "loop_sys_us": (ru1.ru_stime - ru0.ru_stime) / k * 1e6,
            "nvcsw": (ru1.ru_nvcsw - ru0.ru_nvcsw) / k, "nivcsw": (ru1.ru_nivcsw - ru0.ru_nivcsw) / k,
            "progress_threads_us": (pc1 - pc0) / k / 1e3,
            "loop_wall_us": (l1 - l0) / k * 1e6,
        }
        for key in ("host_waits", "host_sleeps", "handoff_yields", "wake_handovers",
                    "host_passes", "idle_calls"):
            row[key] = (st1[key] - st0[key]) / k
        walls = team.allgather_obj(wall) if hasattr(team, "allgather_obj") else None
        print(json.dumps(row), flush=True)
        del walls
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
