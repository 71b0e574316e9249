"""The firmware re-checks whatever crosses the host/DPA boundary.

These tests bypass offload_lib's Python checks and post raw `struct host_op`s through the cffi
binding, the way a buggy or hostile host driver could. Each test first posts a well-formed op
built the same way (the control: it must succeed and move the right bytes), then the same op
with exactly one field forged, and expects an error completion with nothing written.
"""
from __future__ import annotations

import errno
import os
import random
import re

import numpy as np
import pytest

import offload_lib as ol
from offload_lib._native import ffi, lib
from offload_lib.errors import ERR_INVALID, ERR_REMOTE_ACCESS, OK


OP_TEAM_CREATE, OP_BARRIER, OP_ALLTOALL = (lib.OFFLOAD_OP_TEAM_CREATE, lib.OFFLOAD_OP_BARRIER,
                                           lib.OFFLOAD_OP_ALLTOALL)
REMOTE_WRITE = lib.OFFLOAD_ACCESS_REMOTE_WRITE
SRC_ACCESS = lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_REMOTE_READ
DST_ACCESS = (lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_LOCAL_WRITE |
              lib.OFFLOAD_ACCESS_REMOTE_WRITE)
TIMEOUT_NS = 10 * 10**9
# A one-rank error completion takes microseconds; waiting longer only slows the known hang.
ERROR_WAIT_NS = 2 * 10**9
SENTINEL = 0x5A

class NoCompletion(AssertionError):
    """The firmware wrote no completion for a command it should have failed."""


# -- low-level helpers --------------------------------------------------------------------------

def _op_fields() -> set[str]:
    return {name for name, _ in ffi.typeof("struct host_op").fields}


def make_op(**fields):
    op = ffi.new("struct host_op *")  # zero-filled: unused fields stay 0
    known = _op_fields()
    for name, value in fields.items():
        assert name in known, f"struct host_op has no field {name!r} (has {sorted(known)})"
        setattr(op, name, value)
    return op


def post(h, op) -> int:
    tag = ffi.new("uint32_t *")
    rc = lib.host_post(h, op, TIMEOUT_NS, tag)
    assert rc == 0, f"host_post refused a command it should pass to the firmware: rc={rc}"
    return int(tag[0])


def try_wait(h, tag, timeout_ns=TIMEOUT_NS):
    """The completion, or None if none arrived within timeout_ns."""
    comp = ffi.new("struct host_completion *")
    rc = lib.host_wait(h, tag, timeout_ns, 0, comp)
    if rc == -errno.ETIMEDOUT:
        return None
    assert rc == 0, f"host_wait rc={rc}"
    return comp


def wait(h, tag):
    comp = try_wait(h, tag)
    assert comp is not None, "host_wait timed out: the firmware never completed the command"
    return comp


def run_op(h, op):
    return wait(h, post(h, op))


def addr(a) -> int:
    return int(ffi.cast("uintptr_t", ffi.from_buffer(a)))


class Regs:
    """Registrations made by a test, released at the end."""

    def __init__(self, h):
        self.h = h
        self.keys: list[int] = []

    def acquire(self, a, access, offset=0, length=None) -> int:
        length = a.nbytes - offset if length is None else length
        key = ffi.new("uint32_t *")
        owned = ffi.new("int *")
        rc = lib.host_mr_acquire(self.h, ffi.cast("void *", addr(a) + offset), length, access,
                                 key, owned)
        assert rc == 0, f"host_mr_acquire rc={rc}"
        if owned[0]:
            self.keys.append(int(key[0]))
        return int(key[0])

    def release(self):
        for k in self.keys:
            lib.host_mr_release(self.h, k)
        self.keys = []


def forged_keys(real: int) -> list[int]:
    """A random key, and the real key with its high bit flipped (same table slot)."""
    rnd = random.Random(real)
    out = [real ^ 0x80000000]
    while len(out) < 2:
        k = rnd.getrandbits(32)
        if k not in (0, real):
            out.append(k)
    return out


def _one_rank_job():
    """(context, raw handle, registrations) of a one-rank job, closed after."""
    c = ol.init()
    regs = Regs(c._handle())
    try:
        yield c, c._handle(), regs
    finally:
        regs.release()
        c.close()


@pytest.fixture
def fw():
    """(context, raw handle, registrations) of a one-rank job."""
    yield from _one_rank_job()


