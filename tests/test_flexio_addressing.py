"""The FlexIO backend's RoCE addressing, with no card: which GID a port uses (the routable
IPv4-mapped RoCE v2 one, VLAN-aware) and which MAC a packet to a peer goes to (the next
hop's, from the kernel's route and neighbour tables), over made-up tables; and the kernel
queries on this machine's loopback (tests/c/flexio_addr_test.c)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which("gcc") or shutil.which("cc")


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_gid_choice_and_next_hop(tmp_path):
    exe = tmp_path / "flexio_addr_test"
    src = ROOT / "host" / "src" / "flexio"
    build = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{src}",
                            str(ROOT / "tests" / "c" / "flexio_addr_test.c"),
                            str(src / "flexio_addr.c"), str(src / "flexio_netlink.c"),
                            "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
