"""The FlexIO binding's per-peer tables past 64 ranks, with no DPA and no model run: the
binding's device sources built for this CPU against the FlexIO model's headers, with a small
device runtime of the test's own (tests/c/flexio_hal_tables_test.c), under ASan + UBSan.
For W = 2, 65 and 4096 (8 rails): the HAL takes exactly what the image's QUERY_HAL says,
every QP's user_index round-trips, and a CQE whose user_index names a peer >= W, a rail >=
rails or a twin past the rails is dropped, never read out of the tables."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which("gcc") or shutil.which("cc")


@pytest.mark.timeout(120)
@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_tables_sized_by_world_and_user_index_round_trip(tmp_path):
    exe = tmp_path / "flexio_hal_tables_test"
    device = ROOT / "dpa_firmware" / "hal" / "flexio"
    cmd = [CC, "-std=gnu11", "-O1", "-g", "-Werror", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=all", "-D__dpa_global__=__attribute__((used))",
           "-D__dpa_rpc__=__attribute__((used))", "-D__NV_DPA=1",
           f"-I{ROOT / 'emulator' / 'flexio_model' / 'include'}",
           *build_defs.flags("flexio_device"),
           str(ROOT / "tests" / "c" / "flexio_hal_tables_test.c"),
           *sorted(str(p) for p in device.glob("*.c")), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                         env={"ASAN_OPTIONS": "detect_leaks=1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok: W = 2, 65"), run.stdout
