"""The one build definition of the C code: sources, include paths and flags, by target.

setup.py (the library), the tests (freestanding firmware check, sanitizer and fuzz
harnesses) and scripts/build_flexio.sh (the hardware build) all read it; nothing else lists
sources or flags. Run it to build a target outside pytest or to print a list:

    python3 build_defs.py build fuzz_main build/fuzz_main      # the fuzz harness (ASan)
    python3 build_defs.py build multirank_tsan build/multirank
    python3 build_defs.py build sim build/dpa-sim                # the simulator
    python3 build_defs.py list firmware                        # sources, one a line
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent

INCLUDES = ["dpa_firmware/include", "host/include"]
STRICT = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror"]
# The firmware as dpacc sees it: no libc, no system headers but the compiler's own.
FREESTANDING = ["-std=c11", "-ffreestanding", "-nostdinc", "-Wall", "-Wextra", "-Werror",
                "-Wpedantic", "-O2"]
ASAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# gcc warns that TSan does not model atomic_thread_fence (-Wtsan). Every word the fences
# order is itself accessed with __atomic builtins, which TSan does model.
TSAN = ["-fsanitize=thread", "-Wno-tsan", "-fno-omit-frame-pointer"]


def _glob(pattern: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))


def sources(group: str) -> list[str]:
    """Sources of one group, relative to the repository root."""
    groups = {
        "firmware": "dpa_firmware/src/*.c",
        "emulator": "emulator/*.c",
        "host": "host/src/*.c",
        "flexio_hal": "dpa_firmware/hal/flexio/*.c",
        "flexio_host": "host/src/flexio/*.c",
        "sim_hal": "dpa_firmware/hal/sim/*.c",
        "sim_host": "host/src/sim/*.c",
    }
    if group == "mpi":  # the PMPI library: shipped as sources, built against the MPI found
        return _glob("host/mpi/*.[ch]") + _glob("host/mpi/*.map")
    if group == "core":
        return sources("firmware") + sources("emulator") + sources("host")
    if group == "sim":  # the simulator (dpa-sim): the same firmware files, a third HAL
        return sources("firmware") + sources("sim_hal") + sources("sim_host")
    if group == "fuzz":
        return [f"tests/c/{n}.c" for n in ("fuzz_main", "fuzz_seeds", "fuzz_engine", "fuzz_hal")]
    return _glob(groups[group])


@dataclass(frozen=True)
class Target:
    """An executable built from sources with flags (and -lpthread)."""

    sources: list[str]
    flags: list[str] = field(default_factory=list)

    def command(self, cc: str, out: Path | str) -> list[str]:
        return [cc, *STRICT, *self.flags, *(f"-I{ROOT / inc}" for inc in INCLUDES),
                *(str(ROOT / s) for s in self.sources), "-lpthread", "-o", str(out)]


# The simulator's own headers; the firmware is compiled with STRICT and nothing else (no
# -D, no -include: tests/test_sim_purity.py).
SIM_INCLUDES = ["dpa_firmware/hal/sim", "host/src/sim"]


def targets() -> dict[str, Target]:
    multirank = ["tests/c/multirank.c", *sources("core")]
    return {
        "sim": Target(sources("sim"), [f"-I{ROOT / inc}" for inc in SIM_INCLUDES]),
        "fuzz_main": Target(sources("fuzz") + sources("firmware"), ASAN),
        "multirank_asan": Target(multirank, ASAN),
        "multirank_tsan": Target(multirank, TSAN),
    }


def library() -> tuple[str, dict[str, object]]:
    """The static library setup.py builds and links into the cffi extension."""
    return ("dpaoffload_core", {"sources": sources("core"), "include_dirs": INCLUDES,
                                "cflags": [*STRICT, "-fPIC"]})


def freestanding_command(cc: str, source: str | Path, out: Path | str) -> list[str]:
    """Compile one firmware source the way a freestanding target would."""
    builtin = subprocess.run([cc, "-print-file-name=include"], capture_output=True, text=True,
                             check=True).stdout.strip()
    return [cc, *FREESTANDING, "-isystem", builtin, "-I", str(ROOT / "dpa_firmware" / "include"),
            "-c", str(source), "-o", str(out)]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "list":
        print("\n".join(str(ROOT / s) for s in sources(argv[1])))
        return 0
    if len(argv) == 3 and argv[0] == "build":
        cmd = targets()[argv[1]].command("gcc", argv[2])
        print(" ".join(cmd))
        return subprocess.run(cmd).returncode
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
