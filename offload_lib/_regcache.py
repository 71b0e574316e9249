"""Cookies for host_post's registration cache (host/src/host_mr.c).

host_post keeps what it registers for an op's buffer and reuses it for the next op on the
same memory, under a cookie that names the buffer's exporter. The cookie ends when the
exporter dies (a weakref finalizer, run before the exporter's memory is freed) or when its
memory moved (an array resized in place): the C side then drops the registrations made
under it. Memory freed and allocated again at the same address belongs to another exporter,
so another cookie, and is registered again: a stale registration is never reused.

Exporters that cannot be weakly referenced get no cookie; their buffers are registered for
one op, as before the cache.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from offload_lib._native import lib

if TYPE_CHECKING:
    from offload_lib._buffers import Buffer
    from offload_lib.context import Context


def _owner(obj: Any) -> tuple[Any, bool]:
    """The object whose life bounds the memory of obj: a numpy view's base array (the
    view keeps it alive, so it dies no earlier), else obj itself; and whether it is obj."""
    if isinstance(obj, np.ndarray):
        base = obj.base
        owner = obj
        while isinstance(base, np.ndarray):
            owner, base = base, base.base
        return owner, owner is obj
    return obj, True


class Cookies:
    """One context's cookies, by exporter (keyed by id: an entry leaves when it dies)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = weakref.ref(ctx)
        self._next = 0
        # id(owner) -> (where its memory was, cookie, finalizer)
        self._by_owner: dict[int, tuple[int, int, weakref.finalize]] = {}

    def cookie(self, buf: Buffer) -> int:
        """The cookie for buf's exporter; 0 where none can be kept."""
        entry = self._by_owner.get(id(buf.obj))
        if entry is not None and entry[0] == buf.addr:
            return entry[1]  # an exporter we know (live: its entry goes when it dies), unmoved
        owner, itself = _owner(buf.obj)
        where = buf.addr if itself else owner.__array_interface__["data"][0]
        key = id(owner)
        entry = self._by_owner.get(key)
        if entry is not None:
            if entry[0] == where:
                return entry[1]
            self._end(key, entry[1])  # its memory moved: what was registered is stale
        try:
            cookie = self._next = self._next + 1
            fin = weakref.finalize(owner, self._end, key, cookie)
        except TypeError:
            return 0  # not weakly referable: registered per op
        fin.atexit = False
        self._by_owner[key] = (where, cookie, fin)
        return cookie

    def _end(self, key: int, cookie: int) -> None:
        entry = self._by_owner.get(key)
        if entry is not None and entry[1] == cookie:
            del self._by_owner[key]
            entry[2].detach()
        ctx = self._ctx()
        if ctx is not None and not ctx.closed:
            lib.host_mr_invalidate(ctx._ptr, cookie)

    def close(self) -> None:
        """The context closed (its registrations went with it): forget every exporter."""
        for _, _, fin in list(self._by_owner.values()):
            fin.detach()
        self._by_owner.clear()
