#!/usr/bin/env python3
"""What a simulation costs on this machine: wall time, events per second and peak memory
of one dpa-sim run per world size (docs/simulation.md, "Scale"):

    python3 scripts/sim_scale.py [--ns 8,64,256,1024] [--coll alltoall] [--size 1M]
                                 [--payload phantom] [--threads 16] [--markdown]

--size is per peer for alltoall (1 MiB: the issue's 1024-rank acceptance run), per row for
moe, per rank block otherwise; each run is one op after setup (iters=1). Peak memory is
the child's maximum resident set (wait4), so it includes the firmware state of every rank.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from offload_lib import sim_model  # noqa: E402
from offload_lib.config import parse_size  # noqa: E402


def measure(coll: str, n: int, size: int, payload: str, threads: int,
            extra: list[str]) -> dict[str, float]:
    wire = ["coll=alltoallv", "vmode=3", "tokens=4096"] if coll == "moe" else [f"coll={coll}"]
    args = [str(sim_model.binary()), "run", *wire, f"n={n}", f"size={size}",
            f"threads={threads}", f"payload={payload}", *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not all children's
    wall = time.monotonic() - t0
    rc = os.waitstatus_to_exitcode(status)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not lines:
        raise SystemExit(f"dpa-sim {' '.join(args[1:])} failed (exit {rc})")
    res = json.loads(lines[-1])
    if not res.get("ok"):
        raise SystemExit(f"dpa-sim {' '.join(args[1:])}: {res}")
    return {"n": n, "wall_s": wall, "sim_wall_s": res["wall_s"], "events": res["events"],
            "passes": res["passes"], "msgs": res["msgs"], "time_us": res["time_ps"] / 1e6,
            "rss_mb": usage.ru_maxrss / 1024}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default="8,16,32,64")
    p.add_argument("--coll", default="alltoall")
    p.add_argument("--size", default="1M")
    p.add_argument("--payload", default="phantom", choices=("phantom", "real"))
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--extra", default="", help="more dpa-sim key=value arguments, comma separated")
    a = p.parse_args(argv)
    extra = [x for x in a.extra.split(",") if x]
    print(f"| n | events | passes | messages | predicted (us) | wall (s) | events/s | peak RSS (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.ns.split(",")):
        r = measure(a.coll, n, parse_size(a.size), a.payload, a.threads, extra)
        print(f"| {n} | {r['events']:,} | {r['passes']:,} | {r['msgs']:,} | {r['time_us']:.1f} | "
              f"{r['wall_s']:.2f} | {r['events'] / r['sim_wall_s'] / 1e6:.2f} M | {r['rss_mb']:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
