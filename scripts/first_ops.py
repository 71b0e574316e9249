#!/usr/bin/env python3
"""The all-to-alls right after the warm-up, each timed on its own (as the demo times one).

    dpa-offload run -n 4 -- python scripts/first_ops.py --size 1M --buffers shared --ops 8

Each rank fills its source, runs one warm-up all-to-all (the demo's), then ``--ops`` more,
each after a barrier, and times each: wall (``time.perf_counter``), the calling thread's CPU
(``time.thread_time``), the process's minor page faults (``getrusage``; progress threads
included) and the progress threads' CPU (``/proc/self/task/*/schedstat``). Prints one JSON
line per rank: lists indexed by op, op 0 being the first after the warm-up.

    python scripts/first_ops.py --jobs 10 -n 4 --size 1M --buffers shared --ops 8

starts ``--jobs`` such jobs one after another (``dpa-offload run``) and prints, per op index,
the median over the jobs of the slowest rank's wall time, of rank 0's wall and CPU, of the
job's CPU and page faults (sums over ranks) and of the longest barrier before the op; then
the first op over the later ones, per job. ``--check-at-once`` checks the result right
after the last op, as the demo did before it waited for a barrier; ``--warmups``,
``--idle-ms`` and ``--gc-freeze`` vary what comes before the timed ops. Each op's
CLOCK_MONOTONIC span is printed too (``t0_ns``/``t1_ns``) to slice a ``perf record -k
CLOCK_MONOTONIC`` profile by op.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

import offload_lib as ol
from offload_lib.config import parse_size
from small_op_cpu import _progress_cpu_ns  # this folder is on sys.path: a script's


def _summarize(args: argparse.Namespace, rest: list[str]) -> int:
    """Run the jobs and print the medians over them, per op index."""
    cmd = [sys.executable, "-m", "offload_lib.cli", "run", "-n", str(args.n), "--",
           sys.executable, os.path.abspath(__file__), *rest]
    jobs: list[list[dict]] = []
    for _ in range(args.jobs):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        jobs.append([json.loads(line.split("] ", 1)[1]) for line in out.splitlines()
                     if "] {" in line])
    print(f"n={args.n} {' '.join(rest)}: medians over {args.jobs} jobs")
    print("op  slowest_wall_us  rank0_wall_us  rank0_cpu_us  job_cpu_us  job_minflt  "
          "longest_barrier_us")
    med = statistics.median
    for k in range(args.ops):
        slowest = med([max(r["wall_us"][k] for r in job) for job in jobs])
        r0 = [next(r for r in job if r["rank"] == 0) for job in jobs]
        job_cpu = med([sum(r["cpu_us"][k] + r["progress_us"][k] for r in job) for job in jobs])
        print(f"{k:2d}  {slowest:15.1f}  {med([r['wall_us'][k] for r in r0]):13.1f}  "
              f"{med([r['cpu_us'][k] for r in r0]):12.1f}  "
              f"{job_cpu:10.1f}  "
              f"{med([sum(r['minflt'][k] for r in job) for job in jobs]):10.1f}  "
              f"{med([max(r['barrier_us'][k] for r in job) for job in jobs]):18.1f}")
    if args.ops >= 4:  # per job, the first op against the job's later ones (load cancels)
        ratios = [max(r["wall_us"][0] for r in job) /
                  statistics.median(max(r["wall_us"][k] for r in job)
                                    for k in range(2, args.ops)) for job in jobs]
        print(f"first op / median of ops 2..{args.ops - 1}, slowest rank, per job: median "
              f"{statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=0, help="start this many jobs and summarize")
    ap.add_argument("-n", type=int, default=4, help="ranks per job (with --jobs)")
    ap.add_argument("--size", default="1M", help="bytes per peer")
    ap.add_argument("--buffers", choices=("shared", "numpy"), default="shared")
    ap.add_argument("--ops", type=int, default=8, help="timed ops after the warm-up")
    ap.add_argument("--warmups", type=int, default=1, help="all-to-alls before the timed ones")
    ap.add_argument("--idle-ms", type=float, default=0.0,
                    help="sleep this long before each timed op's barrier (other work)")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="collect and freeze Python's heap before the warm-up")
    ap.add_argument("--counters-after-barrier", action="store_true",
                    help="read the counters between the barrier and the op (a peer's first "
                         "/proc reads then delay its post, and so everyone's op)")
    ap.add_argument("--check-at-once", action="store_true",
                    help="check the result as soon as the last op ends, as the demo did")
    args = ap.parse_args()
    if args.jobs:
        argv, drop = sys.argv[1:], {"--jobs", "-n"}  # the rest goes to every rank
        rest = [a for i, a in enumerate(argv) if a not in drop and
                (i == 0 or argv[i - 1] not in drop)]
        return _summarize(args, rest)
    with ol.init() as ctx:
        n, me, team = ctx.size, ctx.rank, ctx.world
        per_peer = parse_size(args.size) // 4
        if args.buffers == "shared":
            src = ctx.empty(n * per_peer, np.float32)
            dst = ctx.empty(n * per_peer, np.float32)
        else:
            src = np.empty(n * per_peer, np.float32)
            dst = np.empty(n * per_peer, np.float32)
        src[:] = np.repeat(me * 1000 + np.arange(n, dtype=np.float32), per_peer)
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        for _ in range(args.warmups):
            team.alltoall(src, dst).wait()
        rows: dict[str, list[float]] = {"wall_us": [], "cpu_us": [], "minflt": [],
                                        "progress_us": [], "barrier_us": [],
                                        "t0_ns": [], "t1_ns": []}
        for _ in range(args.ops):
            if args.idle_ms:
                time.sleep(args.idle_ms / 1e3)
            if not args.counters_after_barrier:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                p0 = _progress_cpu_ns()
            b0 = time.perf_counter()
            team.barrier().wait()
            rows["barrier_us"].append(round((time.perf_counter() - b0) * 1e6, 1))
            if args.counters_after_barrier:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                p0 = _progress_cpu_ns()
            rows["t0_ns"].append(time.monotonic_ns())  # CLOCK_MONOTONIC: perf record -k
            t0, c0 = time.perf_counter(), time.thread_time()
            team.alltoall(src, dst).wait()
            t1, c1 = time.perf_counter(), time.thread_time()
            rows["t1_ns"].append(time.monotonic_ns())
            p1 = _progress_cpu_ns()
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            rows["wall_us"].append(round((t1 - t0) * 1e6, 1))
            rows["cpu_us"].append(round((c1 - c0) * 1e6, 1))
            rows["minflt"].append(f1 - f0)
            rows["progress_us"].append(round((p1 - p0) / 1e3, 1))
        if not args.check_at_once:  # no rank checks while another's last op still runs
            team.barrier().wait()
        want = np.repeat(np.arange(n, dtype=np.float32) * 1000 + me, per_peer)
        assert np.array_equal(dst, want), "wrong result"
        team.barrier().wait()
        print(json.dumps({"rank": me, "n": n, "size": args.size, "buffers": args.buffers,
                          **rows}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
