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

from typing import Any

import numpy as np

from offload_lib import _fast
from offload_lib._native import ffi

# Entries per team, a few loops' worth: a program that cycles through more buffers than
# this takes the full way for some of them.
MAX_ENTRIES = 8


class PreparedCache:
    """One team's kept commands of one collective (_fast.Kept, host/py/kept.c), by the
    identities of (src, dst)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[tuple[int, int], Any] = {}

    def post(self, ctx: Any, src: Any, dst: Any, variant: str | None = None) -> Any:
        """The command kept for (src, dst) and variant, checked and posted in one C call (a
        Request); None when there is none, the arrays changed, or the context has staged
        ops or orphans to see to first (the full way does)."""
        if ctx._stager is not None or ctx._orphans:
            return None
        return _fast.post_kept(self._entries, variant, ctx, ctx._poll_ns, ctx._post_timeout_ns,
                               src, dst)

    def get(self, src: Any, dst: Any, variant: str | None = None) -> Any:
        """The command kept for (src, dst) and variant, if they are still what it was
        encoded for; else None."""
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
        try:
            kept = _fast.Kept(src, dst, int(ffi.cast("uintptr_t", op)), what, variant, itemsize)
        except (BufferError, ValueError, TypeError):  # not as the full check saw it: never kept
            return
        entries = self._entries
        if len(entries) >= MAX_ENTRIES:
            # Dead arrays' entries first; if all live, the oldest.
            dead = [k for k, p in entries.items() if not p.alive()]
            for k in dead or [next(iter(entries))]:
                del entries[k]
        entries[(id(src), id(dst))] = kept
