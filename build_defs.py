"""The one build definition of the C code: sources, include paths and flags, by target.

setup.py (the library), the tests (freestanding firmware check, sanitizer and fuzz
harnesses) and scripts/build_flexio.sh (the hardware build) all read it; nothing else lists
sources or flags. Run it to build a target outside pytest or to print a list:

    python3 build_defs.py build fuzz_main build/fuzz_main      # the fuzz harness (ASan)
    python3 build_defs.py build multirank_tsan build/multirank
    python3 build_defs.py build flexio_addr_test build/flexio_addr_test
    python3 build_defs.py targets                              # the targets build knows
    python3 build_defs.py build sim build/dpa-sim                # the simulator
    python3 build_defs.py list firmware                        # sources, one a line
    python3 build_defs.py flags flexio_device                  # a flag set, on one line
"""
from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent

INCLUDES = ["dpa_firmware/include", "host/include"]
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
STRICT = ["-std=c11", "-O2", "-g", *WARNINGS]
# The core as the Python extension and libdpaoffload.so link it: whole-program optimised,
# so that the firmware's calls into its HAL (thread index, windows, stats: a few
# instructions each, behind a call per use) inline across files, and nothing is exported
# but what the target exports on purpose. A small op's pass ran 23% fewer instructions.
# Fat objects: an archiver or linker without the LTO plugin still links plain code. A
# compiler that refuses these flags (an old one, clang without fat objects) builds without
# them (lto()), as does DPA_OFFLOAD_LTO=0.
LTO = ["-fvisibility=hidden", "-flto", "-ffat-lto-objects"]
LTO_LINK = ["-flto=auto", "-O2", "-g"]
# The contract headers as any C11 user compiles them: pedantic, no extensions.
PEDANTIC = ["-std=c11", "-pedantic", *WARNINGS]
# The firmware as dpacc sees it: no libc, no system headers but the compiler's own.
FREESTANDING = ["-std=c11", "-ffreestanding", "-nostdinc", "-Wall", "-Wextra", "-Werror",
                "-Wpedantic", "-O2"]
ASAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
# gcc warns that TSan does not model atomic_thread_fence (-Wtsan). Every word the fences
# order is itself accessed with __atomic builtins, which TSan does model.
TSAN = ["-fsanitize=thread", "-Wno-tsan", "-fno-omit-frame-pointer"]
# The hardware build (scripts/build_flexio.sh): DOCA's dpacc for the device image (the
# firmware and its FlexIO HAL), its generated host stubs, and the host backend. The SDK
# marks most of the FlexIO API experimental; its headers use deprecated declarations.
# -ffp-contract=off: the reductions' documented order rounds every partial (reduce.h);
# clang contracts a*b+c into an fma by default, which would change results.
FLEXIO_DEVICE = ["-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-deprecated-declarations",
                 "-DFLEXIO_DEV_ALLOW_EXPERIMENTAL_API"]
FLEXIO_DEVICE_INCLUDES = ["dpa_firmware/include", "dpa_firmware/src", "dpa_firmware/hal/flexio"]
FLEXIO_HOST_STUBS = ["-fPIC", "-O2", "-Wno-deprecated-declarations",
                     "-DFLEXIO_ALLOW_EXPERIMENTAL_API"]
FLEXIO_HOST = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-fvisibility=hidden",
               "-DFLEXIO_ALLOW_EXPERIMENTAL_API"]


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
        "pyext": "host/py/*.c",  # offload_lib._fast, a CPython extension (the full C API)
    }
    if group == "mpi":  # the PMPI library: shipped as sources, built against the MPI found
        return _glob("host/mpi/*.[ch]") + _glob("host/mpi/*.map")
    if group == "core":
        return sources("firmware") + sources("emulator") + sources("host")
    if group == "sim":  # the simulator (dpa-sim): the same firmware files, a third HAL
        return sources("firmware") + sources("sim_hal") + sources("sim_host")
    if group == "fuzz":
        return [f"tests/c/{n}.c" for n in ("fuzz_main", "fuzz_mutate", "fuzz_seeds", "fuzz_engine",
                                             "fuzz_hal")]
    return _glob(groups[group])


@dataclass(frozen=True)
class Target:
    """An executable built from sources with flags (and -lpthread)."""

    sources: list[str]
    flags: list[str] = field(default_factory=list)
    includes: list[str] = field(default_factory=lambda: list(INCLUDES))

    def command(self, cc: str, out: Path | str) -> list[str]:
        return [cc, *STRICT, *self.flags, *(f"-I{ROOT / inc}" for inc in self.includes),
                *(str(ROOT / s) for s in self.sources), "-lpthread", "-o", str(out)]

    def build(self, cc: str, out: Path | str, jobs: int | None = None) -> subprocess.CompletedProcess[str]:
        """What command() does, one compiler per core: the test suite runs one test at a
        time, so a single gcc over ~70 sources leaves the other core idle for the sanitizer
        builds. The first failure's output is the result's stderr."""
        compile_flags = [*STRICT, *self.flags, *(f"-I{ROOT / inc}" for inc in self.includes)]
        with tempfile.TemporaryDirectory(prefix="objs-", dir=Path(out).parent) as objdir:
            objects = [str(Path(objdir) / f"{i}.o") for i in range(len(self.sources))]

            def compile_one(i: int) -> subprocess.CompletedProcess[str]:
                return subprocess.run([cc, *compile_flags, "-c", str(ROOT / self.sources[i]),
                                       "-o", objects[i]], capture_output=True, text=True)

            with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
                results = list(pool.map(compile_one, range(len(self.sources))))
            failed = [r for r in results if r.returncode]
            if failed:
                return failed[0]
            return subprocess.run([cc, *compile_flags, *objects, "-lpthread", "-o", str(out)],
                                  capture_output=True, text=True)