def alltoall_op(src, dst, src_key, dst_key, team=0, **over):
    fields = dict(opcode=OP_ALLTOALL, team=team, src_addr=addr(src), dst_addr=addr(dst),
                  count=src.nbytes, src_key=src_key, dst_key=dst_key, dst_len=dst.nbytes)
    if "src_len" in _op_fields():
        fields["src_len"] = src.nbytes
    fields.update(over)
    return make_op(**fields)


def control(h, regs, n=256):
    """A valid one-rank all-to-all through the raw API; returns buffers and keys."""
    src = np.arange(n, dtype=np.uint8) ^ 0x33
    dst = np.full(n, SENTINEL, np.uint8)
    sk, dk = regs.acquire(src, SRC_ACCESS), regs.acquire(dst, DST_ACCESS)
    comp = run_op(h, alltoall_op(src, dst, sk, dk))
    assert comp.status == OK, f"control op failed: status {comp.status}"
    assert np.array_equal(dst, src), "control op moved the wrong bytes"
    dst[:] = SENTINEL
    return src, dst, sk, dk


def alltoallv_args(nranks: int, send: list[int], words: int | None = None) -> np.ndarray:
    """struct offload_alltoallv_args: the header (nranks), then send, recv, expect."""
    n = len(send)
    args = np.zeros(words if words is not None else lib.offload_a2av_args_bytes(n) // 8,
                    np.uint64)
    args[ffi.offsetof("struct offload_alltoallv_args", "nranks") // 8] = nranks
    head = ffi.sizeof("struct offload_alltoallv_args") // 8
    args[head:head + n] = send
    return args


@pytest.mark.timeout(30)
@pytest.mark.parametrize("nranks,words", [(0, None), (2, None), (65, None), (2**32 - 1, None),
                                          (1, 8)],
                         ids=["0", "2", "65", "max", "arrays-cut-off"])
def test_alltoallv_args_of_another_team_size_are_invalid(fw, nranks, words):
    """The arguments' header names the team size their arrays are for: another one (or arrays
    that end before the team's) is an error completion, nothing written; the same op with
    the team's size (the control) moves the bytes and reports them in recv."""
    _, h, regs = fw
    src = np.arange(256, dtype=np.uint8) ^ 0x5C
    dst = np.full(256, SENTINEL, np.uint8)
    sk, dk = regs.acquire(src, SRC_ACCESS), regs.acquire(dst, DST_ACCESS)

    def op(args):
        return make_op(opcode=lib.OFFLOAD_OP_ALLTOALLV, team=0, src_addr=addr(src),
                       src_key=sk, count=256, dst_addr=addr(dst), dst_key=dk, dst_len=256,
                       aux_addr=addr(args), aux_len=args.nbytes)

    good = alltoallv_args(1, [256])
    comp = run_op(h, op(good))
    assert comp.status == OK and comp.result0 == 256, (comp.status, comp.result0)
    assert np.array_equal(dst, src) and good[9] == 256, "control op: bytes or recv count"
    dst[:] = SENTINEL
    bad = alltoallv_args(nranks if words is None else 1, [256], words)
    comp = try_wait(h, post(h, op(bad)), ERROR_WAIT_NS)
    untouched(dst, f"nranks {nranks}")
    assert comp is not None and comp.status == ERR_INVALID, comp and comp.status
    assert run_op(h, op(good)).status == OK, "the team goes on"


def untouched(a, what):
    bad = np.flatnonzero(a != SENTINEL)
    assert bad.size == 0, f"{what}: {bad.size} bytes written, first at {bad[0]}"


def expect_refused(h, op, what, *clean):
    """Post op; check the arrays in `clean` were not written (a plain failure if they were),
    then that an ERR_REMOTE_ACCESS completion arrived (NoCompletion if none did)."""
    comp = try_wait(h, post(h, op), ERROR_WAIT_NS)
    for i, a in enumerate(clean):
        untouched(a, f"{what} (buffer {i})")
    if comp is None:
        raise NoCompletion(f"{what}: no completion within {ERROR_WAIT_NS / 1e9:g} s (hang)")
    assert comp.status == ERR_REMOTE_ACCESS, f"{what}: status {comp.status}"
    return comp


# -- command checks (ERR_INVALID) ---------------------------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("team", [9, 1, 15, 16, 255, 0xFFFF])
def test_unknown_team_is_invalid(fw, team):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    comp = run_op(h, alltoall_op(src, dst, sk, dk, team=team))
    assert comp.status == ERR_INVALID, f"team {team}: status {comp.status}"
    untouched(dst, f"team {team}")
    comp = run_op(h, make_op(opcode=OP_BARRIER, team=team))
    assert comp.status == ERR_INVALID, f"barrier on team {team}: status {comp.status}"


@pytest.mark.timeout(30)
def test_team_id_wider_than_abi_field_is_rejected(fw):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    op = alltoall_op(src, dst, sk, dk, team=0x10000)
    tag = ffi.new("uint32_t *")
    rc = lib.host_post(h, op, TIMEOUT_NS, tag)
    if rc == 0:
        comp = wait(h, int(tag[0]))
        assert comp.status == ERR_INVALID, f"team 0x10000 completed with status {comp.status}"
        untouched(dst, "team 0x10000")
    else:
        assert rc == -errno.EINVAL


@pytest.mark.timeout(30)
@pytest.mark.parametrize("short_by", [1, 128, 256])
def test_dst_len_smaller_than_the_op_is_invalid(fw, short_by):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    comp = run_op(h, alltoall_op(src, dst, sk, dk, dst_len=dst.nbytes - short_by))
    assert comp.status == ERR_INVALID, comp.status
    untouched(dst, "short dst_len")


@pytest.mark.timeout(30)
def test_null_addresses_are_invalid(fw):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    for over in ({"src_addr": 0}, {"dst_addr": 0}):
        comp = run_op(h, alltoall_op(src, dst, sk, dk, **over))
        assert comp.status == ERR_INVALID, (over, comp.status)
        untouched(dst, str(over))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("over", [{"count": 1}, {"count": 4096}, {"src_addr": 4096},
                                  {"dst_addr": 4096}])
def test_barrier_with_payload_fields_is_invalid(fw, over):
    _, h, _ = fw
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK  # control
    comp = run_op(h, make_op(opcode=OP_BARRIER, team=0, **over))
    assert comp.status == ERR_INVALID, (over, comp.status)
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK  # still usable


@pytest.mark.timeout(30)
@pytest.mark.parametrize("opcode", [0, "max", 255, 0x103])
def test_host_post_rejects_opcodes_outside_the_abi(fw, opcode):
    _, h, _ = fw
    if opcode == "max":  # the first opcode past the ABI's
        with open(os.path.join(os.path.dirname(__file__), "..", "dpa_firmware", "include",
                               "offload_abi.h"), encoding="utf-8") as f:
            opcode = int(re.search(r"OFFLOAD_OP_MAX = (\d+)", f.read()).group(1))
    tag = ffi.new("uint32_t *")
    first = post(h, make_op(opcode=OP_BARRIER))
    wait(h, first)
    rc = lib.host_post(h, make_op(opcode=opcode, team=0), TIMEOUT_NS, tag)
    assert rc == -errno.EINVAL, f"opcode {opcode}: host_post rc={rc}"
    nxt = post(h, make_op(opcode=OP_BARRIER))
    assert wait(h, nxt).status == OK
    assert nxt == first + 1, "a rejected command consumed a tag"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("over", [{}, {"count": 1}, {"src_addr": 4096}, {"team": 9},
                                  {"aux_addr": 4096, "aux_len": 0}])
def test_malformed_agreement_is_invalid(fw, over):
    """OFFLOAD_OP_AGREE without its arguments (or with payload fields, or on a team that
    does not exist) is an error completion; the context goes on."""
    _, h, _ = fw
    comp = run_op(h, make_op(**{"opcode": 8, "team": 0, **over}))
    assert comp.status == ERR_INVALID, (over, comp.status)
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK


def _agree_args(nranks: int, words: int, failed: int, extra_words: int = 0) -> np.ndarray:
    """offload_agree_args: the 32-byte header, then `words + extra_words` bitmap words."""
    block = np.zeros(4 + words + extra_words, np.uint64)
    block[:4].view(np.uint32)[:2] = [nranks, words]
    block[1], block[2] = 7, 3  # value, fp (differs 0)
    for i in range(words + extra_words):
        block[4 + i] = failed >> (64 * i) & (2**64 - 1)
    return block


@pytest.mark.timeout(30)
def test_malformed_agreement_args_are_refused_with_nothing_written(fw):
    """ABI 14: the agreement's arguments are a header naming the world size and the
    bitmap's words, then the bitmap. Another world size, a bitmap of another length, one
    cut off by its registration, misaligned: an error completion, the arguments untouched.
    The control (same block, well-formed) completes and writes the agreed set: members only
    (a one-rank world: rank 0), the value, no differing member."""
    _, h, _ = fw
    w = lib.offload_rank_words(1)
    bad = {
        "another world size": _agree_args(2, w, 0b10),
        "more words than the world's": _agree_args(1, w + 1, 0b10),
        "no words": _agree_args(1, 0, 0b10, extra_words=1),
    }
    for what, block in bad.items():
        before = block.copy()
        comp = run_op(h, make_op(opcode=8, team=0, aux_addr=addr(block), aux_len=block.nbytes))
        assert comp.status == ERR_INVALID, f"{what}: status {comp.status}"
        assert np.array_equal(block, before), f"{what}: the firmware wrote the arguments"
    good = _agree_args(1, w, 0b10 | 1 << 63)
    before = good.copy()
    comp = run_op(h, make_op(opcode=8, team=0, aux_addr=addr(good), aux_len=good.nbytes - 8))
    assert comp.status == ERR_INVALID, f"bitmap past its registration: {comp.status}"
    assert np.array_equal(good, before)
    raw = np.zeros(good.nbytes + 8, np.uint8)
    misaligned = raw[4:4 + good.nbytes]
    misaligned[:] = good.view(np.uint8)
    comp = run_op(h, make_op(opcode=8, team=0, aux_addr=addr(misaligned),
                             aux_len=misaligned.nbytes))
    assert comp.status == ERR_INVALID, f"misaligned arguments: {comp.status}"
    assert np.array_equal(misaligned, good.view(np.uint8))
    comp = run_op(h, make_op(opcode=8, team=0, aux_addr=addr(good), aux_len=good.nbytes))
    assert comp.status == OK, f"control: {comp.status}"
    assert int(good[4]) == 0, "the agreed set holds ranks that are no member"
    assert int(good[1]) == 7 and int(good[2]) >> 32 == 0, "value or differs"
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK


def _team_desc(team_id: int, size: int, my_rank: int, world_ranks: list[int]) -> np.ndarray:
    """A descriptor of exactly offload_team_desc_bytes(size) bytes (peers past the list
    zero), or of the list's length if that is longer."""
    npeers = max(size, len(world_ranks))
    desc = np.zeros(lib.offload_team_desc_bytes(npeers), np.uint8)
    desc[:16].view(np.uint32)[:] = [team_id, size, my_rank, 0]
    peers = desc[16:].view(np.uint32).reshape(npeers, 4)  # ctrl_addr lo/hi, ctrl_key, world_rank
    for i, r in enumerate(world_ranks):
        peers[i, 3] = r
    return desc


@pytest.mark.timeout(30)
def test_team_create_through_host_post_is_checked(fw):
    """TEAM_CREATE is the one other opcode host_post lets through: its descriptor is checked."""
    _, h, _ = fw
    comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=0))
    assert comp.status == ERR_INVALID, f"no descriptor: {comp.status}"
    bad = {
        "team 0 already exists": _team_desc(0, 1, 0, [0]),
        "team id out of range": _team_desc(16, 1, 0, [0]),
        "size 0": _team_desc(5, 0, 0, []),
        "size over the job": _team_desc(5, 2, 0, [0]),
        "size over 64 and the job": _team_desc(5, 65, 0, [0]),
        "size over the ranks limit": _team_desc(5, lib.OFFLOAD_RANKS_LIMIT + 1, 0, [0]),
        "my_rank >= size": _team_desc(5, 1, 1, [0]),
        "member outside the world": _team_desc(5, 2, 0, [0, 1]),
        "my entry is not me": _team_desc(5, 1, 0, [3]),
    }
    for what, desc in bad.items():
        comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=addr(desc),
                                 aux_len=desc.nbytes))
        assert comp.status == ERR_INVALID, f"{what}: status {comp.status}"
    # none of them created team 5
    assert run_op(h, make_op(opcode=OP_BARRIER, team=5)).status == ERR_INVALID
    good = _team_desc(5, 1, 0, [0])
    # the firmware reads arguments only through the key the host registered them under
    comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=addr(good)))
    assert comp.status == ERR_INVALID, f"unregistered descriptor: {comp.status}"
    comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=addr(good),
                             aux_len=good.nbytes - 8))
    assert comp.status == ERR_INVALID, f"descriptor past its registration: {comp.status}"
    raw = np.zeros(good.nbytes + 8, np.uint8)
    misaligned = raw[4:4 + good.nbytes]
    misaligned[:] = good.view(np.uint8).reshape(-1)
    comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=addr(misaligned),
                             aux_len=misaligned.nbytes))
    assert comp.status == ERR_INVALID, f"misaligned descriptor: {comp.status}"
    comp = run_op(h, make_op(opcode=OP_TEAM_CREATE, team=0, aux_addr=addr(good),
                             aux_len=good.nbytes))
    assert comp.status == OK, f"control: {comp.status}"
    assert run_op(h, make_op(opcode=OP_BARRIER, team=5)).status == OK


