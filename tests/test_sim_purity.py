"""The simulator runs the firmware's own sources, compiled as they are: no simulator code
in dpa_firmware/ (src, include), the same source files as every binding, no -D or
-include for them, and the simulator reaches the firmware only through its public
headers (dpa_hal.h, dpa_engine.h, offload_abi.h), as the emulator does."""
from __future__ import annotations

import re
from pathlib import Path

import build_defs

ROOT = Path(build_defs.__file__).resolve().parent
FIRMWARE = [*ROOT.glob("dpa_firmware/src/*.[ch]"), *ROOT.glob("dpa_firmware/include/*.h")]


def test_firmware_has_no_conditionals_but_include_guards():
    """Include guards, and the compiler's own target macros (``defined(__x86_64__)``), which
    no build can set; nothing a -D could switch."""
    for path in FIRMWARE:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b(.*)", line)
            if not m:
                continue
            guard = re.match(r"\s*#\s*ifndef\s+([A-Z0-9_]+_H)\s*$", line)
            names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(2))
            target = m.group(1) in ("if", "elif") and names and all(
                n == "defined" or re.fullmatch(r"__[a-z0-9_]+__", n) for n in names)
            assert guard or target, f"{path.name}:{no}: a conditional in the firmware: {line.strip()}"


def test_firmware_names_no_simulator():
    for path in FIRMWARE:
        text = path.read_text()
        for marker in ("SIM_", "sim_", "simulat", "dpa-sim", "hal/sim"):
            assert marker not in text, f"{path.name} mentions {marker!r}"


def test_sim_builds_the_same_firmware_files_with_strict_flags_only():
    sim = build_defs.targets()["sim"]
    firmware = build_defs.sources("firmware")
    assert firmware and all(src in sim.sources for src in firmware)
    # every other source of the target is the simulator's own
    others = [s for s in sim.sources if s not in firmware]
    assert others and all(s.startswith(("dpa_firmware/hal/sim/", "host/src/sim/")) for s in others)
    cmd = sim.command("gcc", "out")
    assert not [f for f in cmd if f.startswith("-D") or f in ("-include", "-imacros")]
    assert all(f in cmd for f in build_defs.STRICT)


def test_simulator_uses_only_public_firmware_headers():
    for path in [*ROOT.glob("dpa_firmware/hal/sim/*.[ch]"), *ROOT.glob("host/src/sim/*.[ch]")]:
        for inc in re.findall(r'#include\s+"([^"]+)"', path.read_text()):
            assert inc in ("dpa_hal.h", "dpa_engine.h", "offload_abi.h", "sim.h", "sim_driver.h"), \
                f"{path.name} includes {inc}"
