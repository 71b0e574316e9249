"""OFFLOAD_OP_TEAM_DESTROY (ABI opcode 11): a team slot is retired on this rank and can be
created again; malformed or premature destroys are refused with an error completion."""
from __future__ import annotations

import numpy as np
import pytest

from offload_lib._native import ffi, lib
from offload_lib.errors import ERR_INVALID, OK

from test_firmware_checks import OP_BARRIER, Regs, addr, alltoall_op, fw, make_op, post, run_op, wait  # noqa: F401

OP_TEAM_DESTROY = lib.OFFLOAD_OP_TEAM_DESTROY
SRC = 1 | 4       # local read | remote read
DST = 1 | 2 | 8   # local read/write | remote write


def _create(h, team_id: int) -> int:
    ranks = ffi.new("uint32_t[]", [0])
    return lib.host_team_create(h, team_id, 1, ranks, 10**9)


@pytest.mark.timeout(30)
def test_destroy_then_create_again(fw):
    _, h, regs = fw
    assert _create(h, 5) == 0
    assert _create(h, 5) != 0, "a live slot was created twice"
    src = np.arange(64, dtype=np.uint8)
    for _ in range(3):
        dst = np.zeros(64, np.uint8)
        op = alltoall_op(src, dst, regs.acquire(src, SRC), regs.acquire(dst, DST), team=5)
        assert run_op(h, op).status == OK
        assert (dst == src).all()
        assert run_op(h, make_op(opcode=OP_TEAM_DESTROY, team=5)).status == OK
        # retired: collectives on it are refused until it is created again
        assert run_op(h, make_op(opcode=OP_BARRIER, team=5)).status == ERR_INVALID
        assert _create(h, 5) == 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("over", [{"team": 7}, {"team": 16}, {"count": 1}, {"src_addr": 4096}])
def test_malformed_destroy_is_refused(fw, over):
    _, h, _ = fw
    fields = {"opcode": OP_TEAM_DESTROY, "team": 0, **over}
    assert run_op(h, make_op(**fields)).status == ERR_INVALID
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK  # world still usable
