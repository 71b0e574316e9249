"""Reductions on the DPA (reduce_scatter.c, allreduce.c, allreduce_eager.c): the commands,
their scratch, and a numpy reference of the fixed order the firmware reduces in
(docs/reductions.md).

Every reduction names a scratch region (the command's aux): a slot per team rank of the
op's block size, into which peers write their contributions and the DPA reduces; peers
read the allreduce's result out of it. Scratch comes from a per-context pool of
registered buffers, so a steady stream of reductions registers nothing. An allreduce
within eager_max needs none: its vectors meet in the eager slots.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from offload_lib._buffers import Buffer, as_buffer
from offload_lib._native import ffi, lib
from offload_lib._posting import Posting
from offload_lib.errors import InvalidArgument, brief

if TYPE_CHECKING:
    from offload_lib.context import Context, Team

# enum offload_redop / offload_dtype (offload_abi.h), by the names Python gives them
OPS = {"sum": lib.OFFLOAD_RED_SUM, "prod": lib.OFFLOAD_RED_PROD, "max": lib.OFFLOAD_RED_MAX,
       "min": lib.OFFLOAD_RED_MIN, "avg": lib.OFFLOAD_RED_AVG}
DTYPES = {"<f4": lib.OFFLOAD_DT_F32, "<f8": lib.OFFLOAD_DT_F64, "<f2": lib.OFFLOAD_DT_F16,
          "bfloat16": lib.OFFLOAD_DT_BF16, "<i4": lib.OFFLOAD_DT_I32, "<i8": lib.OFFLOAD_DT_I64}
_INTEGER_DTYPES = (lib.OFFLOAD_DT_I32, lib.OFFLOAD_DT_I64)
_DTYPE_NAMES = "float32, float64, float16, bfloat16, int32, int64"
# local read/write, remote read/write
_ALL_ACCESS = (lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_LOCAL_WRITE |
               lib.OFFLOAD_ACCESS_REMOTE_READ | lib.OFFLOAD_ACCESS_REMOTE_WRITE)


def redop_word(op: Any, buf: Buffer) -> int:
    """OFFLOAD_REDOP(op, dtype), or InvalidArgument naming what is accepted."""
    value = getattr(op, "value", op)
    name = value.lower() if isinstance(value, str) else None
    if name not in OPS:
        # An array passed as op (allreduce(buf, out) for allreduce(buf, out=out)) is named
        # by its type, with where it goes.
        hint = "" if isinstance(value, str) else " (an output buffer goes in out=)"
        raise InvalidArgument(f"op {brief(op)} is not a reduction the DPA runs: use one of "
                              f"{', '.join(OPS)}{hint}")
    dt = DTYPES.get(buf.dtype)
    if dt is None:
        raise InvalidArgument(f"the DPA reduces {_DTYPE_NAMES}, not {buf.dtype_name}")
    if name == "avg" and dt in _INTEGER_DTYPES:
        raise InvalidArgument(f"avg of {buf.dtype_name} has no {buf.dtype_name} result: "
                              "reduce with sum and divide, or use a floating dtype")
    return (OPS[name] << lib.OFFLOAD_REDOP_OP_SHIFT) | dt


def order_block(total: int, esize: int, n: int) -> int:
    """Bytes per order block (gloo's segment split; dpa_order_block in reduce_kernel.c)."""
    maxseg = esize * max(1, (1 << 20) // esize)
    nseg = max(-(-total // maxseg), 2 * n)
    nseg = -(-nseg // n) * n
    seg = -(-total // nseg)
    seg = -(-seg // esize) * esize
    return nseg // n * seg


class ScratchPool:
    """Registered scratch buffers of a context, reused once their op completed."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = weakref.ref(ctx)
        self._lock = threading.Lock()
        self._free: list[tuple[np.ndarray, int]] = []

    def take(self, nbytes: int) -> tuple[np.ndarray, int, Any]:
        """(array, key, lease): the buffer returns to the pool when the lease is dropped."""
        ctx = self._ctx()
        assert ctx is not None
        with self._lock:
            fits = [k for k, (a, _) in enumerate(self._free) if a.nbytes >= nbytes]
            if fits:
                arr, key = self._free.pop(min(fits, key=lambda k: self._free[k][0].nbytes))
            else:
                arr, key = None, 0
        if arr is None:
            # Page-aligned, rounded to 64 KiB so that near sizes share buffers.
            size = max(4096, -(-nbytes // 65536) * 65536)
            raw = np.empty(size + 4096, np.uint8)
            start = -raw.ctypes.data % 4096
            arr = raw[start:start + size]
            key, owned = Posting(ctx).register(as_buffer(arr, writable=True, name="scratch"),
                                               _ALL_ACCESS)
            assert owned, "a fresh scratch buffer was registered already"
        return arr, key, _Lease(self, arr, key)

    def _give_back(self, arr: np.ndarray, key: int) -> None:
        with self._lock:
            self._free.append((arr, key))
            if len(self._free) > 4:  # keep a few; release the smallest beyond that
                self._free.sort(key=lambda e: e[0].nbytes)
                _, old = self._free.pop(0)
                ctx = self._ctx()
                if ctx is not None:
                    Posting(ctx).release(old)

    def release_all(self) -> None:
        ctx = self._ctx()
        with self._lock:
            free, self._free = self._free, []
        if ctx is not None:
            for _, key in free:
                Posting(ctx).release(key)


class _Lease:
    """Held by a request until it completed: then its scratch goes back to the pool."""

    __slots__ = ("_pool", "_arr", "_key")

    def __init__(self, pool: ScratchPool, arr: np.ndarray, key: int) -> None:
        self._pool, self._arr, self._key = pool, arr, key

    def __del__(self) -> None:
        self._pool._give_back(self._arr, self._key)


def post(team: Team, opcode: int, s: Buffer, d: Buffer, word: int, what: str) -> Any:
    """Post a reduction command on checked buffers, with scratch from the pool; the
    Request, and the command when another call on the same buffers may post it again
    (no scratch, no registration of its own: eager, under its buffers' cookies), else None."""
    posting = Posting(team._ctx)
    n = team.size
    stride = s.nbytes // n if opcode == lib.OFFLOAD_OP_REDUCE_SCATTER else order_block(s.nbytes, s.itemsize, n)
    op = ffi.new("struct host_op *")
    op.opcode = opcode
    op.team = team.id
    op.root = word
    op.count = s.nbytes
    op.src_addr, op.src_len = s.addr, s.nbytes
    op.dst_addr, op.dst_len = d.addr, d.nbytes
    keep: tuple[Any, ...] = ()
    # A vector within eager_max is reduced in the eager slots (allreduce_eager.c, picked by
    # the firmware by the same rule): no scratch to take.
    eager = (opcode == lib.OFFLOAD_OP_ALLREDUCE and s.nbytes <= team._ctx.config.eager_max
             and n <= lib.OFFLOAD_EAGER_MAX_TEAM)
    if s.nbytes and not eager:
        arr, key, lease = posting.scratch().take(stride * n)
        op.aux_addr, op.aux_len, op.aux_key = arr.ctypes.data, stride * n, key
        keep = (lease,)
    if s.on_gpu or d.on_gpu:
        raise InvalidArgument(f"{what} takes host buffers (GPU buffers: copy to the host first)")
    # host_post registers the buffers under their exporters' cookies once and keeps that
    # for the next op on them (the registration cache), as for the collectives. In place
    # (dst is src, or its own block of src) under one cookie, it registers src once with
    # both rights for both keys (host_mr.c); an exporter without a cookie gets that one
    # registration for this op alone.
    cookie = posting.cookie(s) if s.nbytes else 0
    if not s.overlaps(d):
        op.src_cookie = cookie
        if d.nbytes:
            op.dst_cookie = posting.cookie(d)
    elif cookie and d.addr >= s.addr and d.addr + d.nbytes <= s.addr + s.nbytes:
        op.src_cookie = op.dst_cookie = cookie
    else:
        lo, hi = min(s.addr, d.addr), max(s.addr + s.nbytes, d.addr + d.nbytes)
        span = Buffer(lo, hi - lo, 1, "|u1", (s.obj, d.obj))
        key, owned = posting.register(span, _ALL_ACCESS)
        op.src_key = op.dst_key = key
        if owned:
            keep = (*keep, _KeyLease(posting, key))
    req = posting.op(op, what, (s.obj, d.obj, *keep), None, s.nbytes, s.itemsize)
    return req, (op if not keep and not op.src_key else None)


class _KeyLease:
    __slots__ = ("_posting", "_key")

    def __init__(self, posting: Posting, key: int) -> None:
        self._posting, self._key = posting, key

    def __del__(self) -> None:
        self._posting.release(self._key)


def check_reduce_scatter(team: Team, src: Any, dst: Any) -> tuple[Buffer, Buffer]:
    s = as_buffer(src, writable=False, name="src")
    d = as_buffer(dst, writable=True, name="dst")
    n = team.size
    if s.dtype != d.dtype:
        raise InvalidArgument(f"src is {s.dtype_name} but dst is {d.dtype_name}: use the same dtype")
    if s.count % n:
        raise InvalidArgument(f"src's {s.count} elements do not split evenly over {n} ranks: "
                              f"use a multiple of {n}")
    if d.count != s.count // n:
        raise InvalidArgument(f"dst has {d.count} elements but reduce_scatter gives each rank "
                              f"src's {s.count} / {n} = {s.count // n}")
    block = s.nbytes // n
    if s.overlaps(d) and d.addr != s.addr + team.rank * block:
        raise InvalidArgument("src and dst overlap: in place, dst must be this rank's own "
                              "block of src")
    return s, d


def check_allreduce(buf: Any, out: Any) -> tuple[Buffer, Buffer]:
    if out is None:
        b = as_buffer(buf, writable=True, name="buf")
        return b, b
    s = as_buffer(buf, writable=False, name="buf")
    d = as_buffer(out, writable=True, name="out")
    if s.dtype != d.dtype or s.nbytes != d.nbytes:
        raise InvalidArgument(f"out ({d.count} x {d.dtype_name}) must match buf "
                              f"({s.count} x {s.dtype_name})")
    if s.overlaps(d) and s.addr != d.addr:
        raise InvalidArgument("buf and out overlap partially: pass the same buffer, or none")
    return s, d


# -- the reference ---------------------------------------------------------------------------
def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as float32."""
    u = x.astype(np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    r = np.where(nan, (u | 0x400000) & 0xFFFF0000, r)
    return r.astype(np.uint32).view(np.float32)


def reference(op: str, inputs: Sequence[np.ndarray], dtype: str = "") -> np.ndarray:
    """The allreduce of ``inputs`` (one flat array per team rank) in the firmware's order.
    ``dtype="bfloat16"``: the arrays hold bfloat16 values as float32 (the bits, shifted)."""
    n = len(inputs)
    xs = [np.asarray(x).reshape(-1) for x in inputs]
    dt = xs[0].dtype
    esize = 2 if dtype == "bfloat16" else dt.itemsize
    count = xs[0].size
    order = order_block(count * esize, esize, n) // esize if count else 1
    half = dt == np.float16 or dtype == "bfloat16"
    rnd = _bf16_round if dtype == "bfloat16" else (lambda v: v.astype(np.float16).astype(np.float32))
    work = [x.astype(np.float32) if half else x for x in xs]
    out = np.empty(count, np.float32 if half else dt)
    fns = {"sum": np.add, "avg": np.add, "prod": np.multiply,
           "max": lambda a, b: np.where(a > b, a, b), "min": lambda a, b: np.where(a < b, a, b)}
    fn = fns[op]
    with np.errstate(all="ignore"):
        for g in range(n):
            sl = slice(min(g * order, count), min((g + 1) * order, count))
            acc = work[(g - 1) % n][sl].copy()
            for s in range(2, n + 1):
                acc = fn(acc, work[(g - s) % n][sl])
                if half:
                    acc = rnd(acc)
                acc = acc.astype(out.dtype)
            out[sl] = acc
        if op == "avg":
            out = (rnd(out / np.float32(n)) if half else (out / out.dtype.type(n)).astype(out.dtype))
    return out.astype(np.float16) if dt == np.float16 else out