# -- memory checks (ERR_REMOTE_ACCESS) ----------------------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("which", [0, 1], ids=["flipped-bit", "random"])
def test_forged_dst_rkey_is_refused(fw, which):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    forged = forged_keys(dk)[which]
    comp = expect_refused(h, alltoall_op(src, dst, sk, forged), f"forged rkey {forged:#x}", dst)
    assert comp.detail == 0, f"detail should name rank 0, got {comp.detail}"
    # the real key still works afterwards
    assert run_op(h, alltoall_op(src, dst, sk, dk)).status == OK
    assert np.array_equal(dst, src)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("which", [0, 1], ids=["flipped-bit", "random"])
def test_forged_src_lkey_is_refused(fw, which):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    forged = forged_keys(sk)[which]
    expect_refused(h, alltoall_op(src, dst, forged, dk), f"forged lkey {forged:#x}", dst)


@pytest.mark.timeout(30)
def test_released_key_is_refused(fw):
    _, h, regs = fw
    src, dst, sk, _ = control(h, regs)
    key = ffi.new("uint32_t *")
    owned = ffi.new("int *")
    assert lib.host_mr_acquire(h, ffi.cast("void *", addr(dst)), dst.nbytes, DST_ACCESS,
                               key, owned) == 0
    assert owned[0] == 1
    assert lib.host_mr_release(h, key[0]) == 0
    expect_refused(h, alltoall_op(src, dst, sk, int(key[0])), "revoked rkey", dst)


