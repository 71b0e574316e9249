#!/usr/bin/env python3
"""Plant a bug in a scratch copy of the firmware, build the simulator from it, and count
the explorer seeds it takes to fail (issue 20's acceptance: each within 1,000).

    python3 scripts/sim_planted.py [no-ready-wait|early-complete ...] [--seeds 0..999]

Mutants (applied to a copy in a temporary directory; the tree is never touched):
  no-ready-wait   a sender takes the receiver's ready without waiting for this op's seq
                  word (p2p.c take_ready): it writes where a stale or empty ready points
  early-complete  a receiver counts a source as received once its own ready is out, not
                  when the source's done signal arrived (p2p.c dpa_exchange_step)
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import build_defs  # noqa: E402

MUTANTS = {
    "no-ready-wait": ("p2p.c", "\tif (off_load_acquire(&r->seq) != op->seq)\n\t\treturn 0;\n\tit->raddr",
                      "\tit->raddr"),
    "early-complete": ("p2p.c", "(dpa_check_done(eng, op, hal, it, src) ||",
                       "((it->flags & DPA_ITEM_READY_OUT) || dpa_check_done(eng, op, hal, it, src) ||"),
}


def build_mutant(name: str, work: Path) -> Path:
    """dpa-sim built from a copy of the firmware with `name` applied."""
    fname, old, new = MUTANTS[name]
    src = work / "src"
    shutil.copytree(ROOT / "dpa_firmware" / "src", src)
    text = (src / fname).read_text()
    if text.count(old) != 1:
        raise SystemExit(f"mutant {name}: the pattern is not in {fname} exactly once (the firmware "
                         "changed: update MUTANTS)")
    (src / fname).write_text(text.replace(old, new))
    target = build_defs.targets()["sim"]
    firmware = set(build_defs.sources("firmware"))
    sources = [str(src / Path(s).name) if s in firmware else s for s in target.sources]
    mutant = build_defs.Target(sources, [*target.flags, f"-I{src}"])
    out = work / "dpa-sim"
    built = mutant.build("gcc", out)
    if built.returncode:
        raise SystemExit(f"mutant {name} did not build:\n{built.stderr}")
    return out


def first_failure(binary: Path, lo: int, hi: int) -> tuple[int | None, int, str]:
    """(first failing seed or None, seeds run, its error)."""
    out = subprocess.run([str(binary), "explore", f"seeds={lo}..{hi}", "max_failures=1"],
                         capture_output=True, text=True, timeout=900)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    fails = [x for x in lines if "failed_seed" in x]
    ran = lines[-1]["seeds"]
    if fails:
        return fails[0]["failed_seed"], ran, fails[0]["error"]
    return None, ran, ""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mutants", nargs="*", default=list(MUTANTS))
    p.add_argument("--seeds", default="0..999")
    a = p.parse_args(argv)
    lo, hi = (int(x) for x in a.seeds.split(".."))
    worst = 0
    for name in a.mutants:
        with tempfile.TemporaryDirectory(prefix=f"sim-mutant-{name}-") as tmp:
            seed, ran, err = first_failure(build_mutant(name, Path(tmp)), lo, hi)
        if seed is None:
            print(f"{name}: NOT found in {ran} seeds")
            worst = 1
        else:
            print(f"{name}: failed at seed {seed}, after {ran} seeds ({err})")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
