"""GPU buffers in the emulator: collectives staged through pinned host memory, stream-ordered.

An op on GPU buffers is cut into pieces (``gpu_piece`` bytes per rank, at most
``MAX_PIECES``; all-to-all-v is one piece, its layout is only known at the end). At the call,
on the user's CUDA stream: each piece's device-to-host copies into staging memory (the
job's shared memory, pinned with cuMemHostRegister), an event after each piece, and a wait
on a device word that the op's completion will raise. Two threads of the context then run it:

- the poster waits for a piece's event (the producer kernel and the copies are done) and
  posts the piece's host collective, in call order;
- the completer waits for each piece and, on an internal stream, copies what arrived into
  the GPU buffer (piece p lands while piece p+1 is on the network), then raises the word:
  the user's stream goes on with the result in place.

Posts from the calling thread wait until every staged op called before them was posted, so
the team's op order is the call order on every rank. Errors raise the word too (the stream
never hangs on a failed op) and come out of ``wait()``.
"""
from __future__ import annotations

import collections
import ctypes
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from offload_lib._buffers import Buffer
from offload_lib._cuda import Copy2D
from offload_lib.errors import Canceled, InvalidArgument, OffloadError, Timeout

MAX_PIECES = 8  # a team holds 8 ops in flight (OFFLOAD_OP_WINDOW)
_POOL_ROUND = 1 << 20


@dataclass
class _Piece:
    d2h: list[Copy2D]
    post: Callable[[], Any]  # posts the host collective; returns its Request
    h2d: Callable[[Any], list[Copy2D]] = lambda _value: []
    ev_in: int = 0
    req: Any = None
    value: Any = None


@dataclass
class _Op:
    what: str
    pieces: list[_Piece]
    stream: int
    cuda_ctx: int
    keep: tuple[Any, ...]  # user objects and staging arrays, alive until the end
    staging: list[np.ndarray]
    seq: int = 0
    ev_last: int = 0
    release: list[int] = field(default_factory=list)  # GPUDirect keys, released at the end
    canceled: bool = False
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StagedRequest:
    """The request of a staged op: ``wait()`` returns once the result is in the GPU buffer
    (the user's stream already waits for it on the device)."""

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
        """Cancel the op's pieces (see Request.cancel); True if it had not completed."""
        op = self._op
        if op.done.is_set():
            return False
        op.canceled = True
        for piece in op.pieces:
            if piece.req is not None:
                piece.req.cancel()
        op.done.wait()
        return isinstance(op.error, Canceled)


class _Device:
    """Per CUDA context: the internal stream H2D copies run on, and the completion word."""

    def __init__(self, drv: Any) -> None:
        self.stream = drv.stream_create()
        self.word = drv.alloc_word()
        self.seq = 0