REGION = 4096
GUARD = 4096


@pytest.fixture
def guarded(fw):
    """A dst buffer whose middle REGION bytes alone are registered; guards on both sides."""
    _, h, regs = fw
    big = np.full(GUARD + REGION + GUARD, SENTINEL, np.uint8)
    key = regs.acquire(big, DST_ACCESS, offset=GUARD, length=REGION)
    src = (np.arange(REGION + GUARD, dtype=np.int64) % 251 + 1).astype(np.uint8)
    skey = regs.acquire(src, SRC_ACCESS)
    return h, big, key, src, skey


def _dst_op(big, key, src, skey, dst_off, count):
    return make_op(opcode=OP_ALLTOALL, team=0, src_addr=addr(src), src_key=skey,
                   dst_addr=addr(big) + dst_off, dst_key=key, count=count, dst_len=count,
                   **({"src_len": count} if "src_len" in _op_fields() else {}))


@pytest.mark.timeout(30)
def test_write_within_the_registered_region_works(guarded):
    h, big, key, src, skey = guarded
    comp = run_op(h, _dst_op(big, key, src, skey, GUARD, REGION))
    assert comp.status == OK, comp.status
    assert np.array_equal(big[GUARD:GUARD + REGION], src[:REGION])
    untouched(big[:GUARD], "guard before the region")
    untouched(big[GUARD + REGION:], "guard after the region")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dst_off,count", [
    (GUARD, REGION + 1),            # one byte past the end
    (GUARD + REGION - 8, 64),       # starts inside, runs out
    (GUARD - 64, REGION),           # starts before the region
    (GUARD + REGION, 1),            # the byte just after
], ids=["end+1", "tail-overrun", "starts-before", "byte-after"])
def test_write_past_the_registered_region_is_refused(guarded, dst_off, count):
    h, big, key, src, skey = guarded
    what = f"dst offset {dst_off - GUARD:+d} count {count}"
    # guards first (plain failures), then the region itself: one refused write moves nothing
    expect_refused(h, _dst_op(big, key, src, skey, dst_off, count), what,
                   big[:GUARD], big[GUARD + REGION:], big[GUARD:GUARD + REGION])


