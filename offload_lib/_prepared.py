"""Commands kept for the next call on the same buffers (a small op's fast path).

A loop that calls ``team.alltoall(src, dst)`` (or an eager-sized ``team.allreduce(buf, op)``,
in place or ``out=out``) on the same numpy arrays again and again (MoE decode steps, small
gradients, the benchmark) would check and encode the same command each time:
at 1 KiB per peer that is most of the call's CPU. The first call takes the full way
(_commands.py) and leaves its encoded command here; the next ones check, cheaply, that
each array is still the same object with the same dtype, size, address, C-contiguity and
(dst) writability, which is everything the full check looked at that can change in an
array that stays alive, and post the kept command. Anything else goes the full way.

Entries hold their arrays weakly (a cached command must not keep a user's memory alive);
the address is read again on every call, so an array that moved (``resize`` with
``refcheck=False``) is never reached through the old command.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from offload_lib._native import ffi

# Entries per team, a few loops' worth: a program that cycles through more buffers than
# this takes the full way for some of them.
MAX_ENTRIES = 8
_PTR = ffi.typeof("char *")


class Prepared:
    """One encoded command on (src, dst), posted again while ``matches`` says so."""

    __slots__ = ("src", "dst", "dtype", "nbytes", "src_ptr", "dst_ptr", "op", "op_addr", "small",
                 "what", "variant", "itemsize")

    def __init__(self, src: np.ndarray, dst: np.ndarray, op: Any, what: str,
                 variant: str | None, itemsize: int | None) -> None:
        self.src = weakref.ref(src)
        self.dst = weakref.ref(dst)
        self.dtype = src.dtype
        self.nbytes = (src.nbytes, dst.nbytes)
        # Plain pointers: a from_buffer() object would keep the array alive.
        self.src_ptr = ffi.cast(_PTR, op.src_addr)
        self.dst_ptr = ffi.cast(_PTR, op.dst_addr)
        op_copy = ffi.new("struct host_op *")
        op_copy[0] = op[0]  # posted: with its cookies and size class (host_post copies it)
        self.op = op_copy
        self.op_addr = int(ffi.cast("uintptr_t", op_copy))  # for offload_lib._fast.post
        self.small = bool(op.small)
        self.what = what
        self.variant = variant  # what else the command encodes from the call (a reduction op)
        self.itemsize = itemsize  # as the full way's Request has it (sizes in errors)

    def matches(self, src: Any, dst: Any) -> bool:
        """Still the same arrays, as the full check saw them?"""
        if self.src() is not src or self.dst() is not dst:
            return False
        try:
            return (src.dtype is self.dtype and dst.dtype is self.dtype and
                    src.nbytes == self.nbytes[0] and dst.nbytes == self.nbytes[1] and
                    dst.flags.writeable and ffi.from_buffer(src) == self.src_ptr and
                    ffi.from_buffer(dst) == self.dst_ptr)
        except ValueError:  # no longer C-contiguous (strides set): the full way says so
            return False


class PreparedCache:
    """One team's kept commands of one collective, by the identities of (src, dst)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], Prepared] = {}

    def get(self, src: Any, dst: Any, variant: str | None = None) -> Prepared | None:
        p = self._entries.get((id(src), id(dst)))
        if p is None or p.variant != variant or not p.matches(src, dst):
            return None
        return p

    def keep(self, src: Any, dst: Any, op: Any, what: str, variant: str | None = None,
             itemsize: int | None = None) -> None:
        """Keep op (encoded, with its cookies) for the next call on exactly these numpy
        arrays; other buffer types always take the full way."""
        if type(src) is not np.ndarray or type(dst) is not np.ndarray or \
                src.nbytes == 0 or dst.nbytes == 0:
            return
        entries = self._entries
        if len(entries) >= MAX_ENTRIES:
            # Dead arrays' entries first; if all live, the oldest.
            dead = [k for k, p in entries.items() if p.src() is None or p.dst() is None]
            for k in dead or [next(iter(entries))]:
                del entries[k]
        entries[(id(src), id(dst))] = Prepared(src, dst, op, what, variant, itemsize)

    def clear(self) -> None:
        self._entries.clear()
