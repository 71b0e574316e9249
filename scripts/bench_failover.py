#!/usr/bin/env python3
"""Rail failover in the middle of an all-to-all, against fault-free ops in the same run.

    python scripts/bench_failover.py -n 4 --size 1M --between 8

Every rank has 8 rails. Rank 1's rails 0..6 are set to fail one after the other, each
part-way through an all-to-all (after ``between`` ops of clean traffic on it, plus 1.5
blocks): the run holds 7 ops that fail over mid-op and 8 x ``between`` that do not. Each rank
times every op after a barrier and notes whether its failover counter moved; the table shows
the median over ops of the slowest rank's time, fault-free against failover, and every op's
result is checked byte by byte.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

WORKER = r'''
import json, os, sys, time
import numpy as np
import offload_lib as ol

per_peer, ops, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ol.init()
w = ctx.world
rank, n = ctx.rank, ctx.size
shared = os.environ.get("BENCH_SHARED")
src = ctx.empty(per_peer * n, np.uint8) if shared else np.empty(per_peer * n, np.uint8)
dst = ctx.empty(per_peer * n, np.uint8) if shared else np.empty(per_peer * n, np.uint8)
times, failed_over = [], []
for it in range(ops):
    # One byte value per (source, destination, iteration): cheap to fill and to check, so
    # the timed op does not start with caches full of the checker's temporaries.
    for q in range(n):
        src[q * per_peer:(q + 1) * per_peer] = (7 * rank + 3 * q + it) % 251
    dst[:] = 0
    before = ctx.stats()["failovers"]
    w.barrier().wait(timeout=60)
    t0 = time.perf_counter()
    w.alltoall(src, dst).wait(timeout=60)
    times.append(time.perf_counter() - t0)
    failed_over.append(ctx.stats()["failovers"] > before)
    for p in range(n):
        if not (dst[p * per_peer:(p + 1) * per_peer] == (7 * p + 3 * rank + it) % 251).all():
            print(f"WRONG RESULT: iteration {it}, block from rank {p}", flush=True)
            sys.exit(3)
st = ctx.stats()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"times": times, "failed_over": failed_over, "failovers": st["failovers"],
               "resent": st["resent_bytes"]}, f)
ctx.close()
'''


def parse_size(text: str) -> int:
    from offload_lib.config import parse_size as parse

    return parse(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=4)
    ap.add_argument("--size", default="1M", help="bytes per peer (default 1M)")
    ap.add_argument("--between", type=int, default=8,
                    help="fault-free ops on a rail before it fails (default 8)")
    ap.add_argument("--buffers", choices=("numpy", "shared"), default="numpy")
    args = ap.parse_args()
    per_peer = parse_size(args.size)
    rails = 8
    # Rank 1 sends n blocks per op (its own included) on its current rail; each rail dies
    # 1.5 blocks into the op after `between` clean ones.
    fail_after = args.between * args.nranks * per_peer + per_peer * 3 // 2
    ops = rails * (args.between + 1)
    faults = ",".join(f"1:{r}@{fail_after}" for r in range(rails - 1))
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as out:
        script = os.path.join(out, "worker.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(WORKER)
        env = dict(os.environ, OFFLOAD_RAILS=str(rails), OFFLOAD_RAIL_FAULTS=faults)
        if args.buffers == "shared":
            env["BENCH_SHARED"] = "1"
        rc = subprocess.call([sys.executable, "-m", "offload_lib.cli", "run", "-n",
                              str(args.nranks), "--", sys.executable, script,
                              str(per_peer), str(ops), out], env=env)
        if rc:
            print(f"bench_failover: the job failed (exit code {rc})", file=sys.stderr)
            return 1
        ranks = []
        for r in range(args.nranks):
            with open(os.path.join(out, f"rank{r}.json"), encoding="utf-8") as f:
                ranks.append(json.load(f))
    slowest = [max(rk["times"][i] for rk in ranks) for i in range(ops)]
    hit = [any(rk["failed_over"][i] for rk in ranks) for i in range(ops)]
    clean = statistics.median(t for i, t in enumerate(slowest) if i and not hit[i])
    failover = statistics.median(t for t, h in zip(slowest, hit) if h)
    nfail = sum(hit)
    print(f"# all-to-all, {args.nranks} ranks, {per_peer} B per peer, {args.buffers} buffers, "
          f"{rails} rails; rank 1's rails fail one by one, each mid-op; {ops} ops, every result "
          "checked")
    print(f"# {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, "
          f"{platform.node()} ({os.cpu_count()} CPUs): {' '.join(sys.argv)}")
    print(f"{'fault-free (us)':>16} {'failover (us)':>14} {'ratio':>6} {'ops clean/fo':>13} "
          f"{'failovers':>10} {'resent (B)':>12}")
    print(f"{clean * 1e6:>16.0f} {failover * 1e6:>14.0f} {failover / clean:>6.2f} "
          f"{f'{ops - nfail}/{nfail}':>13} {sum(rk['failovers'] for rk in ranks):>10} "
          f"{sum(rk['resent'] for rk in ranks):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
