"""Validate and encode: each collective's arguments checked and turned into a Command (the
struct host_op to post, what keeps its memory alive, how its completion reads) before
anything is posted. Team (team.py) submits these; the GPU stager (_staging.py) encodes the
host halves of staged ops with them too.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from offload_lib._buffers import Buffer, as_buffer
from offload_lib._native import ffi, lib
from offload_lib.errors import InvalidArgument, brief
from offload_lib.request import McastStats, Result

if TYPE_CHECKING:
    from offload_lib.team import Team

MAX_COUNT = 2**62  # elements; counts*itemsize must stay far from uint64 overflow
_OP = ffi.typeof("struct host_op *")  # looked up once: a small op costs a few microseconds


class Command(NamedTuple):
    """One encoded collective."""

    op: Any                      # struct host_op *
    what: str                    # its name in errors
    bufs: tuple[Buffer, Buffer]  # (src, dst): GPU ones go through the stager
    staged: Callable[[Any], Any] | None  # the op staged through host memory (stager -> op)
    keep: tuple[Any, ...] = ()   # alive until completion (arguments, counters)
    result: Result | None = None  # what wait() returns, from the completion
    nbytes: int = 0              # bytes per rank: small ops are driven and polled
    itemsize: int | None = None  # sizes in errors in elements of this many bytes


# NamedTuple's own __new__ handles defaults at several times the cost of building the
# tuple: the all-to-all, the small op whose every microsecond shows, builds it directly.
_new_command = tuple.__new__


def new_op(opcode: int, team: Team) -> Any:
    op = ffi.new(_OP)
    op.opcode = opcode
    op.team = team.id
    return op


def src_dst(src: Any, dst: Any, own_block: int | None = None) -> tuple[Buffer, Buffer]:
    """Both buffers of an exchange, checked: same dtype, dst writable, no overlap (but for
    an in-place all-gather's src, exactly block ``own_block`` of dst)."""
    s = as_buffer(src, writable=False, name="src")
    d = as_buffer(dst, writable=True, name="dst")
    if s.dtype != d.dtype or s.itemsize != d.itemsize:
        raise InvalidArgument(f"src is {s.dtype_name} but dst is {d.dtype_name}: use the same dtype")
    if s.overlaps(d) and (own_block is None or s.addr != d.addr + own_block * s.nbytes):
        raise InvalidArgument("src and dst overlap: in-place exchanges are not supported")
    return s, d


def _mcast_stats(op: Any) -> tuple[np.ndarray, Result]:
    """Where a multicast op's firmware leaves its counters (the command's aux buffer, which
    host_post registers), and the result that reads them at completion."""
    words = np.zeros(McastStats.WORDS, np.uint64)
    op.aux_addr, op.aux_len = words.ctypes.data, words.nbytes
    return words, lambda _: McastStats.from_words(words)


def _word(struct: str, field: str) -> int:
    """The uint64 word at which field lies in struct (offload_abi.h)."""
    return ffi.offsetof(struct, field) // 8


# struct offload_alltoallv_args, as uint64 words: the header, then send, recv (out) and
# expect, n words each (offload_a2av_args_bytes(n) bytes in all)
_ARGS = "struct offload_alltoallv_args"
_ARGS_WORDS = ffi.sizeof(_ARGS) // 8
_NRANKS = _word(_ARGS, "nranks")  # the low half of its word (little endian), resv0 above
_ROWS_ADDR, _ROW_BYTES, _SLOT_BYTES, _PLACE_ADDR = (_word(_ARGS, f) for f in
                                                    ("rows_addr", "row_bytes", "slot_bytes",
                                                     "place_addr"))


def _send(n: int) -> slice:
    return slice(_ARGS_WORDS, _ARGS_WORDS + n)


def _recv(n: int) -> slice:
    return slice(_ARGS_WORDS + n, _ARGS_WORDS + 2 * n)


def _expect(n: int) -> slice:
    return slice(_ARGS_WORDS + 2 * n, _ARGS_WORDS + 3 * n)


def _alltoallv_op(team: Team, s: Buffer, d: Buffer, send_bytes: np.ndarray,
                  rows: np.ndarray | None = None, place: np.ndarray | None = None
                  ) -> tuple[Any, np.ndarray]:
    """The command and its struct offload_alltoallv_args (rows_addr, row_bytes, slot_bytes,
    place_addr, nranks; then send, recv (out) and expect bytes per rank) as one uint64
    array that lives until completion; the row lists (uint32) follow the arrays in the same
    array, so that the one registration host_post makes for the arguments covers them too."""
    n = team.size
    lists = [(_ROWS_ADDR, rows), (_PLACE_ADDR, place)]
    words = [0 if a is None else (a.size + 1) // 2 for _, a in lists]
    head = int(lib.offload_a2av_args_bytes(n)) // 8
    args = np.zeros(head + sum(words), np.uint64)
    args[_NRANKS] = n
    args[_send(n)] = send_bytes
    at = head
    for (field, arr), nwords in zip(lists, words):
        if arr is not None and arr.size:
            args[at:at + nwords].view(np.uint32)[:arr.size] = arr
            args[field] = args.ctypes.data + at * 8
        at += nwords
    op = ffi.new(_OP)
    op.opcode = lib.OFFLOAD_OP_ALLTOALLV
    op.team = team.id
    op.src_addr, op.src_len, op.count = s.addr, s.nbytes, s.nbytes
    op.dst_addr, op.dst_len = d.addr, d.nbytes
    op.aux_addr, op.aux_len = args.ctypes.data, args.nbytes
    return op, args


def _row_op(team: Team, s: Buffer, d: Buffer, per_rank: np.ndarray, row_bytes: int, flag: int,
            rows: np.ndarray | None = None, place: np.ndarray | None = None
            ) -> tuple[Any, np.ndarray, Result]:
    """A rows or placed all-to-all-v command, its args, and its result: the rows received
    from each rank (int64)."""
    op, args = _alltoallv_op(team, s, d, per_rank * row_bytes, rows, place)
    args[_ROW_BYTES] = row_bytes
    op.flags |= flag
    n = team.size

    def received(_: Any) -> np.ndarray:
        return (args[_recv(n)] // row_bytes).astype(np.int64)

    return op, args, received


def _row_index(obj: Any, name: str, size: int, bound: int | None, what: str) -> np.ndarray:
    """A 1-D integer row list of ``size`` entries, each in [0, bound) (or [0, 2**32))."""
    index = np.asarray(obj)
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise InvalidArgument(f"{name} must be a 1-D array of integer row indices")
    if index.size != size:
        raise InvalidArgument(f"{name} holds {index.size} indices but rows_per_rank adds up to {size}")
    limit = bound if bound is not None else 1 << 32
    if index.size and (int(index.min()) < 0 or int(index.max()) >= limit):
        raise InvalidArgument(f"{name} must index {what}")
    return index


def integer(value: Any, name: str) -> int:
    """``value`` as an int, if it is one (numpy integers too; not bool, float or str)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name} must be an integer, got {brief(value)}")
    return int(value)


def dtype_of(dtype: Any) -> np.dtype:
    """A numpy dtype of plain numbers or bytes, or InvalidArgument saying why not."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"dtype {brief(dtype)} is not a numpy dtype: {e}") from None
    if dt.hasobject:
        raise InvalidArgument(f"dtype {dt} holds Python objects: shared buffers hold plain "
                              "numbers or bytes")
    return dt


def list_fp(ranks: Sequence[int]) -> int:
    """A member list's fingerprint, order included (create_team's agreement compares it)."""
    return zlib.crc32(np.asarray(ranks, np.uint32).tobytes()) or 1


def counts(given: Any, n: int, name: str) -> np.ndarray:
    """Per-rank element counts as int64, checked: n of them, integers, none negative."""
    try:
        arr = np.asarray(given)
    except Exception:
        raise InvalidArgument(f"{name} must be a sequence of {n} integers") from None
    if arr.shape != (n,):
        raise InvalidArgument(f"{name} must hold one count per team rank: {n}, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"{name} must be integers, not {arr.dtype}")
    values = arr.tolist()  # Python ints: no wrap-around in the checks below
    if any(v < 0 for v in values):
        raise InvalidArgument(f"{name} has a negative count: {values}")
    if sum(values) > MAX_COUNT:
        raise InvalidArgument(f"{name} add up to {sum(values)} elements: more than any buffer holds")
    return arr.astype(np.int64)


def _staging() -> Any:
    from offload_lib import _staging as staging  # it encodes with this module too

    return staging


# -- the collectives ------------------------------------------------------------------------

def alltoall_bufs(team: Team, src: Any, dst: Any) -> tuple[Buffer, Buffer]:
    s, d = src_dst(src, dst)
    if s.nbytes != d.nbytes:
        raise InvalidArgument(
            f"src has {s.count} elements but dst has {d.count}: all-to-all needs equal sizes")
    if s.count % team.size:
        raise InvalidArgument(f"{s.count} elements do not split evenly over {team.size} ranks: "
                              f"use a multiple of {team.size}")
    return s, d


def alltoall_op(team: Team, s: Buffer, d: Buffer) -> Any:
    op = new_op(lib.OFFLOAD_OP_ALLTOALL, team)
    op.src_addr, op.src_len = s.addr, s.nbytes
    op.dst_addr, op.dst_len = d.addr, d.nbytes
    op.count = s.nbytes // team.size
    return op


def alltoall(team: Team, src: Any, dst: Any) -> Command:
    s, d = alltoall_bufs(team, src, dst)
    return _new_command(Command, (alltoall_op(team, s, d), "alltoall", (s, d),
                                  lambda g: _staging().alltoall(g, team, s, d), (), None,
                                  s.nbytes, None))


def alltoallv(team: Team, src: Any, send_counts: Any, dst: Any, recv_counts: Any = None,
              slot: int | None = None) -> Command:
    n = team.size
    s, d = src_dst(src, dst)
    sends = counts(send_counts, n, "send_counts")
    if sum(sends.tolist()) > s.count:
        raise InvalidArgument(
            f"send_counts add up to {sum(sends.tolist())} elements but src holds {s.count}")
    op, args = _alltoallv_op(team, s, d, sends * s.itemsize)
    if slot is not None:
        if recv_counts is not None:
            raise InvalidArgument("recv_counts cannot be checked in slot mode: pass one or the other")
        slot = integer(slot, "slot")
        if slot < 0 or n * slot > d.count:
            raise InvalidArgument(
                f"slot={slot} needs dst to hold {n} x {slot} elements; it holds {d.count}")
        if any(c > slot for c in sends.tolist()):
            raise InvalidArgument(f"send_counts {sends.tolist()} must each fit a slot of {slot}")
        args[_SLOT_BYTES] = slot * s.itemsize
        op.flags |= lib.OFFLOAD_CMD_F_SLOTS
    if recv_counts is not None:
        expect = counts(recv_counts, n, "recv_counts")
        if sum(expect.tolist()) > d.count:
            raise InvalidArgument(
                f"recv_counts add up to {sum(expect.tolist())} elements but dst holds {d.count}")
        args[_expect(n)] = expect * s.itemsize
        op.flags |= lib.OFFLOAD_CMD_F_EXPECT
    itemsize = s.itemsize

    def received(_: Any) -> np.ndarray:
        return (args[_recv(n)] // itemsize).astype(np.int64)

    return Command(op, "alltoallv", (s, d),
                   lambda g: _staging().alltoallv(g, team, s, d, sends, recv_counts, slot),
                   (args,), received, s.nbytes, itemsize)


def alltoallv_rows(team: Team, src: Any, rows: Any, rows_per_rank: Any, dst: Any) -> Command:
    shape = getattr(src, "shape", None)
    if shape is None or len(shape) != 2:
        raise InvalidArgument("src must be a 2-D table of rows (e.g. a [tokens, hidden] array)")
    s, d = src_dst(src, dst)
    table_rows, row_elems = int(shape[0]), int(shape[1])
    if row_elems == 0:
        raise InvalidArgument("rows have no elements: gathering needs rows of at least one")
    per_rank = counts(rows_per_rank, team.size, "rows_per_rank")
    index = _row_index(rows, "rows", sum(per_rank.tolist()), table_rows,
                       f"src's {table_rows} rows")
    row_bytes = row_elems * s.itemsize
    op, args, received = _row_op(team, s, d, per_rank, row_bytes, lib.OFFLOAD_CMD_F_ROWS,
                                 rows=index)
    return Command(op, "alltoallv_rows", (s, d),
                   lambda g: _staging().alltoallv_rows(g, team, s, (table_rows, row_elems),
                                                       index, per_rank, d),
                   (args,), received, int(index.size) * row_bytes, s.itemsize)


def alltoallv_place(team: Team, src: Any, rows_per_rank: Any, dst: Any, place: Any) -> Command:
    for name, arr in (("src", src), ("dst", dst)):
        shape = getattr(arr, "shape", None)
        if shape is None or len(shape) != 2:
            raise InvalidArgument(f"{name} must be a 2-D table of rows (e.g. [tokens, hidden])")
    if int(src.shape[1]) != int(dst.shape[1]):
        raise InvalidArgument(f"src rows have {src.shape[1]} elements but dst rows "
                              f"{dst.shape[1]}: use the same row size")
    if int(src.shape[1]) == 0:
        raise InvalidArgument("rows have no elements: placing needs rows of at least one")
    s, d = src_dst(src, dst)
    if d.on_gpu:
        raise InvalidArgument("dst must be host memory: placed rows land by index in a "
                              "registered host table (src may be on the GPU)")
    per_rank = counts(rows_per_rank, team.size, "rows_per_rank")
    nrows = sum(per_rank.tolist())
    if nrows > int(src.shape[0]):
        raise InvalidArgument(f"rows_per_rank adds up to {nrows} rows but src holds "
                              f"{int(src.shape[0])}")
    index = _row_index(place, "place", nrows, None, "dst rows (0 <= place < 2**32)")
    row_bytes = int(src.shape[1]) * s.itemsize
    op, args, received = _row_op(team, s, d, per_rank, row_bytes, lib.OFFLOAD_CMD_F_PLACE,
                                 place=index)
    src_shape, dst_shape = tuple(src.shape), tuple(dst.shape)
    return Command(op, "alltoallv_place", (s, d),
                   lambda g: _staging().alltoallv_place(g, team, s, src_shape, per_rank, d,
                                                        dst_shape, index),
                   (args,), received, nrows * row_bytes, s.itemsize)


def broadcast(team: Team, buf: Any, root: int) -> Command:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= int(root) < team.size:
        raise InvalidArgument(f"root must be a team rank from 0 to {team.size - 1}, got {brief(root)}")
    root = int(root)
    b = as_buffer(buf, writable=team.rank != root, name="buf")
    op = new_op(lib.OFFLOAD_OP_BROADCAST, team)
    op.root = root
    op.count = b.nbytes
    # Read on the root (injected, and read again by receivers that lost chunks), written
    # elsewhere: host_post registers it both ways.
    op.src_addr, op.src_len = b.addr, b.nbytes
    op.dst_addr, op.dst_len = b.addr, b.nbytes
    words, result = _mcast_stats(op)
    # The firmware counts a broadcast as count x team size (every member's copy); the wait
    # polls only below the same bound, as polling through a bulk op takes the CPU its
    # receivers copy with.
    return Command(op, "broadcast", (b, b), lambda g: _staging().broadcast(g, team, b, root),
                   (words,), result, b.nbytes * team.size)


def allgather(team: Team, src: Any, dst: Any) -> Command:
    s, d = src_dst(src, dst, own_block=team.rank)
    if d.nbytes != s.nbytes * team.size:
        raise InvalidArgument(f"dst has {d.count} elements but all-gather needs src's {s.count}"
                              f" x {team.size} ranks = {s.count * team.size}")
    op = new_op(lib.OFFLOAD_OP_ALLGATHER, team)
    op.count = s.nbytes
    op.src_addr, op.src_len = s.addr, s.nbytes
    op.dst_addr, op.dst_len = d.addr, d.nbytes
    words, result = _mcast_stats(op)
    return Command(op, "allgather", (s, d), lambda g: _staging().allgather(g, team, s, d),
                   (words,), result, d.nbytes)
