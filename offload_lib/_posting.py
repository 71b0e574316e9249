"""The internal posting interface: what the package's own posters beside Team may ask of
a Context, and nothing more.

Team encodes a collective (_commands.py) and submits it through its context. Two posters
build commands of their own and post them from elsewhere: the GPU stager (_staging.py:
staged pieces from its poster thread, GPUDirect ops on dma-buf keys, cancels from its
completer) and the reductions (_reduce.py: a command naming registered scratch). They hold
a Posting over the context instead of reaching into its members:

- ``command(cmd)``: post a _commands.Command on host buffers; host_post registers them
  once and keeps that for the next op on them (the registration cache). A Request.
- ``op(op, what, keep, result, nbytes, itemsize)``: post a ``struct host_op`` whose keys
  the caller set (registered with ``register``/``register_dmabuf``); ``keep`` stays alive
  until the op completed. A Request.
- ``cancel(req)``: abort a posted Request; host_cancel's answer (0, or -ENOENT when it had
  completed), so that a poster thread never raises for a race with the completion.
- ``register(buf, access)``: (key, owned) for a host buffer; ``owned``: this call made the
  registration and its caller releases it.
- ``cookie(buf)``: the registration cache's cookie for a host buffer's exporter (0: none
  kept), for a command whose buffers host_post registers.
- ``register_dmabuf(base, length, fd, access)``: the key of GPU memory exported as a
  dma-buf (GPUDirect); raises OffloadError where the device cannot register it.
- ``release(key)``: give back a key from either register call (a no-op once closed).
- ``scratch()``: the context's pool of registered reduction scratch.

Everything here is the context's own posting (ordering behind earlier GPU ops, orphan
reaping, the post timeout): a Posting adds no state of its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offload_lib._native import ffi, lib
from offload_lib.errors import check_rc

if TYPE_CHECKING:
    from offload_lib import _commands, _reduce
    from offload_lib._buffers import Buffer
    from offload_lib.context import Context
    from offload_lib.request import Request, Result


class Posting:
    """The posting interface of one Context (see the module)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    def command(self, cmd: _commands.Command) -> Request:
        return self._ctx._post_host(cmd)

    def op(self, op: Any, what: str, keep: tuple[Any, ...], result: Result | None = None,
           nbytes: int = 0, itemsize: int | None = None) -> Request:
        return self._ctx._post(op, what, keep, result, nbytes, itemsize)

    def cancel(self, req: Request) -> int:
        ctx = self._ctx
        return int(lib.host_cancel(ctx._handle(), req._tag, ctx._post_timeout_ns))

    def register(self, buf: Buffer, access: int) -> tuple[int, bool]:
        return self._ctx._register(buf, access)

    def cookie(self, buf: Buffer) -> int:
        return self._ctx._cookies.cookie(buf)

    def register_dmabuf(self, base: int, length: int, fd: int, access: int) -> int:
        key = ffi.new("uint32_t *")
        check_rc(lib.host_mr_acquire_dmabuf(self._ctx._handle(), base, length, fd, access, key),
                 "registering GPU memory for GPUDirect RDMA")
        return int(key[0])

    def release(self, key: int) -> None:
        self._ctx._release_key(key)

    def scratch(self) -> _reduce.ScratchPool:
        return self._ctx._scratch()
