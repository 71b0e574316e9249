"""Context and Team: the user-facing objects that post collectives to the DPA."""
from __future__ import annotations

import errno
import math
import os
import threading
import warnings
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from offload_lib import _reduce, _staging
from offload_lib._buffers import Buffer, as_buffer
from offload_lib._native import ffi, lib
from offload_lib.bootstrap import World, allgather
from offload_lib.config import MAX_RAILS, Config, parse_rail_faults
from offload_lib.errors import ConfigError, InvalidArgument, OffloadError, Unsupported, check_rc
from offload_lib.request import McastStats, PersistentRequest, Request, Result

# enum offload_opcode (offload_abi.h)
OP_BARRIER = 2
OP_ALLTOALL = 3
OP_ALLTOALLV = 4
OP_BROADCAST = 6
OP_ALLGATHER = 7
OP_AGREE = 8
F_EXPECT = 1  # OFFLOAD_CMD_F_EXPECT
F_ROWS = 2  # OFFLOAD_CMD_F_ROWS
F_SLOTS = 4  # OFFLOAD_CMD_F_SLOTS
F_PLACE = 8  # OFFLOAD_CMD_F_PLACE

# access bits (offload_abi.h)
_LOCAL_READ, _LOCAL_WRITE, _REMOTE_READ, _REMOTE_WRITE = 1, 2, 4, 8
SRC_ACCESS = _LOCAL_READ | _REMOTE_READ
DST_ACCESS = _LOCAL_READ | _LOCAL_WRITE | _REMOTE_WRITE

# Ops this small are driven by the calling thread (cooperative progress), or else waited
# for spinning briefly before sleeping: a wake-up costs tens of microseconds here, which
# only small ops notice, while spinning through a long op would take the CPU that
# offloading is meant to free.
_SMALL_MAX_BYTES = 1024 * 1024

_MAX_COUNT = 2**62  # elements; counts*itemsize must stay far from uint64 overflow

# cffi types looked up once: a small op's whole call costs a few microseconds
_OP = ffi.typeof("struct host_op *")
_TAG = ffi.typeof("uint32_t *")

MAX_TEAMS = 16
MAX_RANKS = 64

_STAT_FIELDS = ("ops_completed", "bytes_written", "writes", "signals", "reads", "errors",
                "progress_calls", "idle_calls", "failovers", "resent_bytes", "mcast_chunks_sent",
                "mcast_bytes_sent", "mcast_chunks_recv", "mcast_dups", "refetch_chunks",
                "refetch_bytes")
_STAT_WORDS = 16  # struct offload_thread_stats: the fields above, then reserved words


@ffi.def_extern()
def offload_allgather(arg: Any, mine: Any, length: int, out: Any) -> int:
    """host_device_attr.allgather for hardware backends: the bootstrap's allgather."""
    try:
        ctx = ffi.from_handle(arg)
        parts = allgather(ctx._world, bytes(ffi.buffer(mine, length)),
                          ctx.config.bootstrap_timeout)
        if any(len(p) != length for p in parts):
            return -errno.EPROTO
        ffi.memmove(out, b"".join(parts), length * len(parts))
        return 0
    except Exception as e:  # an exception must not unwind through C
        warnings.warn(f"bootstrap allgather failed: {e}", RuntimeWarning, stacklevel=1)
        return -errno.EIO


def _backend_load_error(path: str) -> str:
    """Why the host could not use the backend library at path, in the loader's words."""
    import ctypes

    try:
        ctypes.CDLL(path)
    except OSError as e:
        return f"loading the backend library {path} failed: {e}"
    return (f"loading the backend library {path} failed: it has no dpaoffload_flexio_ops "
            "(is it dpa-offload's FlexIO backend? build it with scripts/build_flexio.sh)")


def _rail_thresholds(config: Config, rank: int) -> list[int]:
    """Bytes after which each of this rank's rails fails (rail_faults), 2**64-1 for never."""
    never = 2**64 - 1
    out = [never] * MAX_RAILS
    for who, rail, after in parse_rail_faults(config.rail_faults):
        if rail >= config.rails:
            raise ConfigError(f"rail_faults names rail {rail} but rails is {config.rails}; "
                              f"rails are numbered 0..{config.rails - 1}")
        if who is None or who == rank:
            out[rail] = min(out[rail], after)
    return out


