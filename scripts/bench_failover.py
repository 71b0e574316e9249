#!/usr/bin/env python3
"""Rail failover in the middle of an all-to-all, against the fault-free op in the same run.

    python scripts/bench_failover.py -n 4 --size 1M --iters 30

Every rank has two rails. Rank 1's rail 0 is set to fail part-way through all-to-all number
``iters`` (after iters ops of clean traffic, plus 1.5 blocks), so iterations 0..iters-1 are
fault-free and the last one fails over mid-op. Each rank times every op after a barrier; the
table shows the median fault-free time of the slowest rank against the failover op's time,
and checks the failover op's result byte by byte.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, sys, time
import numpy as np
import offload_lib as ol

per_peer, iters, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ol.init()
w = ctx.world
rank, n = ctx.rank, ctx.size
src = ctx.empty(per_peer * n, np.uint8) if os.environ.get("BENCH_SHARED") else np.empty(per_peer * n, np.uint8)
dst = ctx.empty(per_peer * n, np.uint8) if os.environ.get("BENCH_SHARED") else np.empty(per_peer * n, np.uint8)
times = []
for it in range(iters + 1):
    src[:] = (np.arange(per_peer * n) + 7 * rank + it) % 251
    dst[:] = 0
    w.barrier().wait(timeout=60)
    t0 = time.perf_counter()
    w.alltoall(src, dst).wait(timeout=60)
    times.append(time.perf_counter() - t0)
    for p in range(n):
        want = (np.arange(per_peer * rank, per_peer * (rank + 1)) + 7 * p + it) % 251
        if not np.array_equal(dst[p * per_peer:(p + 1) * per_peer], want.astype(np.uint8)):
            print(f"WRONG RESULT: iteration {it}, block from rank {p}", flush=True)
            sys.exit(3)
st = ctx.stats()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"times": times, "failovers": st["failovers"], "resent": st["resent_bytes"]}, f)
ctx.close()
'''


def parse_size(text: str) -> int:
    from offload_lib.config import parse_size as parse

    return parse(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=4)
    ap.add_argument("--size", default="1M", help="bytes per peer (default 1M)")
    ap.add_argument("--iters", type=int, default=30, help="fault-free ops before the failover")
    ap.add_argument("--buffers", choices=("numpy", "shared"), default="numpy")
    args = ap.parse_args()
    per_peer = parse_size(args.size)
    # Rank 1 sends n blocks per op (its own included); its rail 0 dies 1.5 blocks into the
    # last op.
    fail_after = args.iters * args.nranks * per_peer + per_peer * 3 // 2
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as out:
        script = os.path.join(out, "worker.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(WORKER)
        env = dict(os.environ, OFFLOAD_RAILS="2", OFFLOAD_RAIL_FAULTS=f"1:0@{fail_after}")
        if args.buffers == "shared":
            env["BENCH_SHARED"] = "1"
        rc = subprocess.call([sys.executable, "-m", "offload_lib.cli", "run", "-n",
                              str(args.nranks), "--", sys.executable, script,
                              str(per_peer), str(args.iters), out], env=env)
        if rc:
            print(f"bench_failover: the job failed (exit code {rc})", file=sys.stderr)
            return 1
        ranks = []
        for r in range(args.nranks):
            with open(os.path.join(out, f"rank{r}.json"), encoding="utf-8") as f:
                ranks.append(json.load(f))
    slowest = [max(rk["times"][i] for rk in ranks) for i in range(args.iters + 1)]
    clean = statistics.median(slowest[1:args.iters])  # the first op warms up
    failover = slowest[args.iters]
    print(f"# all-to-all, {args.nranks} ranks, {per_peer} B per peer, {args.buffers} buffers, "
          f"2 rails; rank 1's rail 0 fails mid-op in the last iteration")
    print(f"# {' '.join(sys.argv)}")
    print(f"{'fault-free median (us)':>24} {'failover op (us)':>18} {'ratio':>7} "
          f"{'failovers':>10} {'resent (B)':>12} {'result':>7}")
    print(f"{clean * 1e6:>24.0f} {failover * 1e6:>18.0f} {failover / clean:>7.2f} "
          f"{sum(rk['failovers'] for rk in ranks):>10} {sum(rk['resent'] for rk in ranks):>12} "
          f"{'exact':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
