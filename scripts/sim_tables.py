#!/usr/bin/env python3
"""The predicted-time tables of docs/simulation.md, from the simulator (default model):

    python3 scripts/sim_tables.py [--ns 8,64,128,256,512,1024] [--tables a2a64k,a2a1m,moe,ag] > t.md

All-to-all at 64 KiB and 1 MiB per peer, MoE dispatch (4096 tokens per rank, hidden 7168
bf16, top-8 of 256 experts, Zipf(1.2)) and multicast all-gather of 64 MiB gathered per rank
(nccl-tests' size: blocks of 64 MiB / n, so the op has the same 16,384 chunks at every n;
with a ring's closed-form time and injected bytes beside it), 16 DPA threads per rank, one
400 Gb/s switch, phantom payload. Each row also says what the run cost here (wall seconds).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from offload_lib import sim_cli  # noqa: E402

TABLES = {
    "a2a64k": ("All-to-all, 64 KiB per peer", "alltoall", lambda n: n * (64 << 10), []),
    "a2a1m": ("All-to-all, 1 MiB per peer", "alltoall", lambda n: n << 20, []),
    "moe": ("MoE dispatch (all-to-all-v): 4096 tokens x 7168 bf16 per rank, top-8 of 256 "
            "experts, Zipf(1.2)", "moe", lambda n: 2 * 7168, ["tokens=4096"]),
    "ag": ("Multicast all-gather, 64 MiB gathered per rank (blocks of 64 MiB / n), 2 ranks "
           "injecting at once (mcast_roots)", "allgather", lambda n: 64 << 20, ["roots=2"]),
}


def table(title: str, coll: str, ns: list[int], size_of, extra) -> list[str]:
    ag = coll == "allgather"
    lines = [f"**{title}**", "",
             "| n | time (us) | algbw (GB/s) | busbw (GB/s) | injected/rank (MB) |" +
             (" ring: time (us), injected/rank (MB) |" if ag else "") +
             " DPA busy (mean/max %) | wall here (s) |",
             "|---|---|---|---|---|" + ("---|" if ag else "") + "---|---|"]
    for n in ns:
        t0 = time.monotonic()
        res = sim_cli.run_one(coll, n, size_of(n), {}, payload="phantom", extra=extra)
        wall = time.monotonic() - t0
        r = res["row"]
        ring = f" {r['ring_us']:.1f}, {r['ring_mb']:.2f} |" if ag else ""
        lines.append(f"| {n} | {r['time_us']:.1f} | {r['algbw']:.2f} | {r['busbw']:.2f} | "
                     f"{r['inj_mb']:.2f} |{ring} {r['busy_mean']:.1f} / {r['busy_max']:.1f} | "
                     f"{wall:.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines + [""]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default="8,64,128,256,512,1024")
    p.add_argument("--tables", default=",".join(TABLES))
    a = p.parse_args(argv)
    ns = [int(x) for x in a.ns.split(",")]
    out = []
    for key in a.tables.split(","):
        if key not in TABLES:
            p.error(f"--tables: {key!r} is not one of {', '.join(TABLES)}")
        title, coll, size_of, extra = TABLES[key]
        out += table(title, coll, ns, size_of, extra)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