@pytest.mark.timeout(30)
def test_read_past_the_registered_src_is_refused(fw):
    _, h, regs = fw
    src = np.arange(2 * REGION, dtype=np.int64).astype(np.uint8)
    skey = regs.acquire(src, SRC_ACCESS, length=REGION)  # only the first half
    dst = np.full(2 * REGION, SENTINEL, np.uint8)
    dkey = regs.acquire(dst, DST_ACCESS)
    ok = make_op(opcode=OP_ALLTOALL, team=0, src_addr=addr(src), src_key=skey,
                 dst_addr=addr(dst), dst_key=dkey, count=REGION, dst_len=dst.nbytes)
    assert run_op(h, ok).status == OK
    dst[:] = SENTINEL
    over = make_op(opcode=OP_ALLTOALL, team=0, src_addr=addr(src), src_key=skey,
                   dst_addr=addr(dst), dst_key=dkey, count=REGION + 1, dst_len=dst.nbytes)
    expect_refused(h, over, "src over-read", dst)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("count", [2**40, 2**64 - 1], ids=["2^40", "2^64-1"])
def test_huge_count_is_refused(fw, count):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    comp = try_wait(h, post(h, alltoall_op(src, dst, sk, dk, count=count, dst_len=2**64 - 1)),
                    ERROR_WAIT_NS)
    untouched(dst, f"count={count}")
    if comp is None:
        raise NoCompletion(f"count={count}: no completion (hang)")
    assert comp.status in (ERR_INVALID, ERR_REMOTE_ACCESS), comp.status


