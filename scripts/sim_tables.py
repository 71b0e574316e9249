#!/usr/bin/env python3
"""The predicted-time tables of docs/simulation.md, from the simulator (default model):

    python3 scripts/sim_tables.py [--ns 8,16,32,64] > tables.md

All-to-all at 64 KiB and 1 MiB per peer, MoE dispatch (4096 tokens per rank, hidden 7168
bf16, top-8 of 256 experts, Zipf(1.2)) and multicast all-gather of 1 MiB per rank (with
the bytes a ring would inject), 16 DPA threads per rank, one 400 Gb/s switch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from offload_lib import sim_cli  # noqa: E402


def table(title: str, coll: str, ns: list[int], size_of, extra=()) -> list[str]:
    lines = [f"**{title}**", "", "| n | time (us) | algbw (GB/s) | busbw (GB/s) | injected/rank (MB) |"
             + (" ring would inject (MB) |" if coll == "allgather" else "") + " DPA busy (mean/max %) |",
             "|---|---|---|---|---|" + ("---|" if coll == "allgather" else "") + "---|"]
    for n in ns:
        res = sim_cli.run_one(coll, n, size_of(n), {}, payload="phantom", extra=extra)
        r = res["row"]
        ring = f" {r['ring_mb']:.2f} |" if coll == "allgather" else ""
        lines.append(f"| {n} | {r['time_us']:.1f} | {r['algbw']:.2f} | {r['busbw']:.2f} | "
                     f"{r['inj_mb']:.2f} |{ring} {r['busy_mean']:.1f} / {r['busy_max']:.1f} |")
    return lines + [""]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ns", default="8,16,32,64")
    a = p.parse_args(argv)
    ns = [int(x) for x in a.ns.split(",")]
    out = []
    out += table("All-to-all, 64 KiB per peer", "alltoall", ns, lambda n: n * (64 << 10))
    out += table("All-to-all, 1 MiB per peer", "alltoall", ns, lambda n: n << 20)
    out += table("MoE dispatch (all-to-all-v): 4096 tokens x 7168 bf16 per rank, top-8 of 256 "
                 "experts, Zipf(1.2)", "moe", ns, lambda n: 2 * 7168, extra=["tokens=4096"])
    out += table("Multicast all-gather, 1 MiB per rank", "allgather", ns, lambda n: n << 20)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
