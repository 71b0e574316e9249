"""The emulated wire's choice of way (emulator/emu_wire.c: ``emu_wire_route``,
``emu_wire_direct``), built alone with a clock of the test's own under ASan + UBSan
(tests/c/wire_choice_test.c): with nothing measured a write takes the wire, and its copies
into slots this process has not used yet are not timed (also after it took a rank over),
nor are its target's wake-ups; once its cost is known one write goes directly, timed; after
that the way that cost less (the wire counted as two copies), every sixteenth choice the
other way; a write sent back on a busy wire is not counted; the lower of the first two
samples starts a cost and a later one counts at most 4x it; writes from min(64 KiB,
wire_min) up are timed. On a live job which way a write takes depends on the machine's
memory (tests/test_wire.py checks the results there)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

import build_defs

CC = shutil.which("gcc") or shutil.which("cc")


@pytest.mark.timeout(120)
@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_wire_choice_follows_the_measured_costs(tmp_path):
    exe = tmp_path / "wire_choice_test"
    build = build_defs.targets()["wire_choice_test"].build(CC, exe)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                         env={"ASAN_OPTIONS": "detect_leaks=1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok: wire choice"), run.stdout