@pytest.mark.timeout(30)
@pytest.mark.parametrize("which", ["dst-without-remote-write", "src-without-local-read"])
def test_keys_without_the_needed_access_are_refused(fw, which):
    _, h, regs = fw
    src, dst, sk, dk = control(h, regs)
    if which == "dst-without-remote-write":
        op = alltoall_op(src, dst, sk, regs.acquire(dst, SRC_ACCESS))
    else:
        op = alltoall_op(src, dst, regs.acquire(src, REMOTE_WRITE), dk)
    expect_refused(h, op, which, dst)


def _redop(op: int, dt: int) -> int:
    return (op << lib.OFFLOAD_REDOP_OP_SHIFT) | dt


_F32_SUM = _redop(lib.OFFLOAD_RED_SUM, lib.OFFLOAD_DT_F32)


_FORGED_WORDS = [{"root": 0}, {"root": _redop(lib.OFFLOAD_RED_AVG, lib.OFFLOAD_DT_I32)},
                 {"root": _redop(lib.OFFLOAD_RED_OPS + 3, lib.OFFLOAD_DT_F32)},
                 {"root": _redop(lib.OFFLOAD_RED_SUM, lib.OFFLOAD_DT_MAX)},
                 {"root": _F32_SUM | 1 << 16}, {"count": 6}, {"dst_len": 8}, {"flags": 1},
                 {"src_addr": 0}, {"dst_addr": 0}]


@pytest.fixture
def fw_reduce(request, monkeypatch):
    """fw, with small allreduces eager (allreduce_eager.c) or not (allreduce.c)."""
    if request.param == "rendezvous":
        monkeypatch.setenv("OFFLOAD_EAGER_MAX", "0")
    yield from _one_rank_job()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fw_reduce,over",
                         [("eager", o) for o in _FORGED_WORDS] +
                         [("rendezvous", o) for o in _FORGED_WORDS +
                          [{"aux_addr": 0}, {"aux_len": 8, "aux_key": 0}]],
                         indirect=["fw_reduce"])
def test_firmware_refuses_forged_reductions(fw_reduce, over):
    """Bad op/dtype words, sizes, addresses, scratch or flags: an error completion, nothing
    written, on either allreduce (the eager one reduces in its slots: no scratch to forge)."""
    _, h, regs = fw_reduce
    src = np.arange(16, dtype=np.float32)
    dst = np.full(16, -1.0, np.float32)
    scratch = np.zeros(16, np.float32)
    fields = dict(opcode=lib.OFFLOAD_OP_ALLREDUCE, team=0, root=_F32_SUM, count=src.nbytes,
                  src_addr=addr(src), src_len=src.nbytes, dst_addr=addr(dst), dst_len=dst.nbytes,
                  aux_addr=addr(scratch), aux_len=scratch.nbytes,
                  aux_key=regs.acquire(scratch, SRC_ACCESS | DST_ACCESS))
    assert run_op(h, make_op(**fields)).status == OK  # control: a 1-rank allreduce
    assert np.array_equal(dst, src)
    dst[:] = -1.0
    comp = run_op(h, make_op(**{**fields, **over}))
    assert comp.status == ERR_INVALID, (over, comp.status)
    assert (dst == -1.0).all(), "a refused reduction wrote dst"
    assert run_op(h, make_op(opcode=OP_BARRIER, team=0)).status == OK  # still usable