class Stager:
    """One per Context that met a GPU buffer."""

    def __init__(self, ctx: Any, drv: Any, direct: bool = False) -> None:
        self.ctx, self.drv, self.direct = ctx, drv, direct
        self.piece_bytes = ctx.config.gpu_piece
        self._cv = threading.Condition()
        self._posting: collections.deque[_Op] = collections.deque()
        self._completing: collections.deque[_Op | None] = collections.deque()
        self._devices: dict[int, _Device] = {}
        self._pool: dict[int, list[np.ndarray]] = {}
        self._pinned: list[np.ndarray] = []
        self._closed = False
        self._local = threading.local()
        self.stats = {"path": "gpudirect" if direct else "staged", "ops": 0, "pieces": 0, "d2h_bytes": 0, "h2d_bytes": 0}
        self._threads = [threading.Thread(target=self._poster, name="dpa-gpu-poster", daemon=True),
                         threading.Thread(target=self._completer, name="dpa-gpu-completer",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    # -- ordering with host posts -----------------------------------------------------------
    def drain(self) -> None:
        """Return once every staged op called so far has posted all its pieces (a no-op on
        the stager's own threads)."""
        if getattr(self._local, "worker", False):
            return
        with self._cv:
            while self._posting:
                self._cv.wait()

    # -- staging memory ---------------------------------------------------------------------
    def _take(self, nbytes: int) -> np.ndarray:
        size = max(_POOL_ROUND, -(-nbytes // _POOL_ROUND) * _POOL_ROUND)
        with self._cv:
            free = self._pool.get(size)
            if free:
                return free.pop()
        arr = self.ctx.empty(size, np.uint8)
        self.drv.host_register(arr.ctypes.data, size)
        self._pinned.append(arr)
        return arr

    def _give_back(self, arrays: list[np.ndarray]) -> None:
        with self._cv:
            for a in arrays:
                self._pool.setdefault(a.nbytes, []).append(a)

    # -- submitting -------------------------------------------------------------------------
    def submit(self, what: str, bufs: list[Buffer], pieces: list[_Piece],
               staging: list[np.ndarray], result: Callable[[_Op], Any] = lambda op: None,
               ) -> Any:
        gpu = [b for b in bufs if b.on_gpu]
        streams = {b.stream for b in gpu}
        if len(streams) > 1:
            raise InvalidArgument(f"{what}: the GPU buffers come with different CUDA streams "
                                  f"{sorted(streams)}: make them current on one stream")
        live = [b for b in gpu if b.nbytes]
        if not live:  # nothing to copy: an ordinary host op on empty buffers
            return pieces[0].post()
        stream = streams.pop()
        cuda_ctx = self.drv.device_of(live[0].addr)[0]
        op = _Op(what, pieces, stream, cuda_ctx, tuple(b.obj for b in bufs), staging)
        drv = self.drv
        with drv.scope(cuda_ctx):
            dev = self._devices.get(cuda_ctx)
            if dev is None:
                dev = self._devices[cuda_ctx] = _Device(drv)
            for piece in pieces:
                for c in piece.d2h:
                    drv.copy_async(c, False, stream)
                    self.stats["d2h_bytes"] += c.width * c.height
                piece.ev_in = drv.event_record(stream)
            op.ev_last = pieces[-1].ev_in
            dev.seq += 1
            op.seq = dev.seq
            # Everything the user puts on the stream after this call sees the result.
            drv.stream_wait_value(stream, dev.word, op.seq)
        self.stats["ops"] += 1
        self.stats["pieces"] += len(pieces)
        with self._cv:
            self._posting.append(op)
            self._cv.notify_all()
        return StagedRequest(self, op, result)

    def direct_op(self, op: Any, what: str, bufs: tuple[Buffer, Buffer], keep: tuple[Any, ...],
                  result: Any, itemsize: int | None) -> Any:
        """GPUDirect: register the GPU buffers as dma-bufs and post ``op`` on them as it is,
        once the user's stream reached the call; no copies."""
        fields = {"src_key": bufs[0], "dst_key": bufs[1]}
        keys: dict[int, int] = {}
        try:
            for name, b in fields.items():
                if b.on_gpu and b.nbytes:
                    if b.addr not in keys:
                        keys[b.addr] = self._register_dmabuf(b)
                    setattr(op, name, keys[b.addr])
        except BaseException:
            for key in keys.values():
                self.ctx._release_key(key)
            raise
        piece = _Piece([], lambda: self.ctx._post(op, what, keep, result, itemsize=itemsize))
        req = self.submit(what, list(bufs), [piece], [], lambda o: o.pieces[0].value)
        req._op.release = list(keys.values())
        return req

    def _register_dmabuf(self, b: Buffer) -> int:
        import os

        from offload_lib._native import ffi, lib
        from offload_lib.errors import check_rc

        # dma-buf ranges are whole host pages
        page = os.sysconf("SC_PAGESIZE")
        base = b.addr & ~(page - 1)
        span = -(-(b.addr + b.nbytes - base) // page) * page
        with self.drv.scope(self.drv.device_of(b.addr)[0]):
            fd = self.drv.dmabuf(base, span)
        try:
            key = ffi.new("uint32_t *")
            access = 1 | 2 | 4 | 8  # local read/write, remote read/write: src or dst
            check_rc(lib.host_mr_acquire_dmabuf(self.ctx._handle(), base, span, fd, access, key),
                     "registering GPU memory for GPUDirect RDMA")
            return int(key[0])
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
            with self.drv.scope(op.cuda_ctx):
                for piece in op.pieces:
                    self.drv.event_synchronize(piece.ev_in)
                    if op.canceled or op.error is not None:
                        op.error = op.error or Canceled(f"{op.what}: canceled")
                        break
                    try:
                        piece.req = piece.post()
                    except BaseException as e:  # e.g. the context closed under us
                        op.error = e
                        break
            with self._cv:
                self._posting.popleft()
                self._completing.append(op)
                self._cv.notify_all()

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
            finally:
                op.done.set()

    def _complete(self, op: _Op) -> None:
        drv = self.drv
        dev = self._devices[op.cuda_ctx]
        with drv.scope(op.cuda_ctx):
            ordered = False
            for piece in op.pieces:
                if piece.req is None:
                    continue
                try:
                    piece.value = piece.req.wait()
                except OffloadError as e:
                    op.error = op.error or e
                    continue
                copies = [] if op.error is not None else piece.h2d(piece.value)
                if copies and not ordered:
                    # after whatever the user's stream did to the buffers before the call
                    drv.stream_wait_event(dev.stream, op.ev_last)
                    ordered = True
                for c in copies:
                    drv.copy_async(c, True, dev.stream)
                    self.stats["h2d_bytes"] += c.width * c.height
            drv.stream_write_value(dev.stream, dev.word, op.seq)
            for key in op.release:
                self.ctx._release_key(key)
            landed = drv.event_record(dev.stream)
            drv.event_synchronize(landed)
            for ev in {landed, *(p.ev_in for p in op.pieces)}:
                drv.event_destroy(ev)
        self._give_back(op.staging)
        op.staging = []

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
        for arr in self._pinned:
            self.drv.host_unregister(arr.ctypes.data)
        self._pinned.clear()
        self._pool.clear()


# ---------------------------------------------------------------------------------------------
# the plans: how each collective is cut into pieces


def _bounds(elements: int, itemsize: int, piece_bytes: int, per_rank_bytes: int) -> list[int]:
    """Element offsets cutting ``elements`` into pieces of about piece_bytes per rank."""
    k = max(1, min(MAX_PIECES, elements, math.ceil(per_rank_bytes / piece_bytes)))
    return [elements * p // k for p in range(k + 1)]


def _elem_view(arr: np.ndarray, itemsize: int) -> np.ndarray:
    return arr.view(np.dtype((np.void, itemsize))) if itemsize > 1 else arr


def alltoall(stager: Stager, team: Any, s: Buffer, d: Buffer) -> StagedRequest:
    n, size = team.size, s.itemsize
    block = s.nbytes // n
    src_host, dst_host = _host_side(stager, s), _host_side(stager, d)
    staging = [a for a, b in ((src_host, s), (dst_host, d)) if b.on_gpu]
    if not (s.on_gpu and d.on_gpu):
        bounds = [0, block // size]
    else:
        bounds = _bounds(block // size, size, stager.piece_bytes, s.nbytes)
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        region = slice(n * off, n * off + n * width)
        d2h = [Copy2D(src_host.ctypes.data + n * off, width, s.addr + off, block, width, n)] \
            if s.on_gpu and width else []
        h2d = [Copy2D(d.addr + off, block, dst_host.ctypes.data + n * off, width, width, n)] \
            if d.on_gpu and width else []
        pieces.append(_Piece(
            d2h, lambda r=region: team.alltoall(src_host[r], dst_host[r]),
            lambda _v, c=h2d: c))
    return stager.submit("alltoall", [s, d], pieces, staging)


def allgather(stager: Stager, team: Any, s: Buffer, d: Buffer) -> StagedRequest:
    n, size, total = team.size, s.itemsize, s.nbytes
    src_host, dst_host = _host_side(stager, s), _host_side(stager, d)
    staging = [a for a, b in ((src_host, s), (dst_host, d)) if b.on_gpu]
    bounds = _bounds(total // size, size, stager.piece_bytes, d.nbytes) \
        if s.on_gpu and d.on_gpu else [0, total // size]
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        d2h = [Copy2D.flat(src_host.ctypes.data + off, s.addr + off, width)] \
            if s.on_gpu and width else []
        h2d = [Copy2D(d.addr + off, total, dst_host.ctypes.data + n * off, width, width, n)] \
            if d.on_gpu and width else []
        pieces.append(_Piece(
            d2h, lambda o=off, w=width: team.allgather(src_host[o:o + w],
                                                       dst_host[n * o:n * o + n * w]),
            lambda _v, c=h2d: c))
    return stager.submit("allgather", [s, d], pieces, staging)


def broadcast(stager: Stager, team: Any, b: Buffer, root: int) -> StagedRequest:
    size, total = b.itemsize, b.nbytes
    host = _host_side(stager, b)
    is_root = team.rank == root
    bounds = _bounds(total // size, size, stager.piece_bytes, total)
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        off, width = lo * size, (hi - lo) * size
        d2h = [Copy2D.flat(host.ctypes.data + off, b.addr + off, width)] if is_root and width \
            else []
        h2d = [] if is_root or not width else [Copy2D.flat(b.addr + off, host.ctypes.data + off,
                                                           width)]
        pieces.append(_Piece(d2h, lambda o=off, w=width: team.broadcast(host[o:o + w], root),
                             lambda _v, c=h2d: c))
    return stager.submit("broadcast", [b], pieces, [host])


def alltoallv(stager: Stager, team: Any, s: Buffer, d: Buffer, sends: np.ndarray,
              recv_counts: Any, slot: int | None) -> StagedRequest:
    size = s.itemsize
    sent = int(sends.sum()) * size
    src_host, dst_host = _host_side(stager, s), _host_side(stager, d)
    staging = [a for a, b in ((src_host, s), (dst_host, d)) if b.on_gpu]
    d2h = [Copy2D.flat(src_host.ctypes.data, s.addr, sent)] if s.on_gpu and sent else []

    def post() -> Any:
        return team.alltoallv(_elem_view(src_host[:s.nbytes], size), sends,
                              _elem_view(dst_host[:d.nbytes], size), recv_counts, slot)

    def h2d(recv: np.ndarray) -> list[Copy2D]:
        if not d.on_gpu:
            return []
        if slot is None:
            got = int(recv.sum()) * size
            return [Copy2D.flat(d.addr, dst_host.ctypes.data, got)] if got else []
        step = slot * size
        return [Copy2D.flat(d.addr + i * step, dst_host.ctypes.data + i * step, int(c) * size)
                for i, c in enumerate(recv.tolist()) if c]

    return stager.submit("alltoallv", [s, d], [_Piece(d2h, post, h2d)], staging,
                         lambda op: op.pieces[0].value)


def alltoallv_rows(stager: Stager, team: Any, s: Buffer, shape: tuple[int, int], rows: Any,
                   per_rank: Any, d: Buffer) -> StagedRequest:
    size = s.itemsize
    row_bytes = shape[1] * size
    src_host, dst_host = _host_side(stager, s), _host_side(stager, d)
    staging = [a for a, b in ((src_host, s), (dst_host, d)) if b.on_gpu]
    d2h = [Copy2D.flat(src_host.ctypes.data, s.addr, s.nbytes)] if s.on_gpu and s.nbytes else []

    def post() -> Any:
        table = _elem_view(src_host[:s.nbytes], size).reshape(shape)
        return team.alltoallv_rows(table, rows, per_rank, _elem_view(dst_host[:d.nbytes], size))

    def h2d(recv: np.ndarray) -> list[Copy2D]:
        got = int(recv.sum()) * row_bytes
        return [Copy2D.flat(d.addr, dst_host.ctypes.data, got)] if d.on_gpu and got else []

    return stager.submit("alltoallv_rows", [s, d], [_Piece(d2h, post, h2d)], staging,
                         lambda op: op.pieces[0].value)


def _host_side(stager: Stager, b: Buffer) -> np.ndarray:
    """Bytes on the host for ``b``: pinned staging for GPU memory, else its own memory (kept
    alive by the op)."""
    if b.on_gpu:
        return stager._take(b.nbytes)
    if not b.nbytes:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * b.nbytes).from_address(b.addr))