# The simulator's own headers; the firmware is compiled with STRICT and nothing else (no
# -D, no -include: tests/test_sim_purity.py).
SIM_INCLUDES = ["dpa_firmware/hal/sim", "host/src/sim"]


def targets() -> dict[str, Target]:
    multirank = ["tests/c/multirank.c", "tests/c/multirank_alltoall.c", "tests/c/multirank_agree.c",
                 *sources("core")]
    return {
        "sim": Target(sources("sim"), [f"-I{ROOT / inc}" for inc in SIM_INCLUDES]),
        "fuzz_main": Target(sources("fuzz") + sources("firmware"), ASAN),
        "multirank_asan": Target(multirank, ASAN),
        "multirank_tsan": Target(multirank, TSAN),
        # The C API's own code (dpo_*.c) with the core, as a C program uses it.
        "capi_asan": Target(["tests/c/capi.c", *sources("core")], ASAN,
                            includes=[*INCLUDES, "tests/c"]),
        # The emulated wire's choice of way, emu_wire.c alone with a clock of the test's own.
        "wire_choice_test": Target(["tests/c/wire_choice_test.c", "emulator/emu_wire.c"], ASAN,
                                   includes=[*INCLUDES, "emulator"]),
        # Ranks spread over the cores, emu_spin.c alone with a job table of the test's own.
        "balance_test": Target(["tests/c/balance_test.c", "emulator/emu_spin.c"], ASAN,
                               includes=[*INCLUDES, "emulator"]),
        # The FlexIO backend's GID and next-hop choice over made-up tables (no SDK needed).
        "flexio_addr_test": Target(["tests/c/flexio_addr_test.c", "host/src/flexio/flexio_addr.c",
                                    "host/src/flexio/flexio_netlink.c"],
                                   includes=["host/src/flexio"]),
    }


def flags(name: str) -> list[str]:
    """A flag set by name, include paths absolute: the hardware build's (flexio_device,
    flexio_host_stubs, flexio_host; flexio_host_check: the host backend with warnings as
    errors, as the tests compile it), and pedantic (the contract headers' check)."""
    def inc(dirs: list[str]) -> list[str]:
        return [f"-I{ROOT / d}" for d in dirs]

    sets = {
        "flexio_device": FLEXIO_DEVICE + inc(FLEXIO_DEVICE_INCLUDES),
        "flexio_host_stubs": FLEXIO_HOST_STUBS,
        "flexio_host": FLEXIO_HOST + inc(INCLUDES),
        "flexio_host_check": FLEXIO_HOST + ["-Werror"] + inc(INCLUDES),
        "pedantic": PEDANTIC + inc(INCLUDES),
    }
    return sets[name]


@functools.cache
def lto() -> tuple[list[str], list[str]]:
    """The core's compile and link flags beyond STRICT: LTO and LTO_LINK where the compiler
    the build uses ($CC, else Python's) compiles and links a shared object with them (warnings
    as errors), else hidden visibility alone."""
    plain: tuple[list[str], list[str]] = (["-fvisibility=hidden"], [])
    if os.environ.get("DPA_OFFLOAD_LTO", "1") == "0":
        return plain
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = Path(tmp) / "probe.c", Path(tmp) / "probe.o"
        src.write_text("int dpa_lto_probe(int x);\nint dpa_lto_probe(int x) { return x + 1; }\n")
        steps = [[*cc, *STRICT, "-fPIC", *LTO, "-c", str(src), "-o", str(obj)],
                 [*cc, "-shared", str(obj), "-o", str(Path(tmp) / "probe.so"), *LTO_LINK]]
        for step in steps:
            try:
                if subprocess.run(step, capture_output=True).returncode != 0:
                    return plain
            except OSError:
                return plain
    return LTO, LTO_LINK


def library() -> tuple[str, dict[str, object]]:
    """The static library setup.py builds and links into the cffi extension."""
    return ("dpaoffload_core", {"sources": sources("core"), "include_dirs": INCLUDES,
                                "cflags": [*STRICT, "-fPIC", *lto()[0]]})


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
    if len(argv) == 2 and argv[0] == "flags":
        print(" ".join(flags(argv[1])))
        return 0
    if argv == ["targets"]:
        print("\n".join(targets()))
        return 0
    if len(argv) == 3 and argv[0] == "build":
        result = targets()[argv[1]].build("gcc", argv[2])
        sys.stderr.write(result.stderr)
        return result.returncode
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
