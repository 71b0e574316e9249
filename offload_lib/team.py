"""Team: an ordered group of ranks, and its collectives. Each call checks and encodes its
arguments (_commands.py) and submits the command through its context; nothing else."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from offload_lib import _commands, _fast, _reduce
from offload_lib._prepared import PreparedCache
from offload_lib._native import ffi, lib
from offload_lib.errors import InvalidArgument
from offload_lib.request import PersistentRequest, Request

if TYPE_CHECKING:
    from offload_lib.context import Context

# Registration rights of an op's source and destination, as host_post gives them.
SRC_ACCESS = lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_REMOTE_READ
DST_ACCESS = (lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_LOCAL_WRITE |
              lib.OFFLOAD_ACCESS_REMOTE_WRITE)


class Team(_fast.TeamCore):
    """An ordered group of ranks; ops on a team must be called in the same order by all.

    ``barrier()`` and ``alltoall(src, dst)`` are C (offload_lib._fast, host/py/team.c) for
    the common case: the context open, nothing staged or orphaned in line, and for the
    all-to-all the same numpy arrays as a call before. Everything else comes to
    ``_barrier_slow`` and ``_alltoall_slow``."""

    def __init__(self, ctx: Context, team_id: int, ranks: Sequence[int]) -> None:
        self._ctx = ctx
        self.id = team_id
        self.ranks = tuple(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(ctx.rank)
        # The barrier's command, made here: made at the first barrier(), two threads could
        # leave _barrier_addr naming the op of the one whose _barrier_op store lost (freed).
        self._barrier_op = _commands.new_op(lib.OFFLOAD_OP_BARRIER, self)
        self._barrier_op.small = True
        self._barrier_addr = int(ffi.cast("uintptr_t", self._barrier_op))  # for _fast.post
        self._alltoalls = PreparedCache()  # the next call on the same arrays posts these
        self._allreduces = PreparedCache()
        super().__init__(ctx, self._barrier_op, self._barrier_addr, self._alltoalls._entries,
                         ctx._poll_ns, ctx._post_timeout_ns, ctx._orphans)
        with ctx._lock:  # as Context._gpu() marks them: a stager made meanwhile is not missed
            ctx._teams.add(self)
            self._staged = ctx._stager is not None

    def __repr__(self) -> str:
        return f"<Team id={self.id} rank={self.rank}/{self.size}>"

    def _submit(self, cmd: _commands.Command) -> Any:
        return self._ctx._submit(cmd)

    # -- all-to-all -------------------------------------------------------------------------
    def _alltoall_slow(self, src: Any, dst: Any) -> Request:
        """alltoall(src, dst) (TeamCore's in C) where the C path cannot post: block j of src
        goes to rank j, block i of dst comes from rank i."""
        ctx = self._ctx
        ctx._check_open()
        req = self._alltoalls.post(ctx, src, dst)  # the same numpy arrays as a call before
        if req is not None:
            return req
        cmd = _commands.alltoall(self, src, dst)
        req = self._submit(cmd)
        self._alltoalls.keep(src, dst, cmd.op, cmd.what)
        return req

    def alltoall_init(self, src: Any, dst: Any) -> PersistentRequest:
        """A persistent all-to-all: registered once, then post()/wait() repeatedly."""
        ctx = self._ctx
        ctx._check_open()
        s, d = _commands.alltoall_bufs(self, src, dst)
        if s.on_gpu or d.on_gpu:
            raise InvalidArgument("persistent requests take host buffers: post GPU buffers "
                                  "with team.alltoall (staged and stream-ordered each time)")
        op = _commands.alltoall_op(self, s, d)
        keys: list[int] = []
        try:
            for buf, access, field in ((s, SRC_ACCESS, "src_key"), (d, DST_ACCESS, "dst_key")):
                key, owned = ctx._register(buf, access)
                setattr(op, field, key)
                if owned:
                    keys.append(key)
        except BaseException:
            for key in keys:
                ctx._release_key(key)
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
        self._ctx._check_open()
        return self._submit(_commands.alltoallv(self, src, send_counts, dst, recv_counts, slot))

    def alltoallv_rows(self, src: Any, rows: Any, rows_per_rank: Any, dst: Any) -> Request:
        """All-to-all-v of table rows, gathered by the DPA (MoE dispatch): ``src`` is a 2-D
        table [R, row]; rank j gets rows ``src[rows[k]]`` for the next ``rows_per_rank[j]``
        k's, in order (a row may go to several ranks). Arrivals are packed by source rank in
        ``dst``; ``wait()`` returns the rows received from each rank (numpy int64). The host
        never copies the rows into a send buffer."""
        self._ctx._check_open()
        return self._submit(_commands.alltoallv_rows(self, src, rows, rows_per_rank, dst))

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
        self._ctx._check_open()
        return self._submit(_commands.alltoallv_place(self, src, rows_per_rank, dst, place))

    # -- multicast --------------------------------------------------------------------------
    def broadcast(self, buf: Any, root: int = 0) -> Request:
        """Post a broadcast of ``buf`` from team rank ``root`` to every rank's ``buf`` (same
        size and dtype everywhere). The root's DPA multicasts each MTU chunk once; receivers
        reassemble by chunk id and fetch lost chunks from the root."""
        self._ctx._check_open()
        return self._submit(_commands.broadcast(self, buf, root))

    def allgather(self, src: Any, dst: Any) -> Request:
        """Post an all-gather: block i of ``dst`` (``src.size`` elements) comes from rank i.
        Each rank multicasts its block once. In place (as NCCL's): ``src`` may be this
        rank's own block of ``dst``, which is then not copied."""
        self._ctx._check_open()
        return self._submit(_commands.allgather(self, src, dst))

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
        return _reduce.post(self, lib.OFFLOAD_OP_REDUCE_SCATTER, s, d, word, "reduce_scatter")[0]

    def allreduce(self, buf: Any, op: str = "sum", *, out: Any = None) -> Request:
        """Post an allreduce of every rank's ``buf``: in place, or into ``out`` (same size
        and dtype). Ops and dtypes as reduce_scatter; the same fixed order."""
        ctx = self._ctx
        ctx._check_open()
        dst = buf if out is None else out  # in place: the same array both ways
        if isinstance(op, str):  # the same arrays and op as a call before
            req = self._allreduces.post(ctx, buf, dst, op)
            if req is not None:
                return req
        s, d = _reduce.check_allreduce(buf, out)
        word = _reduce.redop_word(op, s)
        req, kept = _reduce.post(self, lib.OFFLOAD_OP_ALLREDUCE, s, d, word, "allreduce")
        if kept is not None and isinstance(op, str):
            self._allreduces.keep(buf, dst, kept, "allreduce", op, s.itemsize)
        return req

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
                                        _commands.list_fp(self.ranks), "shrink")
        survivors = [r for r in self.ranks if not failed >> r & 1]
        return ctx._make_team(ctx._new_team_id(team_id), survivors)

    # -- barrier ----------------------------------------------------------------------------
    def _barrier_slow(self) -> Request:
        """barrier() (TeamCore's in C) where the C path cannot post."""
        ctx = self._ctx
        ctx._check_open()
        return ctx._post_ready(self._barrier_addr, "barrier", (), True, None)
