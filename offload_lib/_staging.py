"""GPU buffers: collectives ordered on the user's CUDA stream, staged or GPUDirect.

Staged (the emulator): an op on GPU buffers is cut into pieces (about ``gpu_piece`` bytes
per rank, at most ``MAX_PIECES``, a number that depends on sizes alone so that every rank
posts the same ops; all-to-all-v is one piece, its layout is only known at the end). At the
call, on the user's stream: each piece's device-to-host copies into staging memory (the
job's shared memory, pinned with cuMemHostRegister), an event after each piece, and a wait
on a device word that the op's completion raises. Two threads of the context then run it:

- the poster waits for a piece's event (the producer kernel and the copies are done) and
  posts the piece's host collective, in call order;
- the completer waits for each piece and, on an internal stream, copies what arrived into
  the GPU buffer (piece p lands while piece p+1 is on the network), then raises the word:
  the user's stream goes on with the result in place.

GPUDirect (a card): the GPU buffers are registered as dma-bufs and the op is posted on them
as it is, one piece without copies, with the same event and word around it.

Posts from the calling thread wait until every GPU op called before them was posted, so
the team's op order is the call order on every rank. Whatever happens to an op (an error
completion, a CUDA error, a cancel), the word is raised: a stream never hangs on it.
"""
from __future__ import annotations

import collections
import ctypes
import errno
import math
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from offload_lib import _commands
from offload_lib._buffers import Buffer
from offload_lib._cuda import Copy2D
from offload_lib._native import lib
from offload_lib._posting import Posting
from offload_lib.errors import Canceled, InvalidArgument, OffloadError, Timeout
from offload_lib.request import McastStats

MAX_PIECES = lib.OFFLOAD_OP_WINDOW  # ops a team holds in flight
_POOL_ROUND = 1 << 20


def _nothing(_value: Any = None) -> list[Copy2D]:
    return []


@dataclass
class _Piece:
    d2h: list[Copy2D]  # queued on the user's stream at the call
    post: Callable[[], Any]  # posts the host collective; returns its Request
    h2d: Callable[[Any], list[Copy2D]] = _nothing  # what to copy back, given the result
    pack: Callable[[], None] | None = None  # host work before the post (poster thread)
    unpack: Callable[[], None] | None = None  # host work after completion (completer)
    ev_in: int = 0
    req: Any = None
    value: Any = None


@dataclass
class _Op:
    what: str
    pieces: list[_Piece]
    stream: int
    cuda_ctx: int
    keep: tuple[Any, ...]  # user objects, alive until the end
    staging: list[np.ndarray]
    release: list[int] = field(default_factory=list)  # GPUDirect keys, released at the end
    seq: int = 0
    ev_last: int = 0
    canceled: bool = False
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StagedRequest:
    """The request of an op on GPU buffers: ``wait()`` returns once the result is in the GPU
    buffer (the user's stream already waits for it on the device)."""

    def __init__(self, stager: Stager, op: _Op, result: Callable[[_Op], Any]) -> None:
        self._stager, self._op, self._result = stager, op, result

    def __repr__(self) -> str:
        state = "done" if self._op.done.is_set() else "pending"
        return f"<StagedRequest {self._op.what} {state}>"

    def _outcome(self) -> Any:
        if self._op.error is not None:
            raise self._op.error
        return self._result(self._op)

    def test(self) -> bool:
        if not self._op.done.is_set():
            return False
        self._outcome()
        return True

    def wait(self, timeout: float | None = None) -> Any:
        if not self._op.done.wait(timeout):
            raise Timeout(f"{self._op.what} did not complete within {timeout} s")
        return self._outcome()

    def cancel(self) -> bool:
        """Abort the op (see Request.cancel): True if it was cancelled, False if it had
        completed. Returns once the firmware let go of its buffers."""
        if self._op.done.is_set():
            return False
        self._stager.cancel(self._op)
        self._op.done.wait()
        return isinstance(self._op.error, Canceled)


