"""The FlexIO backend's RoCE addressing, with no card: which GID a port uses (the routable
IPv4-mapped RoCE v2 one, VLAN-aware) and which MAC a packet to a peer goes to (the next
hop's, from the kernel's route and neighbour tables), over made-up tables; and the kernel
queries on this machine's loopback (tests/c/flexio_addr_test.c)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs

CC = shutil.which("gcc") or shutil.which("cc")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_gid_choice_and_next_hop(tmp_path):
    exe = tmp_path / "flexio_addr_test"
    build = subprocess.run(build_defs.targets()["flexio_addr_test"].command(CC, exe),
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
