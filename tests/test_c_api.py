"""The public C API as a C program sees it: no Python in the process. Built with the
package's pkg-config file, run as forked ranks; the library exports the dpo_* API only;
docs/c_api.md's example compiles and runs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs
from offload_lib import mpi_lib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None or shutil.which("pkg-config") is None,
                                reason="needs a C compiler and pkg-config")


def _pkg(*flags: str) -> list[str]:
    env = dict(os.environ, PKG_CONFIG_PATH=str(mpi_lib.pkgconfig_dir()))
    out = subprocess.run(["pkg-config", *flags, "dpa-offload"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def _build(tmp_path: Path, source: Path, name: str) -> Path:
    exe = tmp_path / name
    cmd = [CC, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *_pkg("--cflags"),
           f"-I{HERE / 'c'}", str(source), *_pkg("--libs"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return exe


def _no_python(exe: Path) -> None:
    deps = subprocess.run(["ldd", str(exe)], capture_output=True, text=True).stdout
    assert "python" not in deps.lower(), deps


@pytest.fixture(scope="module")
def capi(tmp_path_factory) -> Path:
    exe = _build(tmp_path_factory.mktemp("capi"), HERE / "c" / "capi.c", "capi")
    _no_python(exe)
    return exe


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [1, 3, 5])
def test_c_program_runs_every_collective(capi, n):
    res = subprocess.run([str(capi), str(n)], capture_output=True, text=True, timeout=170)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"capi n={n}: ok" in res.stdout


def test_library_exports_only_the_api():
    out = subprocess.run(["nm", "-D", "--defined-only", str(mpi_lib.c_library())],
                         capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names, out
    stray = sorted(n for n in names if not n.startswith("dpo_"))
    assert not stray, f"exported beyond the API (would interpose under LD_PRELOAD): {stray}"
    header = (ROOT / "host" / "include" / "dpa_offload.h").read_text()
    declared = set(re.findall(r"\b(dpo_[a-z_]+)\(", header))
    assert declared - {"dpo_status_t"} <= names | {"dpo_lib_init"}, declared - names


def test_header_is_plain_c11(tmp_path):
    src = tmp_path / "h.c"
    src.write_text('#include "dpa_offload.h"\nint main(void) { return DPO_OK; }\n')
    res = subprocess.run([CC, "-std=c11", "-pedantic", "-Wall", "-Wextra", "-Werror",
                          *_pkg("--cflags"), "-c", str(src), "-o", str(tmp_path / "h.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.timeout(120)
def test_docs_example_compiles_and_runs(tmp_path):
    text = (ROOT / "docs" / "c_api.md").read_text()
    blocks = re.findall(r"```c\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "int main" in b)
    src = tmp_path / "example.c"
    src.write_text(example)
    exe = _build(tmp_path, src, "example")
    _no_python(exe)
    res = subprocess.run([str(exe), "3"], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok") == 3, res.stdout


@pytest.mark.timeout(600)
def test_c_program_under_address_and_ub_sanitizers(tmp_path):
    """The C API's own code (dpo_*.c) with the core, built with ASan + UBSan (leaks too)."""
    exe = tmp_path / "capi_asan"
    res = build_defs.targets()["capi_asan"].build(CC, exe)
    if res.returncode != 0 and "sanitizer" in res.stderr and "cannot find" in res.stderr:
        pytest.skip("no sanitizer runtime: " + res.stderr[-200:])
    assert res.returncode == 0, res.stderr[-3000:]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="halt_on_error=1")
    run = subprocess.run([str(exe), "3"], capture_output=True, text=True, timeout=90, env=env)
    assert run.returncode == 0 and "capi n=3: ok" in run.stdout, run.stdout + run.stderr[-3000:]
