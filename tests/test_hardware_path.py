"""The hardware (FlexIO) binding without a card: what can be checked here is checked, what
needs DOCA's headers or dpacc is compiled where they exist and skipped, with the reason,
where they do not. Nothing is faked."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs

ROOT = build_defs.ROOT
FIRMWARE = ROOT / "dpa_firmware"
DOCA_DIR = Path(os.environ.get("DOCA_DIR", "/opt/mellanox/doca"))
FLEXIO_DIR = Path(os.environ.get("FLEXIO_DIR", "/opt/mellanox/flexio"))
INCLUDE_DIRS = [FLEXIO_DIR / "include", DOCA_DIR / "include", Path("/usr/include")]
CC = shutil.which("gcc") or shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


def _find(header: str) -> Path | None:
    return next((d for d in INCLUDE_DIRS if (d / header).exists()), None)


def _compile(tmp_path: Path, source: str, *flags: str) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "check.c"
    src.write_text(source)
    return subprocess.run([CC, *flags, "-fsyntax-only", str(src)],
                          capture_output=True, text=True, timeout=60)


def test_hardware_facing_abi_is_strict_c11(tmp_path):
    """offload_abi.h (the FlexIO per-thread context included) and host_device.h compile as
    strict, pedantic C11 with no vendor header, and their static asserts hold."""
    out = _compile(tmp_path, '#include "offload_abi.h"\n#include "host_device.h"\n'
                             "int main(void) { return (int)sizeof(struct offload_ring_hdr) - 256; }\n",
                   *build_defs.flags("pedantic"))
    assert out.returncode == 0, out.stderr


def test_firmware_is_the_same_source_in_both_worlds():
    """The only difference between hardware and emulation is the HAL binding: the firmware
    sources name neither world."""
    for src in sorted((FIRMWARE / "src").glob("*.[ch]")):
        text = src.read_text()
        for word in ("flexio", "FLEXIO", "emu_", "EMULATOR", "__dpa_"):
            assert word not in text, f"{src.name} mentions {word!r}: world-specific firmware"
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', text)
        # its own headers (the engine's model, the layers' APIs), the contract and the HAL
        own = {p.name for p in (FIRMWARE / "src").glob("*.h")}
        allowed = {"offload_abi.h", "dpa_hal.h", "dpa_engine.h", "offload_atomic.h",
                   "stddef.h", "stdint.h"} | own
        assert set(includes) <= allowed, f"{src.name} includes {set(includes) - allowed}"


def test_hal_binding_covers_every_hal_function():
    """Every function dpa_hal.h declares is defined by the FlexIO binding (and the emulator)."""
    decl = re.findall(r"^\w[\w\s\*]*?\b(dpa_hal_\w+)\(", (FIRMWARE / "include" / "dpa_hal.h").read_text(),
                      re.M)
    assert len(decl) >= 12, decl
    for binding in ("flexio_hal", "emulator"):
        text = "\n".join((ROOT / s).read_text() for s in build_defs.sources(binding))
        missing = [f for f in decl if not re.search(rf"^\w[\w\s\*]*\b{f}\(", text, re.M)]
        assert not missing, f"{binding} does not define {missing}"


def test_flexio_device_binding_compiles_where_the_sdk_is():
    inc = _find("libflexio-dev/flexio_dev.h")
    if inc is None:
        pytest.skip("FlexIO device headers (libflexio-dev/flexio_dev.h) are not installed "
                    f"here (looked in {', '.join(map(str, INCLUDE_DIRS))}); install DOCA to check")
    dpacc = shutil.which("dpacc") or (DOCA_DIR / "tools" / "dpacc")
    if not Path(dpacc).exists():
        pytest.skip("dpacc (the DPA compiler) is not installed: the device binding only "
                    "builds with it; run scripts/build_flexio.sh on a DOCA machine")
    out = subprocess.run(["sh", str(ROOT / "scripts" / "build_flexio.sh")], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "OUT_DIR": "/tmp/dpaoff-flexio-check"})
    assert out.returncode == 0, out.stdout + out.stderr


def test_flexio_host_backend_compiles_where_the_sdk_is(tmp_path):
    flexio = _find("libflexio/flexio.h")
    verbs = _find("infiniband/verbs.h")
    if flexio is None or verbs is None:
        what = "libflexio/flexio.h (DOCA)" if flexio is None else "infiniband/verbs.h (libibverbs-dev)"
        pytest.skip(f"{what} is not installed here (looked in "
                    f"{', '.join(map(str, INCLUDE_DIRS))}); the host backend compiles with it")
    # The flags build_flexio.sh compiles it with, warnings as errors.
    out = subprocess.run([CC, *build_defs.flags("flexio_host_check"), "-fsyntax-only",
                          "-isystem", str(flexio), "-isystem", str(verbs),
                          *(str(ROOT / s) for s in build_defs.sources("flexio_host"))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_build_script_names_what_is_missing(tmp_path):
    """Without DOCA the build script fails in one line that names the missing piece."""
    if shutil.which("dpacc") or (DOCA_DIR / "tools" / "dpacc").exists():
        pytest.skip("dpacc is installed: the build itself is checked above")
    out = subprocess.run(["sh", str(ROOT / "scripts" / "build_flexio.sh")], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "OUT_DIR": str(tmp_path)})
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing dpacc" in lines[0], out.stderr
    assert not any(tmp_path.iterdir()), "it built something although the SDK is missing"