def _flexio_library(config: Config, rank: int) -> str:
    """The FlexIO backend library to load; on the FlexIO model, built if needed, and the
    model's NIC told which of this rank's ports fail (rail_faults) and how many it has."""
    from offload_lib.discovery import backend_library_path

    if config.flexio_runtime != "model":
        return backend_library_path(config)
    from offload_lib.flexio_runtime import build_model

    never = 2**64 - 1
    faults = [f"{r}@{after}" for r, after in enumerate(_rail_thresholds(config, rank))
              if after != never]
    os.environ["OFFLOAD_FXM_PORT_FAULTS"] = ",".join(faults)
    os.environ["FXM_PORTS"] = str(max(2, config.rails))
    return str(build_model())


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _resolve_threads(config: Config, ranks: int) -> int:
    if config.dpa_threads != "auto":
        return int(config.dpa_threads)
    # The emulator's DPA threads share the host's cores with every rank of the job.
    return max(1, min(4, _cores() // ranks))


def _src_dst(src: Any, dst: Any, own_block: int | None = None) -> tuple[Buffer, Buffer]:
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


_ARGS_WORDS = 3 * MAX_RANKS + 4
_ROWS_ADDR, _ROW_BYTES, _SLOT_BYTES, _PLACE_ADDR = (3 * MAX_RANKS + i for i in range(4))


def _alltoallv_op(team: Team, s: Buffer, d: Buffer, send_bytes: np.ndarray,
                  rows: np.ndarray | None = None, place: np.ndarray | None = None
                  ) -> tuple[Any, np.ndarray]:
    """The command and its struct offload_alltoallv_args (send_bytes, recv_bytes (out),
    expect_bytes, rows_addr, row_bytes, slot_bytes, place_addr) as one uint64 array that
    lives until completion; the row lists (uint32) follow the struct in the same array, so
    that the one registration host_post makes for the arguments covers them too."""
    lists = [(_ROWS_ADDR, rows), (_PLACE_ADDR, place)]
    words = [0 if a is None else (a.size + 1) // 2 for _, a in lists]
    args = np.zeros(_ARGS_WORDS + sum(words), np.uint64)
    args[:team.size] = send_bytes
    at = _ARGS_WORDS
    for (field, arr), nwords in zip(lists, words):
        if arr is not None and arr.size:
            args[at:at + nwords].view(np.uint32)[:arr.size] = arr
            args[field] = args.ctypes.data + at * 8
        at += nwords
    op = ffi.new(_OP)
    op.opcode = OP_ALLTOALLV
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
        return (args[MAX_RANKS:MAX_RANKS + n] // row_bytes).astype(np.int64)

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


def _integer(value: Any, name: str) -> int:
    """``value`` as an int, if it is one (numpy integers too; not bool, float or str)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    return int(value)


def _dtype(dtype: Any) -> np.dtype:
    """A numpy dtype of plain numbers or bytes, or InvalidArgument saying why not."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"dtype {dtype!r} is not a numpy dtype: {e}") from None
    if dt.hasobject:
        raise InvalidArgument(f"dtype {dt} holds Python objects: shared buffers hold plain "
                              "numbers or bytes")
    return dt


def _list_fp(ranks: Sequence[int]) -> int:
    """A member list's fingerprint, order included (create_team's agreement compares it)."""
    return zlib.crc32(np.asarray(ranks, np.uint32).tobytes()) or 1


def _counts(counts: Any, n: int, name: str) -> np.ndarray:
    """Per-rank element counts as int64, checked: n of them, integers, none negative."""
    try:
        arr = np.asarray(counts)
    except Exception:
        raise InvalidArgument(f"{name} must be a sequence of {n} integers") from None
    if arr.shape != (n,):
        raise InvalidArgument(f"{name} must hold one count per team rank: {n}, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise InvalidArgument(f"{name} must be integers, not {arr.dtype}")
    values = arr.tolist()  # Python ints: no wrap-around in the checks below
    if any(v < 0 for v in values):
        raise InvalidArgument(f"{name} has a negative count: {values}")
    if sum(values) > _MAX_COUNT:
        raise InvalidArgument(f"{name} add up to {sum(values)} elements: more than any buffer holds")
    return arr.astype(np.int64)


class Team:
    """An ordered group of ranks; ops on a team must be called in the same order by all."""

    def __init__(self, ctx: Context, team_id: int, ranks: Sequence[int]) -> None:
        self._ctx = ctx
        self.id = team_id
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(ctx.rank)
        self._barrier_op: Any = None

    def __repr__(self) -> str:
        return f"<Team id={self.id} rank={self.rank}/{self.size}>"

    # -- all-to-all -------------------------------------------------------------------------
    def _alltoall_args(self, src: Any, dst: Any) -> tuple[Buffer, Buffer]:
        s, d = _src_dst(src, dst)
        if s.nbytes != d.nbytes:
            raise InvalidArgument(
                f"src has {s.count} elements but dst has {d.count}: all-to-all needs equal sizes"
            )
        if s.count % self.size:
            raise InvalidArgument(
                f"{s.count} elements do not split evenly over {self.size} ranks: "
                f"use a multiple of {self.size}"
            )
        return s, d

    def _alltoall_op(self, s: Buffer, d: Buffer) -> Any:
        op = ffi.new(_OP)
        op.opcode = OP_ALLTOALL
        op.team = self.id
        op.src_addr, op.src_len = s.addr, s.nbytes
        op.dst_addr, op.dst_len = d.addr, d.nbytes
        op.count = s.nbytes // self.size
        return op

    def alltoall(self, src: Any, dst: Any) -> Request:
        """Post an all-to-all: block j of src goes to rank j, block i of dst comes from rank i."""
        self._ctx._check_open()
        s, d = self._alltoall_args(src, dst)
        # host_post registers both buffers for this op alone.
        return self._ctx._submit(self._alltoall_op(s, d), "alltoall", (s, d),
                                 lambda g: _staging.alltoall(g, self, s, d), nbytes=s.nbytes)

    def alltoall_init(self, src: Any, dst: Any) -> PersistentRequest:
        """A persistent all-to-all: registered once, then post()/wait() repeatedly."""
        ctx = self._ctx
        ctx._check_open()
        s, d = self._alltoall_args(src, dst)
        if s.on_gpu or d.on_gpu:
            raise InvalidArgument("persistent requests take host buffers: post GPU buffers "
                                  "with team.alltoall (staged and stream-ordered each time)")
        op = self._alltoall_op(s, d)
        keys: list[int] = []
        try:
            for buf, access, field in ((s, SRC_ACCESS, "src_key"), (d, DST_ACCESS, "dst_key")):
                key, owned = ctx._register(buf, access)
                setattr(op, field, key)
                if owned:
                    keys.append(key)
        except BaseException:
            for key in keys:
                lib.host_mr_release(ctx._handle(), key)
            raise
        return ctx._persistent(op, "alltoall", keys, (s.obj, d.obj), nbytes=s.nbytes)

    # -- all-to-all-v -----------------------------------------------------------------------
    def alltoallv(self, src: Any, send_counts: Any, dst: Any, recv_counts: Any = None,
                  slot: int | None = None) -> Request:
        """Post an all-to-all-v. ``src`` holds ``send_counts[j]`` elements for rank j, packed in
        rank order; the DPA exchanges the counts itself, and ``wait()`` returns the receive
        counts (numpy int64, one per source rank), the data packed by source rank in ``dst``.
        With ``recv_counts`` the arrivals are checked against it.

        With ``slot`` (low latency, for small batches; every rank passes the same value):
        ``dst`` holds one slot of ``slot`` elements per source rank and the data from rank s
        lands at ``dst[s*slot : s*slot + recv_counts[s]]``; there is no count round, and each
        send count must fit a slot."""
        ctx = self._ctx
        ctx._check_open()
        n = self.size
        s, d = _src_dst(src, dst)
        sends = _counts(send_counts, n, "send_counts")
        if sum(sends.tolist()) > s.count:
            raise InvalidArgument(
                f"send_counts add up to {sum(sends.tolist())} elements but src holds {s.count}"
            )
        op, args = _alltoallv_op(self, s, d, sends * s.itemsize)
        if slot is not None:
            if recv_counts is not None:
                raise InvalidArgument("recv_counts cannot be checked in slot mode: pass one or the other")
            slot = _integer(slot, "slot")
            if slot < 0 or n * slot > d.count:
                raise InvalidArgument(
                    f"slot={slot} needs dst to hold {n} x {slot} elements; it holds {d.count}"
                )
            if any(c > slot for c in sends.tolist()):
                raise InvalidArgument(f"send_counts {sends.tolist()} must each fit a slot of {slot}")
            args[_SLOT_BYTES] = slot * s.itemsize
            op.flags |= F_SLOTS
        if recv_counts is not None:
            expect = _counts(recv_counts, n, "recv_counts")
            if sum(expect.tolist()) > d.count:
                raise InvalidArgument(
                    f"recv_counts add up to {sum(expect.tolist())} elements but dst holds {d.count}"
                )
            args[2 * MAX_RANKS:2 * MAX_RANKS + n] = expect * s.itemsize
            op.flags |= F_EXPECT
        itemsize = s.itemsize

        def received(_: Any) -> np.ndarray:
            return (args[MAX_RANKS:MAX_RANKS + n] // itemsize).astype(np.int64)

        return ctx._submit(op, "alltoallv", (s, d),
                           lambda g: _staging.alltoallv(g, self, s, d, sends, recv_counts, slot),
                           (args,), received, nbytes=s.nbytes, itemsize=itemsize)

    def alltoallv_rows(self, src: Any, rows: Any, rows_per_rank: Any, dst: Any) -> Request:
        """All-to-all-v of table rows, gathered by the DPA (MoE dispatch): ``src`` is a 2-D
        table [R, row]; rank j gets rows ``src[rows[k]]`` for the next ``rows_per_rank[j]``
        k's, in order (a row may go to several ranks). Arrivals are packed by source rank in
        ``dst``; ``wait()`` returns the rows received from each rank (numpy int64). The host
        never copies the rows into a send buffer."""
        ctx = self._ctx
        ctx._check_open()
        n = self.size
        shape = getattr(src, "shape", None)
        if shape is None or len(shape) != 2:
            raise InvalidArgument("src must be a 2-D table of rows (e.g. a [tokens, hidden] array)")
        s, d = _src_dst(src, dst)
        table_rows, row_elems = int(shape[0]), int(shape[1])
        if row_elems == 0:
            raise InvalidArgument("rows have no elements: gathering needs rows of at least one")
        per_rank = _counts(rows_per_rank, n, "rows_per_rank")
        index = _row_index(rows, "rows", sum(per_rank.tolist()), table_rows,
                           f"src's {table_rows} rows")
        row_bytes = row_elems * s.itemsize
        op, args, received = _row_op(self, s, d, per_rank, row_bytes, F_ROWS, rows=index)
        return ctx._submit(op, "alltoallv_rows", (s, d),
                           lambda g: _staging.alltoallv_rows(g, self, s, (table_rows, row_elems),
                                                             index, per_rank, d),
                           (args,), received, nbytes=int(index.size) * row_bytes,
                           itemsize=s.itemsize)

    def alltoallv_place(self, src: Any, rows_per_rank: Any, dst: Any, place: Any) -> Request:
        """All-to-all-v of rows that land where the receivers want them (MoE combine), the
        mirror of ``alltoallv_rows``: ``src`` [R, row] sends its rows in order, the next
        ``rows_per_rank[j]`` to rank j, and the k-th of them lands at row ``place[k]`` of
        rank j's ``dst`` [D, row] (every rank calls this, with the same row size). Rows
        nobody places keep their contents. The DPA writes each row where it belongs, so the
        receiving host scatters nothing; a row outside rank j's table fails the op on both
        sides before anything is written. Two rows placed at the same row (by one sender or
        by several) land in no defined order. ``wait()`` returns the rows received from each
        rank (numpy int64)."""
        ctx = self._ctx
        ctx._check_open()
        n = self.size
        for name, arr in (("src", src), ("dst", dst)):
            shape = getattr(arr, "shape", None)
            if shape is None or len(shape) != 2:
                raise InvalidArgument(f"{name} must be a 2-D table of rows (e.g. [tokens, hidden])")
        if int(src.shape[1]) != int(dst.shape[1]):
            raise InvalidArgument(f"src rows have {src.shape[1]} elements but dst rows "
                                  f"{dst.shape[1]}: use the same row size")
        if int(src.shape[1]) == 0:
            raise InvalidArgument("rows have no elements: placing needs rows of at least one")
        s, d = _src_dst(src, dst)
        if d.on_gpu:
            raise InvalidArgument("dst must be host memory: placed rows land by index in a "
                                  "registered host table (src may be on the GPU)")
        per_rank = _counts(rows_per_rank, n, "rows_per_rank")
        nrows = sum(per_rank.tolist())
        if nrows > int(src.shape[0]):
            raise InvalidArgument(f"rows_per_rank adds up to {nrows} rows but src holds "
                                  f"{int(src.shape[0])}")
        index = _row_index(place, "place", nrows, None, "dst rows (0 <= place < 2**32)")
        row_bytes = int(src.shape[1]) * s.itemsize
        op, args, received = _row_op(self, s, d, per_rank, row_bytes, F_PLACE, place=index)
        return ctx._submit(op, "alltoallv_place", (s, d),
                           lambda g: _staging.alltoallv_place(g, self, s, tuple(src.shape),
                                                              per_rank, d, tuple(dst.shape),
                                                              index),
                           (args,), received, nbytes=nrows * row_bytes, itemsize=s.itemsize)

    # -- multicast --------------------------------------------------------------------------
    def broadcast(self, buf: Any, root: int = 0) -> Request:
        """Post a broadcast of ``buf`` from team rank ``root`` to every rank's ``buf`` (same
        size and dtype everywhere). The root's DPA multicasts each MTU chunk once; receivers
        reassemble by chunk id and fetch lost chunks from the root."""
        self._ctx._check_open()
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
                not 0 <= int(root) < self.size:
            raise InvalidArgument(f"root must be a team rank from 0 to {self.size - 1}, got {root!r}")
        root = int(root)
        b = as_buffer(buf, writable=self.rank != root, name="buf")
        op = ffi.new(_OP)
        op.opcode = OP_BROADCAST
        op.team = self.id
        op.root = root
        op.count = b.nbytes
        # Read on the root (injected, and read again by receivers that lost chunks), written
        # elsewhere: host_post registers it both ways for this op.
        op.src_addr, op.src_len = b.addr, b.nbytes
        op.dst_addr, op.dst_len = b.addr, b.nbytes
        words, result = _mcast_stats(op)
        # The firmware counts a broadcast as count x team size (every member's copy); the
        # wait polls only below the same bound, as polling through a bulk op takes the CPU
        # its receivers copy with.
        return self._ctx._submit(op, "broadcast", (b, b),
                                 lambda g: _staging.broadcast(g, self, b, root),
                                 keep=(words,), result=result, nbytes=b.nbytes * self.size)

    def allgather(self, src: Any, dst: Any) -> Request:
        """Post an all-gather: block i of ``dst`` (``src.size`` elements) comes from rank i.
        Each rank multicasts its block once. In place (as NCCL's): ``src`` may be this
        rank's own block of ``dst``, which is then not copied."""
        self._ctx._check_open()
        s, d = _src_dst(src, dst, own_block=self.rank)
        if d.nbytes != s.nbytes * self.size:
            raise InvalidArgument(
                f"dst has {d.count} elements but all-gather needs src's {s.count} x "
                f"{self.size} ranks = {s.count * self.size}"
            )
        op = ffi.new(_OP)
        op.opcode = OP_ALLGATHER
        op.team = self.id
        op.count = s.nbytes
        op.src_addr, op.src_len = s.addr, s.nbytes
        op.dst_addr, op.dst_len = d.addr, d.nbytes
        words, result = _mcast_stats(op)
        return self._ctx._submit(op, "allgather", (s, d),
                                 lambda g: _staging.allgather(g, self, s, d),
                                 keep=(words,), result=result, nbytes=d.nbytes)

    # -- reductions (offload_lib/_reduce.py, docs/reductions.md) -----------------------------
    def reduce_scatter(self, src: Any, dst: Any, op: str = "sum") -> Request:
        """Post a reduce-scatter: ``dst`` (``src.size / team size`` elements) gets block
        ``team.rank`` of the reduction of every rank's ``src``; ``op`` is one of sum, avg,
        prod, max, min; dtypes float32, float64, float16, bfloat16, int32, int64. The DPA
        threads reduce, in a fixed order (runs repeat bit for bit; equal to gloo's). In
        place: ``dst`` may be this rank's own block of ``src``."""
        self._ctx._check_open()
        s, d = _reduce.check_reduce_scatter(self, src, dst)
        word = _reduce.redop_word(op, s)
        return _reduce.post(self, _reduce.OP_REDUCE_SCATTER, s, d, word, "reduce_scatter")

    def allreduce(self, buf: Any, op: str = "sum", *, out: Any = None) -> Request:
        """Post an allreduce of every rank's ``buf``: in place, or into ``out`` (same size
        and dtype). Ops and dtypes as reduce_scatter; the same fixed order."""
        self._ctx._check_open()
        s, d = _reduce.check_allreduce(buf, out)
        word = _reduce.redop_word(op, s)
        return _reduce.post(self, _reduce.OP_ALLREDUCE, s, d, word, "allreduce")

    # -- shrink -----------------------------------------------------------------------------
    def shrink(self) -> Team:
        """This team without its members that failed or closed (ULFM's MPI_Comm_shrink):
        collective over the live members, which all get the same new team (same members,
        same order, same id) whatever each one knew of the failures and whenever it calls;
        a member that fails during the call changes nothing. Works on a team whose ops fail
        since a member died."""
        ctx = self._ctx
        ctx._check_open()
        mine = sum(1 << r for r in self.ranks)
        failed, team_id, _ = ctx._agree(self, ctx._gone_mask() & mine, ctx._next_team,
                                        _list_fp(self.ranks), "shrink")
        survivors = [r for r in self.ranks if not failed >> r & 1]
        return ctx._make_team(ctx._new_team_id(team_id), survivors)

    # -- barrier ----------------------------------------------------------------------------
    def barrier(self) -> Request:
        self._ctx._check_open()
        op = self._barrier_op
        if op is None:  # the same command every time (host_post copies it)
            op = self._barrier_op = ffi.new(_OP)
            op.opcode = OP_BARRIER
            op.team = self.id
        return self._ctx._post(op, "barrier", ())


class Context:
    """One rank's connection to its (emulated or real) DPA. Close it, or use ``with``."""

    def __init__(self, config: Config, world: World, backend: str) -> None:
        self.config = config
        self.rank = world.rank
        self.size = world.size
        self.backend = backend
        self.job = world.job
        self.launcher = world.launcher  # "dpa-offload", "mpi" or "single"
        self._lock = threading.Lock()
        self._orphans: dict[int, tuple[Any, ...]] = {}
        self._persistents: weakref.WeakSet[PersistentRequest] = weakref.WeakSet()
        self._next_team = 1
        self._stager: _staging.Stager | None = None  # made when a GPU buffer first shows up
        # multicast faults this rank's NIC injects now (set_mcast_faults changes them)
        self._mcast_faults = (config.mcast_loss, config.mcast_reorder)
        # The host context. It stays valid after close() (every call into it then answers
        # -ESHUTDOWN) and is freed with this object, so that threads that read it before a
        # close() from another thread never touch freed memory (host_ctx_shutdown).
        self._ptr: Any = None
        self._closed = True  # until the device is open
        self._close_lock = threading.Lock()
        self._shut = threading.Event()  # set once the device stopped (close() returned)
        params = ffi.new("struct host_ctx_params *")
        job_c = ffi.new("char[]", world.job.encode())
        backend_c = ffi.new("char[]", backend.encode())
        params.job, params.backend = job_c, backend_c
        lib_c = ffi.NULL
        if backend != "emulator":
            lib_c = ffi.new("char[]", _flexio_library(config, world.rank).encode())
        params.backend_lib = lib_c
        params.rank, params.size = world.rank, world.size
        params.num_threads = self.dpa_threads = _resolve_threads(config, world.size)
        self.progress = config.progress if backend == "emulator" else "threads"
        params.coop = self.progress == "cooperative"
        # The emulator spins only while every awake thread of the job has a core; a host
        # thread that waits on the completion ring (threads mode) spins as long, then sleeps.
        params.spin_us = config.spin_us
        self._poll_ns = config.spin_us * 1000
        params.eager_max = config.eager_max
        params.ring_entries = config.ring_entries
        params.chunk_size = config.chunk_size
        params.bootstrap_timeout_ns = int(config.bootstrap_timeout * 1e9)
        params.op_timeout_ms = int(round(config.op_timeout * 1000))
        # Hardware backends connect their queues through the bootstrap (see _allgather).
        self._world = world
        self._self_handle = ffi.new_handle(self)
        params.allgather = lib.offload_allgather
        params.allgather_arg = self._self_handle
        params.rails = config.rails
        params.mtu = config.mtu
        params.mcast_roots = config.mcast_roots
        params.mcast_rq_depth = config.mcast_rq_depth
        params.mcast_staged = config.mcast_placement == "staged"
        params.link_mbps = max(1, int(config.link_rate * 1000))
        params.mcast_loss_ppm = int(round(config.mcast_loss * 1e6))
        params.mcast_reorder_ppm = int(round(config.mcast_reorder * 1e6))
        params.mcast_seed = config.mcast_seed
        params.job_key = world.key64
        for r, after in enumerate(_rail_thresholds(config, world.rank)):
            params.rail_down_after[r] = after
        self._post_timeout_ns = int(config.post_timeout * 1e9)
        out = ffi.new("struct host_ctx **")
        rc = lib.host_ctx_open(params, out)
        what = f"opening the {backend} device for rank {world.rank}/{world.size} (job {world.job})"
        if rc in (-errno.ENOENT, -errno.ENOEXEC) and backend != "emulator":
            raise OffloadError(f"{what}: {_backend_load_error(ffi.string(lib_c).decode())}")
        if rc == -errno.EPROTO and backend != "emulator" and lib_c != ffi.NULL:
            raise OffloadError(f"{what}: the backend library {ffi.string(lib_c).decode()} was "
                               "built from other headers (another OFFLOAD_ABI_VERSION): rebuild "
                               "it with scripts/build_flexio.sh")
        if rc == -errno.EEXIST:
            raise OffloadError(f"{what}: job name in use: another job runs under "
                               f"OFFLOAD_JOB={world.job} (every job needs a name of its own: "
                               "dpa-offload run and mpirun make one)")
        if rc == -errno.EACCES:
            raise OffloadError(f"{what}: /dev/shm/{world.job} is not a private file of this "
                               "user (made by someone else?): refusing to use it")
        check_rc(rc, what)
        self._ptr = ffi.gc(out[0], lib.host_ctx_close)
        self._closed = False
        self.world = self._make_team(0, list(range(self.size)))

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise OffloadError("the context closed: open a new one with ol.init()")

    def _handle(self) -> Any:
        self._check_open()
        return self._ptr

    def _check(self, rc: int, what: str) -> None:
        """check_rc for calls on this context: one that ended because another thread
        closed it raises once the device stopped, so that the caller may free its buffers."""
        if rc == -errno.ESHUTDOWN:
            self._shut.wait(timeout=30)
        check_rc(rc, what)

    def close(self) -> None:
        """Stop the DPA threads and release everything; safe to call twice, and from any
        thread: calls waiting or posting in other threads raise OffloadError."""
        with self._close_lock:  # a second close() returns once the first is done
            if self._closed:
                return
            stager, self._stager = self._stager, None
            if stager is not None:
                stager.close()  # finishes the staged ops while the device is still open
            self._closed = True  # from here on, calls raise before entering the library
            for p in list(self._persistents):  # children first: they hold registrations
                p._freed = True
            lib.host_ctx_shutdown(self._ptr)  # wakes the threads inside, waits for them
            self._orphans.clear()
            self._shut.set()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"{self!r} was not closed", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Context rank={self.rank}/{self.size} backend={self.backend} {state}>"

    # -- teams ------------------------------------------------------------------------------
    def _make_team(self, team_id: int, ranks: list[int]) -> Team:
        arr = ffi.new("uint32_t[]", ranks)
        self._check(lib.host_team_create(self._handle(), team_id, len(ranks), arr,
                                         int(self.config.post_timeout * 1e9)),
                    f"creating team {team_id}")
        return Team(self, team_id, ranks)

    def _gone_mask(self) -> int:
        """World ranks known to have failed or closed, one bit each."""
        h = self._handle()
        return int(lib.host_failed_ranks(h)) | int(lib.host_closed_ranks(h))

    def _agree(self, team: Team, failed: int, value: int, fp: int, what: str
               ) -> tuple[int, int, int]:
        """Fault-tolerant agreement among team's live members (OFFLOAD_OP_AGREE): every one
        gets the same (failed ranks: the union of what each knew, and who was gone; value:
        the largest proposed; a member whose fp differed, or -1)."""
        args = np.zeros(4, np.uint64)  # struct offload_agree_args
        args[0], args[1] = failed, value
        args.view(np.uint32)[4] = fp
        op = ffi.new("struct host_op *")
        op.opcode = OP_AGREE
        op.team = team.id
        op.aux_addr, op.aux_len = args.ctypes.data, args.nbytes
        self._post(op, what, (args,)).wait()
        differs = int(args.view(np.uint32)[5])
        return int(args[0]), int(args[1]), differs - 1

    def _new_team_id(self, team_id: int) -> int:
        if team_id >= MAX_TEAMS:
            raise OffloadError(f"at most {MAX_TEAMS} teams (world included) can exist in a job")
        self._next_team = max(self._next_team, team_id + 1)
        return team_id

    def create_team(self, ranks: Sequence[int]) -> Team | None:
        """Collective over all live ranks (same list everywhere, in the same order); members
        get a Team, others None. The ranks agree on it first: a rank that passed another
        list makes it fail on every rank (InvalidArgument naming it)."""
        self._check_open()
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise InvalidArgument(f"team ranks must be a sequence of world ranks, got {ranks!r}")
        members = [_integer(r, "a team rank") for r in ranks]
        if not members or len(set(members)) != len(members):
            raise InvalidArgument(f"team ranks {members} must be non-empty and distinct")
        bad = [r for r in members if not 0 <= r < self.size]
        if bad:
            raise InvalidArgument(f"team ranks {bad} are outside the world (size {self.size})")
        _, team_id, differs = self._agree(self.world, self._gone_mask(), self._next_team,
                                          _list_fp(members), "create_team")
        if differs >= 0:
            raise InvalidArgument(
                f"create_team({members}): rank {differs} passed another member list (or the "
                "same members in another order); every rank must pass the same list")
        team_id = self._new_team_id(team_id)
        return self._make_team(team_id, members) if self.rank in members else None

    def shrink(self) -> Team:
        """The world without the ranks that failed or closed (ULFM's MPI_Comm_shrink): call
        it on every live rank after a PeerFailure; every one gets the same team, whatever
        each one knew of the failures and whenever it calls, and further failures during
        the call do not change that. Equivalent to ``ctx.world.shrink()``."""
        return self.world.shrink()

    # -- memory -----------------------------------------------------------------------------
    def _register(self, buf: Buffer, access: int) -> tuple[int, bool]:
        if buf.nbytes == 0:
            return 0, False
        key = ffi.new("uint32_t *")
        owned = ffi.new("int *")
        self._check(lib.host_mr_acquire(self._handle(), ffi.cast("void *", buf.addr), buf.nbytes,
                                     access, key, owned), "registering memory")
        return int(key[0]), bool(owned[0])

    def _release_key(self, key: int) -> None:
        if not self._closed:
            lib.host_mr_release(self._ptr, key)

    def empty(self, shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
        """A numpy array in registered job-shared memory: peers copy into it directly."""
        self._check_open()
        dt = _dtype(dtype)
        dims = [_integer(d, "a dimension of shape") for d in
                (shape if isinstance(shape, (tuple, list)) else [shape])]
        if any(d < 0 for d in dims):
            raise InvalidArgument(f"shape {shape!r} has a negative dimension")
        count = math.prod(dims)
        nbytes = count * dt.itemsize
        if nbytes > _MAX_COUNT:
            raise InvalidArgument(f"shape {shape!r} of {dt} is {nbytes} bytes: more than any "
                                  "buffer holds")
        addr = ffi.new("void **")
        key = ffi.new("uint32_t *")
        self._check(lib.host_alloc_shared(self._handle(), nbytes, addr, key),
                    "allocating shared memory")
        ref = weakref.ref(self)

        def release(ptr: Any) -> None:
            ctx = ref()
            handle = None if ctx is None else ctx._ptr  # closed: it only unmaps
            lib.host_free_shared(handle if handle is not None else ffi.NULL, ptr, nbytes)

        owner = ffi.gc(addr[0], release)
        return np.frombuffer(ffi.buffer(owner, nbytes), dtype=dt, count=count).reshape(shape)

    def _scratch(self) -> _reduce.ScratchPool:
        """The registered scratch the reductions' commands name (made on first use)."""
        with self._lock:
            pool = self.__dict__.get("_scratch_pool")
            if pool is None:
                pool = self._scratch_pool = _reduce.ScratchPool(self)
            return pool

    # -- posting ----------------------------------------------------------------------------
    def _gpu(self) -> _staging.Stager:
        """The stager GPU buffers go through: GPUDirect where the device registers dma-bufs
        (FlexIO), else staged through host memory (the emulator)."""
        with self._lock:
            if self._stager is None:
                from offload_lib import _cuda

                key = ffi.new("uint32_t *")
                # A probe that registers nothing: -EINVAL (fd -1) if supported, else
                # -EOPNOTSUPP.
                direct = lib.host_mr_acquire_dmabuf(self._handle(), 0, 0, -1, 0, key) != \
                    -errno.EOPNOTSUPP
                self._stager = _staging.Stager(self, _cuda.driver(), direct)
            return self._stager

    def _submit(self, op: Any, what: str, bufs: tuple[Buffer, Buffer], staged: Any,
                keep: tuple[Any, ...] = (), result: Result | None = None, nbytes: int = 0,
                itemsize: int | None = None) -> Any:
        """Post ``op`` on (src, dst) buffers; GPU memory goes through the stager: registered
        directly (GPUDirect), or ``staged(stager)`` through host memory."""
        keep = (bufs[0].obj, bufs[1].obj, *keep)
        if not (bufs[0].on_gpu or bufs[1].on_gpu):
            return self._post(op, what, keep, result, nbytes, itemsize)
        g = self._gpu()
        if g.direct:
            return g.direct_op(op, what, bufs, keep, result, itemsize)
        return staged(g)

    def _post(self, op: Any, what: str, keep: tuple[Any, ...], result: Result | None = None,
              nbytes: int = 0, itemsize: int | None = None) -> Request:
        tag = self._post_tag(op, what, nbytes, ffi.new(_TAG))
        return Request(self, tag, what, keep, result,
                       self._poll_ns if nbytes <= _SMALL_MAX_BYTES else 0, itemsize)

    def _post_tag(self, op: Any, what: str, nbytes: int, tagp: Any) -> int:
        """Post op (moving nbytes per rank) and return its tag."""
        if self._stager is not None:
            self._stager.drain()  # staged ops called earlier take their place in line first
        if self._orphans:
            self._reap_orphans()
        op.small = nbytes <= _SMALL_MAX_BYTES
        rc = lib.host_post(self._handle(), op, self._post_timeout_ns, tagp)
        if rc:
            self._check(rc, f"posting {what}")
        return int(tagp[0])

    def _persistent(self, op: Any, what: str, keys: list[int], keep: tuple[Any, ...],
                    result: Result | None = None, nbytes: int = 0) -> PersistentRequest:
        p = PersistentRequest(self, what, op, keys, keep, result, nbytes)
        self._persistents.add(p)
        return p

    def _adopt(self, tag: int, keep: tuple[Any, ...]) -> None:
        if self._closed:
            return
        if keep:
            self._orphans[tag] = keep
        else:
            lib.host_abandon(self._ptr, tag)

    def _reap_orphans(self) -> None:
        comp = ffi.new("struct host_completion *")
        for tag in list(self._orphans):
            if lib.host_test(self._handle(), tag, comp) != 0:
                self._orphans.pop(tag, None)  # the stager's poster reaps too

    # -- fault injection --------------------------------------------------------------------
    def set_mcast_faults(self, loss: float | None = None, reorder: float | None = None
                         ) -> tuple[float, float]:
        """Emulator: from now on this rank's NIC loses (and delivers out of order) this
        fraction of the multicast chunks it receives, like the ``mcast_loss`` and
        ``mcast_reorder`` config keys, which set them at start; None keeps a value as it
        is. Returns the previous (loss, reorder). Call it on every rank at the same point
        (after a barrier) for a run to reproduce. Hardware raises Unsupported."""
        self._check_open()
        new = list(self._mcast_faults)
        for i, (name, value) in enumerate((("loss", loss), ("reorder", reorder))):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0.0 <= float(value) <= 1.0:
                raise InvalidArgument(f"{name} must be a fraction from 0 to 1, got {value!r}")
            new[i] = float(value)
        rc = lib.host_set_mcast_faults(self._handle(), int(round(new[0] * 1e6)),
                                       int(round(new[1] * 1e6)))
        if rc == -errno.EOPNOTSUPP:
            raise Unsupported(f"set_mcast_faults: the {self.backend} backend injects no faults "
                              "(a real fabric loses what it loses)")
        self._check(rc, "set_mcast_faults")
        old, self._mcast_faults = self._mcast_faults, (new[0], new[1])
        return old

    # -- introspection ----------------------------------------------------------------------
    def failed_ranks(self) -> list[int]:
        """World ranks known to have died. Teams that hold one fail every op with
        PeerFailure; ``create_team`` over the survivors gives a working team again."""
        mask = int(lib.host_failed_ranks(self._handle()))
        return [r for r in range(self.size) if mask >> r & 1]

    def closed_ranks(self) -> list[int]:
        """World ranks that closed their context (left the job cleanly). Ops that needed
        one fail with PeerClosed; ``shrink()`` leaves them out."""
        mask = int(lib.host_closed_ranks(self._handle()))
        return [r for r in range(self.size) if mask >> r & 1]

    def stats(self) -> dict[str, Any]:
        """Firmware counters: totals and per DPA thread."""
        n = lib.host_num_threads(self._handle())
        raw = ffi.new("uint64_t[]", n * _STAT_WORDS)
        self._check(lib.host_stats(self._ptr, raw, n), "stats")
        per_thread = [
            {f: int(raw[t * _STAT_WORDS + i]) for i, f in enumerate(_STAT_FIELDS)}
            for t in range(n)
        ]
        totals = {f: sum(t[f] for t in per_thread) for f in _STAT_FIELDS}
        host = ffi.new("uint64_t[2]")
        lib.host_drive_stats(self._ptr, host, host + 1)
        gpu = {"path": "none", "ops": 0, "pieces": 0, "d2h_bytes": 0, "h2d_bytes": 0}
        if self._stager is not None:
            gpu.update(self._stager.stats)
        return {
            "backend": self.backend,
            "failed_ranks": self.failed_ranks(),
            "gpu": gpu,
            "bytes": totals["bytes_written"],
            "chunks": totals["writes"],
            **totals,
            # cooperative progress: what host threads did of the above (ops whose completion
            # a host thread's pass wrote, and the passes it ran)
            "progress": self.progress,
            "host_ops": int(host[0]),
            "host_passes": int(host[1]),
            "threads": per_thread,
        }
