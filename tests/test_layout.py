"""The tree stays easy to change: source files under 600 lines, and the C sources and flags
listed once (build_defs.py)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import build_defs

ROOT = build_defs.ROOT
MAX_LINES = 600
SUFFIXES = {".c", ".h", ".py", ".sh"}
# Files still over the bound, each with its length when the bound came in: none may grow,
# and one that gets under the bound leaves this list (the test says so). Empty: every
# file is under it; keep it so.
OVER: dict[str, int] = {}


def _sources() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.splitlines()
                  if Path(p).suffix in SUFFIXES and (ROOT / p).is_file())


def test_source_files_stay_under_600_lines():
    long = {p: sum(1 for _ in open(ROOT / p, encoding="utf-8", errors="replace"))
            for p in _sources()}
    new = {p: n for p, n in long.items() if n > MAX_LINES and p not in OVER}
    grown = {p: (OVER[p], long[p]) for p in OVER if long.get(p, 0) > OVER[p]}
    done = [p for p in OVER if long.get(p, 0) <= MAX_LINES]
    assert not new, f"over {MAX_LINES} lines: split them {new}"
    assert not grown, f"files over the bound grew (was, now): {grown}"
    assert not done, f"under {MAX_LINES} lines now: take them out of OVER: {done}"


def test_c_sources_and_flags_are_listed_once():
    """The library, the freestanding firmware check, the sanitizer and fuzz harnesses and
    the hardware build list no C source or warning flag of their own: they read
    build_defs.py."""
    readers = ["setup.py", "scripts/build_flexio.sh", "tests/test_sanitizers.py",
               "tests/test_firmware_build.py", "tests/test_hardware_path.py",
               "tests/test_flexio_addressing.py"]
    found = []
    for rel in readers:
        code = [line for line in (ROOT / rel).read_text().splitlines()
                if not line.lstrip().startswith("#")]
        for line in code:
            if re.search(r'\*\.c\b|-Wextra\b|-Werror\b|-std=|-DFLEXIO', line):
                found.append(f"{rel}: {line.strip()}")
    assert not found, "sources or flags listed outside build_defs.py:\n" + "\n".join(found)


def test_build_definition_covers_every_c_source():
    listed = {s for g in ("core", "flexio_hal", "flexio_host", "sim") for s in build_defs.sources(g)}
    on_disk = {p for p in _sources() if p.endswith(".c") and
               p.startswith(("dpa_firmware/src/", "emulator/", "host/src/", "dpa_firmware/hal/"))
               and not p.startswith("emulator/flexio_model/")}
    assert on_disk <= listed, f"C sources no target builds: {sorted(on_disk - listed)}"
    for target in build_defs.targets().values():
        assert all((ROOT / s).is_file() for s in target.sources), target