class _Device:
    """Per CUDA context: the internal stream host-to-device copies run on, and the word."""

    def __init__(self, drv: Any) -> None:
        self.stream = drv.stream_create()
        self.word = drv.alloc_word()
        self.seq = 0


class Stager:
    """One per Context that met a GPU buffer."""

    def __init__(self, ctx: Any, drv: Any, direct: bool = False) -> None:
        self.ctx, self.drv, self.direct = ctx, drv, direct
        self.posting = Posting(ctx)  # how its pieces are posted, cancelled, registered
        self.piece_bytes = ctx.config.gpu_piece
        self._cv = threading.Condition()
        self._posting: collections.deque[_Op] = collections.deque()
        self._completing: collections.deque[_Op | None] = collections.deque()
        self._devices: dict[int, _Device] = {}
        self._pool: dict[int, list[np.ndarray]] = {}
        self._pinned: dict[int, tuple[np.ndarray, int]] = {}  # addr -> (array, CUDA context)
        self._closed = False
        self._local = threading.local()
        self.stats = {"path": "gpudirect" if direct else "staged", "ops": 0, "pieces": 0,
                      "d2h_bytes": 0, "h2d_bytes": 0}
        self._threads = [threading.Thread(target=self._poster, name="dpa-gpu-poster", daemon=True),
                         threading.Thread(target=self._completer, name="dpa-gpu-completer",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    # -- ordering with host posts -----------------------------------------------------------
    def drain(self) -> None:
        """Return once every GPU op called so far has posted all its pieces (a no-op on the
        stager's own threads)."""
        if getattr(self._local, "worker", False):
            return
        with self._cv:
            while self._posting:
                self._cv.wait()

    # -- staging memory ---------------------------------------------------------------------
    def take(self, nbytes: int) -> np.ndarray:
        """Staging memory of at least nbytes (shared with peers; pinned when submitted)."""
        size = max(_POOL_ROUND, -(-nbytes // _POOL_ROUND) * _POOL_ROUND)
        with self._cv:
            free = self._pool.get(size)
            if free:
                return free.pop()
        return self.ctx.empty(size, np.uint8)

    def _give_back(self, arrays: list[np.ndarray]) -> None:
        with self._cv:
            for a in arrays:
                self._pool.setdefault(a.nbytes, []).append(a)

    # -- submitting -------------------------------------------------------------------------
    def post(self, cmd: _commands.Command) -> Any:
        """Post a staged piece: a command on host (staging) buffers, through the context's
        posting, not the public Team API (which would route GPU buffers back here)."""
        return self.posting.command(cmd)

    def submit(self, what: str, bufs: list[Buffer], pieces: list[_Piece],
               staging: list[np.ndarray], result: Callable[[_Op], Any] = lambda op: None,
               release: list[int] | None = None) -> Any:
        gpu = [b for b in bufs if b.on_gpu]
        streams = {b.stream for b in gpu}
        if len(streams) > 1:
            self._give_back(staging)
            raise InvalidArgument(f"{what}: the GPU buffers come with different CUDA streams "
                                  f"{sorted(streams)}: make them current on one stream")
        live = [b for b in gpu if b.nbytes]
        if not live:  # nothing on the GPU to order: a host op on empty buffers
            assert not staging and not release
            return pieces[0].post()
        drv = self.drv
        cuda_ctx = drv.device_of(live[0].addr)[0]
        op = _Op(what, pieces, streams.pop(), cuda_ctx, tuple(b.obj for b in bufs), staging,
                 list(release or ()))
        with self._cv, drv.scope(cuda_ctx):
            for a in staging:
                if a.ctypes.data not in self._pinned:
                    drv.host_register(a.ctypes.data, a.nbytes)
                    self._pinned[a.ctypes.data] = (a, cuda_ctx)
            dev = self._devices.get(cuda_ctx)
            if dev is None:
                dev = self._devices[cuda_ctx] = _Device(drv)
            for piece in pieces:
                for c in piece.d2h:
                    drv.copy_async(c, False, op.stream)
                    self.stats["d2h_bytes"] += c.width * c.height
                piece.ev_in = drv.event_record(op.stream)
            op.ev_last = pieces[-1].ev_in
            # The sequence and the queue move together: the completer raises the word in
            # this order, and a stream waiting for a later value must not be let go early.
            dev.seq += 1
            op.seq = dev.seq
            drv.stream_wait_value(op.stream, dev.word, op.seq)
            self.stats["ops"] += 1
            self.stats["pieces"] += len(pieces)
            self._posting.append(op)
            self._cv.notify_all()
        return StagedRequest(self, op, result)

    def cancel(self, op: _Op) -> None:
        """Cancel the op's posted pieces, and stop the poster from posting more."""
        with self._cv:
            op.canceled = True
            posted = [p.req for p in op.pieces if p.req is not None]
        self._cancel_posted(op, posted)

    def _cancel_posted(self, op: _Op, reqs: list[Any]) -> None:
        for req in reqs:  # the completer collects their (cancelled) completions
            rc = self.posting.cancel(req)
            if rc not in (0, -errno.ENOENT):  # it had completed
                op.error = op.error or OffloadError(f"{op.what}: cancel failed ({rc})")

    # -- GPUDirect ----------------------------------------------------------------------------
    def direct_op(self, op: Any, what: str, bufs: tuple[Buffer, Buffer], keep: tuple[Any, ...],
                  result: Any, itemsize: int | None) -> Any:
        """GPUDirect: register the GPU buffers as dma-bufs and post ``op`` on them as it is,
        once the user's stream reached the call; no copies."""
        keys: dict[int, int] = {}
        try:
            for name, b in (("src_key", bufs[0]), ("dst_key", bufs[1])):
                if b.on_gpu and b.nbytes:
                    if b.addr not in keys:
                        keys[b.addr] = self._register_dmabuf(b)
                    setattr(op, name, keys[b.addr])
            piece = _Piece([], lambda: self.posting.op(op, what, keep, result, itemsize=itemsize))
            return self.submit(what, list(bufs), [piece], [], lambda o: o.pieces[0].value,
                               release=list(keys.values()))
        except BaseException:
            for key in keys.values():
                self.posting.release(key)
            raise

    def _register_dmabuf(self, b: Buffer) -> int:
        # The whole allocation, as NCCL registers it: dma-buf ranges are whole pages.
        with self.drv.scope(self.drv.device_of(b.addr)[0]):
            base, size = self.drv.allocation(b.addr)
            page = os.sysconf("SC_PAGESIZE")
            span = -(-size // page) * page
            fd = self.drv.dmabuf(base, span)
        try:
            # src or dst: local read/write, remote read/write
            access = (lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_LOCAL_WRITE |
                      lib.OFFLOAD_ACCESS_REMOTE_READ | lib.OFFLOAD_ACCESS_REMOTE_WRITE)
            return self.posting.register_dmabuf(base, span, fd, access)
        finally:
            os.close(fd)

    # -- the two threads --------------------------------------------------------------------
    def _poster(self) -> None:
        self._local.worker = True
        while True:
            with self._cv:
                while not self._posting and not self._closed:
                    self._cv.wait()
                if not self._posting:
                    return
                op = self._posting[0]
            try:
                self._post_pieces(op)
            except BaseException as e:  # a CUDA error, a closed context: the op fails
                op.error = op.error or e
            with self._cv:
                self._posting.popleft()
                self._completing.append(op)
                self._cv.notify_all()

    def _post_pieces(self, op: _Op) -> None:
        with self.drv.scope(op.cuda_ctx):
            for piece in op.pieces:
                self.drv.event_synchronize(piece.ev_in)
                if piece.pack is not None:
                    piece.pack()
                with self._cv:
                    if op.canceled:
                        op.error = op.error or Canceled(f"{op.what}: canceled")
                    if op.error is not None:
                        return
                req = piece.post()
                with self._cv:
                    piece.req = req
                    late = op.canceled  # cancel() ran between the check and the post
                if late:
                    self._cancel_posted(op, [req])

    def _completer(self) -> None:
        self._local.worker = True
        while True:
            with self._cv:
                while not self._completing:
                    self._cv.wait()
                op = self._completing.popleft()
            if op is None:
                return
            try:
                self._complete(op)
            except BaseException as e:
                op.error = op.error or e
            finally:
                op.done.set()

    def _complete(self, op: _Op) -> None:
        drv = self.drv
        dev = self._devices[op.cuda_ctx]
        with drv.scope(op.cuda_ctx):
            try:
                self._land(op, dev)
            finally:
                # Always: the user's stream waits for this value.
                if self.direct and op.error is None:
                    drv.flush_rdma_writes()
                drv.stream_write_value(dev.stream, dev.word, op.seq)
                for key in op.release:
                    self.posting.release(key)
                landed = drv.event_record(dev.stream)
                drv.event_synchronize(landed)
                # Staging goes back only when no copy of this op can still touch it, even
                # those of pieces that were never posted.
                drv.event_synchronize(op.ev_last)
                for ev in {landed, *(p.ev_in for p in op.pieces)}:
                    drv.event_destroy(ev)
                self._give_back(op.staging)
                op.staging = []

    def _land(self, op: _Op, dev: _Device) -> None:
        """Wait for each posted piece and copy its result into place."""
        ordered = False
        for piece in op.pieces:
            if piece.req is None:
                continue
            try:
                piece.value = piece.req.wait()
            except OffloadError as e:
                op.error = op.error or e
                continue
            if op.error is not None:
                continue
            if piece.unpack is not None:
                piece.unpack()
            copies = piece.h2d(piece.value)
            if copies and not ordered:
                # after whatever the user's stream did to the buffers before the call
                self.drv.stream_wait_event(dev.stream, op.ev_last)
                ordered = True
            for c in copies:
                self.drv.copy_async(c, True, dev.stream)
                self.stats["h2d_bytes"] += c.width * c.height

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Finish what was called, stop the threads, unpin the staging memory."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._threads[0].join()
        with self._cv:
            self._completing.append(None)
            self._cv.notify_all()
        self._threads[1].join()
        for ctx_handle, dev in self._devices.items():
            with self.drv.scope(ctx_handle):
                self.drv.stream_destroy(dev.stream)
                self.drv.free(dev.word)
        for addr, (_arr, ctx_handle) in self._pinned.items():
            with self.drv.scope(ctx_handle):
                self.drv.host_unregister(addr)
        self._pinned.clear()
        self._pool.clear()


# ---------------------------------------------------------------------------------------------
# the plans: how each collective is cut into pieces. The cut depends on sizes alone: a peer
# whose buffers live elsewhere (host memory, another kind of GPU memory) must post the same
# ops. Host memory in a cut op is packed into staging on the host.


def _bounds(elements: int, per_rank_bytes: int, piece_bytes: int) -> list[int]:
    """Element offsets cutting ``elements`` into pieces of about piece_bytes per rank."""
    k = max(1, min(MAX_PIECES, elements, math.ceil(per_rank_bytes / piece_bytes)))
    return [elements * p // k for p in range(k + 1)]


def _elem_view(arr: np.ndarray, itemsize: int) -> np.ndarray:
    return arr.view(np.dtype((np.void, itemsize))) if itemsize > 1 else arr


def _user_bytes(b: Buffer) -> np.ndarray:
    """The user's host memory as bytes (kept alive by the op)."""
    if not b.nbytes:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * b.nbytes).from_address(b.addr))


class _Sides:
    """Host bytes for each buffer of an op: staging for GPU memory (and for host memory an op
    cut in pieces must pack), else the user's own memory."""

    def __init__(self, stager: Stager, cut: bool, *bufs: Buffer) -> None:
        self.staging: list[np.ndarray] = []
        self.host: list[np.ndarray] = []
        self.packed: list[bool] = []
        for b in bufs:
            packed = b.nbytes > 0 and (b.on_gpu or cut)
            arr = stager.take(b.nbytes) if packed else _user_bytes(b)
            if packed:
                self.staging.append(arr)
            self.host.append(arr)
            self.packed.append(packed)


def _columns_back(d: Buffer, staged: bool, host: np.ndarray, user: np.ndarray, n: int,
                  pitch: int, off: int, width: int
                  ) -> tuple[Callable[[Any], list[Copy2D]], Callable[[], None] | None]:
    """How a piece that arrived packed ([n, width] at host[n*off:]) goes back to columns
    [off, off+width) of d's n rows of ``pitch`` bytes: a 2-D copy to the GPU (h2d), or a
    copy on the host (unpack)."""
    if not (staged and width):
        return _nothing, None
    packed = host[n * off:n * (off + width)]
    if d.on_gpu:
        copies = [Copy2D(d.addr + off, pitch, packed.ctypes.data, width, width, n)]
        return (lambda _v: copies), None
    return _nothing, (lambda: np.copyto(user.reshape(n, pitch)[:, off:off + width],
                                        packed.reshape(n, width)))


def alltoall(stager: Stager, team: Any, s: Buffer, d: Buffer) -> Any:
    n, size = team.size, s.itemsize
    block = s.nbytes // n
    bounds = _bounds(block // size, s.nbytes, stager.piece_bytes)
    sides = _Sides(stager, len(bounds) > 2, s, d)
    (src_h, dst_h), (src_staged, dst_staged) = sides.host, sides.packed
    user_src, user_dst = _user_bytes(s), _user_bytes(d)
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        region = slice(n * off, n * off + n * width)
        if not src_staged or not width:  # the whole of src, in place
            d2h, pack = [], None
        elif s.on_gpu:
            d2h, pack = [Copy2D(src_h.ctypes.data + n * off, width, s.addr + off, block,
                                width, n)], None
        else:
            d2h, pack = [], (lambda r=region, o=off, w=width: np.copyto(
                src_h[r].reshape(n, w), user_src.reshape(n, block)[:, o:o + w]))
        h2d, unpack = _columns_back(d, dst_staged, dst_h, user_dst, n, block, off, width)
        pieces.append(_Piece(d2h, lambda r=region: stager.post(
            _commands.alltoall(team, src_h[r], dst_h[r])), h2d, pack, unpack))
    return stager.submit("alltoall", [s, d], pieces, sides.staging)


def allgather(stager: Stager, team: Any, s: Buffer, d: Buffer) -> Any:
    n, size, total = team.size, s.itemsize, s.nbytes
    bounds = _bounds(total // size, d.nbytes, stager.piece_bytes)
    cut = len(bounds) > 2
    # A host src needs no packing: each piece of it is contiguous.
    sides = _Sides(stager, False, s)
    dst_side = _Sides(stager, cut, d)
    src_h, dst_h, dst_staged = sides.host[0], dst_side.host[0], dst_side.packed[0]
    user_dst = _user_bytes(d)
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        d2h = [Copy2D.flat(src_h.ctypes.data + off, s.addr + off, width)] \
            if s.on_gpu and width else []
        h2d, unpack = _columns_back(d, dst_staged, dst_h, user_dst, n, total, off, width)
        dst_region = slice(n * off, n * off + n * width) if dst_staged else slice(0, d.nbytes)
        pieces.append(_Piece(
            d2h, lambda o=off, w=width, r=dst_region: stager.post(
                _commands.allgather(team, src_h[o:o + w], dst_h[r])), h2d, None, unpack))
    return stager.submit("allgather", [s, d], pieces, sides.staging + dst_side.staging,
                         _mcast_total)


def _mcast_total(op: _Op) -> McastStats | None:
    """A staged multicast op's counters: the sum over its pieces, each one multicast op."""
    values = [p.value for p in op.pieces]
    if not all(isinstance(v, McastStats) for v in values):
        return None
    return McastStats(*(sum(int(getattr(v, f.name)) for v in values)
                        for f in fields(McastStats)))


def broadcast(stager: Stager, team: Any, b: Buffer, root: int) -> Any:
    size, total = b.itemsize, b.nbytes
    sides = _Sides(stager, False, b)
    host = sides.host[0]
    is_root = team.rank == root
    pieces = []
    bounds = _bounds(total // size, total, stager.piece_bytes)
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        d2h = [Copy2D.flat(host.ctypes.data + off, b.addr + off, width)] \
            if is_root and width and b.on_gpu else []
        h2d = [] if is_root or not width or not b.on_gpu else \
            [Copy2D.flat(b.addr + off, host.ctypes.data + off, width)]
        pieces.append(_Piece(d2h, lambda o=off, w=width: stager.post(
            _commands.broadcast(team, host[o:o + w], root)), lambda _v, c=h2d: c))
    return stager.submit("broadcast", [b], pieces, sides.staging, _mcast_total)


def alltoallv(stager: Stager, team: Any, s: Buffer, d: Buffer, sends: np.ndarray,
              recv_counts: Any, slot: int | None) -> Any:
    size = s.itemsize
    sent = int(sends.sum()) * size
    sides = _Sides(stager, False, s, d)
    src_h, dst_h = sides.host
    d2h = [Copy2D.flat(src_h.ctypes.data, s.addr, sent)] if s.on_gpu and sent else []

    def post() -> Any:
        return stager.post(_commands.alltoallv(team, _elem_view(src_h[:s.nbytes], size), sends,
                                               _elem_view(dst_h[:d.nbytes], size), recv_counts,
                                               slot))

    def h2d(recv: np.ndarray) -> list[Copy2D]:
        if not d.on_gpu:
            return []
        if slot is None:
            got = int(recv.sum()) * size
            return [Copy2D.flat(d.addr, dst_h.ctypes.data, got)] if got else []
        step = slot * size
        return [Copy2D.flat(d.addr + i * step, dst_h.ctypes.data + i * step, int(c) * size)
                for i, c in enumerate(recv.tolist()) if c]

    return stager.submit("alltoallv", [s, d], [_Piece(d2h, post, h2d)], sides.staging,
                         lambda op: op.pieces[0].value)


def alltoallv_rows(stager: Stager, team: Any, s: Buffer, shape: tuple[int, int], rows: Any,
                   per_rank: Any, d: Buffer) -> Any:
    size = s.itemsize
    row_bytes = shape[1] * size
    sides = _Sides(stager, False, s, d)
    src_h, dst_h = sides.host
    d2h = [Copy2D.flat(src_h.ctypes.data, s.addr, s.nbytes)] if s.on_gpu and s.nbytes else []

    def post() -> Any:
        table = _elem_view(src_h[:s.nbytes], size).reshape(shape)
        return stager.post(_commands.alltoallv_rows(team, table, rows, per_rank,
                                                    _elem_view(dst_h[:d.nbytes], size)))

    def h2d(recv: np.ndarray) -> list[Copy2D]:
        got = int(recv.sum()) * row_bytes
        return [Copy2D.flat(d.addr, dst_h.ctypes.data, got)] if d.on_gpu and got else []

    return stager.submit("alltoallv_rows", [s, d], [_Piece(d2h, post, h2d)], sides.staging,
                         lambda op: op.pieces[0].value)


def alltoallv_place(stager: Stager, team: Any, s: Buffer, shape: tuple[int, int], per_rank: Any,
                    d: Buffer, dst_shape: tuple[int, int], place: Any) -> Any:
    """GPU rows sent to host tables (the placed rows land in host memory directly)."""
    size = s.itemsize
    sides = _Sides(stager, False, s)
    (src_h,) = sides.host
    d2h = [Copy2D.flat(src_h.ctypes.data, s.addr, s.nbytes)] if s.on_gpu and s.nbytes else []

    def post() -> Any:
        table = _elem_view(src_h[:s.nbytes], size).reshape(shape)
        return stager.post(_commands.alltoallv_place(
            team, table, per_rank, _elem_view(_user_bytes(d), size).reshape(dst_shape), place))

    return stager.submit("alltoallv_place", [s, d], [_Piece(d2h, post, _nothing)],
                         sides.staging, lambda op: op.pieces[0].value)
