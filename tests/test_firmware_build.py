"""The firmware must stay compilable by dpacc: freestanding C11, no libc headers, no malloc,
only offload_abi.h, dpa_hal.h and its own headers. Compile each source the way a
freestanding target would (no system include path) with the project's warning flags."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs

ROOT = build_defs.ROOT
FIRMWARE = ROOT / "dpa_firmware"
SOURCES = [ROOT / s for s in build_defs.sources("firmware")]
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler on PATH")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_firmware_source_is_freestanding_c11(source: Path, tmp_path: Path) -> None:
    cmd = build_defs.freestanding_command(CC, source, tmp_path / "out.o")
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"


def test_firmware_calls_nothing_outside_the_hal(tmp_path: Path) -> None:
    objs = []
    for source in SOURCES:
        obj = tmp_path / (source.stem + ".o")
        subprocess.run(build_defs.freestanding_command(CC, source, obj), check=True)
        objs.append(str(obj))
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not installed")
    out = subprocess.run([nm, "-u", *objs], capture_output=True, text=True, check=True).stdout
    undefined = {line.split()[-1] for line in out.splitlines() if line.strip() and ":" not in line}
    defined_here = set(subprocess.run([nm, "--defined-only", *objs], capture_output=True, text=True,
                                      check=True).stdout.split())
    external = {sym for sym in undefined - defined_here if not sym.startswith("dpa_hal_")}
    # memcpy/memset may be emitted by the compiler for struct copies; DPA toolchains provide them.
    assert external <= {"memcpy", "memset"}, f"firmware calls outside dpa_hal.h: {sorted(external)}"


def _symbols(nm: str, obj: str, *args: str) -> list[list[str]]:
    out = subprocess.run([nm, *args, obj], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def test_firmware_calls_run_one_way(tmp_path: Path) -> None:
    """engine -> algorithm -> p2p/mcast -> rails -> HAL: the engine calls no function of an
    algorithm file nor of mcast.c (it reaches them through struct dpa_algo's hooks), and
    no lower layer calls a higher one (rails.c nothing of the engine's; p2p.c and mcast.c
    nothing of the engine's or an algorithm's; op.c, the op's fate, no firmware file)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not installed")
    functions: dict[str, str] = {}  # function -> the file defining it
    calls: dict[str, set[str]] = {}
    algorithms = set()
    for source in SOURCES:
        obj = str(tmp_path / (source.stem + ".o"))
        subprocess.run(build_defs.freestanding_command(CC, source, obj), check=True)
        for sym in _symbols(nm, obj, "--defined-only"):
            kind, name = sym[-2], sym[-1]
            if kind == "T":
                functions[name] = source.stem
            elif name.startswith("dpa_algo_"):  # an algorithm's registry entry: its file
                algorithms.add(source.stem)
        calls[source.stem] = {sym[-1] for sym in _symbols(nm, obj, "-u")}
    assert {"alltoall_pairwise", "alltoallv", "broadcast_mcast"} <= algorithms, algorithms

    def reached(caller: str) -> set[str]:
        return {functions[f] for f in calls[caller] if f in functions}

    upward = {
        "engine": algorithms | {"mcast"},
        "rails": algorithms | {"engine", "p2p", "mcast", "signature", "agree_ft"},
        "p2p": algorithms | {"engine", "mcast"},
        "mcast": algorithms | {"engine"},
        "op": set(functions.values()) - {"op"},
    }
    upward = {caller: banned for caller, banned in upward.items() if caller in calls}
    wrong = {caller: sorted(reached(caller) & banned) for caller, banned in upward.items()
             if reached(caller) & banned}
    assert not wrong, f"calls against the layering (caller: callees' files): {wrong}"


def test_a_compiler_that_refuses_lto_builds_the_core_without_it(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """build_defs.lto(): the LTO flags where the build's compiler takes them (a probe built
    with warnings as errors), hidden visibility alone where it does not, or if told."""
    refusing = tmp_path / "cc"
    refusing.write_text("#!/bin/sh\nfor a; do [ \"$a\" = -ffat-lto-objects ] && "
                        "{ echo 'unknown argument: -ffat-lto-objects' >&2; exit 1; }; done\n"
                        f"exec {CC} \"$@\"\n")
    refusing.chmod(0o755)
    (tmp_path / "ok.c").write_text("int ok(void) { return 0; }\n")
    assert subprocess.run([str(refusing), "-c", str(tmp_path / "ok.c"), "-o",
                           str(tmp_path / "ok.o")]).returncode == 0, "the refusing cc compiles"
    plain = (["-fvisibility=hidden"], [])
    try:
        for cc, told, want in [(str(refusing), "1", plain), (CC, "0", plain)]:
            monkeypatch.setenv("CC", cc)
            monkeypatch.setenv("DPA_OFFLOAD_LTO", told)
            build_defs.lto.cache_clear()
            assert build_defs.lto() == want, (cc, told)
    finally:
        build_defs.lto.cache_clear()
