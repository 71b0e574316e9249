"""Requests: a posted op's handle. ``test()`` reads its status, ``wait()`` sleeps on it."""
from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np

from offload_lib import _fast
from offload_lib._native import ffi, lib
from offload_lib.errors import (
    ERR_CANCELED,
    InvalidArgument,
    OffloadError,
    Timeout,
    brief,
    completion_error,
)

if TYPE_CHECKING:
    from offload_lib.context import Context

# Sleep in slices so Ctrl-C reaches Python while an op runs for a long time (as
# host/py/request.c's WAIT_SLICE_NS).
_WAIT_SLICE_S = 0.25
# Ops this small are driven by the calling thread (cooperative progress), or else waited
# for spinning briefly before sleeping: a wake-up costs tens of microseconds here, which
# only small ops notice, while spinning through a long op would take the CPU that
# offloading is meant to free.
SMALL_MAX_BYTES = 1024 * 1024
_COMP = ffi.typeof("struct host_completion *")
_TAG = ffi.typeof("uint32_t *")
Result = Callable[[Any], Any]


@dataclass(frozen=True)
class McastStats:
    """What one broadcast or all-gather did on this rank (``wait()`` returns it), as the
    firmware counted it (struct offload_mcast_op_stats)."""

    chunks_sent: int        # chunks this rank injected, once whatever the team's size
    bytes_injected: int     # bytes this rank put into the fabric
    chunks_received: int    # chunks that arrived by multicast
    chunks_dropped: int     # chunks that never arrived (lost, overrun) and were read again
    chunks_duplicated: int  # chunks that arrived once more after the first
    refetched_bytes: int    # bytes of those reads (RDMA READ from the owner)

    WORDS: ClassVar[int] = ffi.sizeof("struct offload_mcast_op_stats") // 8

    @classmethod
    def from_words(cls, words: Any) -> McastStats:
        """The counters from the struct's uint64 words, each field by its name there."""
        return cls(**{name: int(words[f.offset // 8]) for name, f in
                      ffi.typeof("struct offload_mcast_op_stats").fields})


class Request(_fast.RequestCore):
    """A one-shot, non-blocking op. Keeps its buffers alive until it completes.

    ``wait()`` and ``test()`` are C (offload_lib._fast, host/py/request.c) for the common
    case: no timeout, nothing to decode, the op went well. Everything else comes here:
    ``_wait_slow``, ``_test_slow``, ``_failed``, and ``_adopt_self`` for a request dropped
    before its op completed. Made by ``Request(ctx, tag, what, keep, result=None,
    poll_ns=0, itemsize=None)`` or by ``_fast.post``."""

    __slots__ = ("__weakref__",)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<Request {self._what} tag={self._tag} {state}>"

    def _finish(self, comp: Any) -> None:
        if comp.status != 0:
            self._failed(comp.status, comp.detail, comp.result0, comp.result1)
        self._done = True
        keep, self._keep = self._keep, ()
        if self._result is not None:
            self._value = self._result(comp)
        del keep

    def _failed(self, status: int, detail: int, result0: int, result1: int) -> None:
        """The op completed with an error: keep it for later waits, and raise it."""
        self._done = True
        self._keep = ()
        self._error = completion_error(self._what, status, detail, result0, result1,
                                       self._itemsize)
        raise self._error

    def _outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def _adopt_self(self) -> None:
        # An unwaited op may still write into its buffers: hand them to the context, which
        # keeps them alive until the completion arrives. One without buffers is forgotten.
        self._ctx._adopt(self._tag, self._keep)

    def cancel(self) -> bool:
        """Abort the op on this rank: True if it was cancelled, False if it had completed.

        Returns once the firmware let go of the buffers; ``wait()`` then raises Canceled.
        The team fails every later op (its peers' sequence no longer pairs with ours), and
        the peers' matching ops end at their op_timeout: use it to get out of a hang.
        """
        if self._done:
            return False
        handle = self._ctx._handle()
        bound = self._ctx._post_timeout_ns
        rc = lib.host_cancel(handle, self._tag, bound)
        if rc not in (0, -errno.ENOENT):  # it completed before the cancel arrived
            self._ctx._check(rc, f"cancelling {self._what}")
        comp = ffi.new("struct host_completion *")
        self._ctx._check(lib.host_wait(handle, self._tag, bound, 0, comp),
                         f"cancelling {self._what}")
        try:
            self._finish(comp)
        except OffloadError:
            pass
        return comp.status == ERR_CANCELED

    def _shut_first(self) -> None:
        # A wait()/test() the C path saw end (-ESHUTDOWN) or find the context closed raises
        # only once the device stopped, as Context._check does: its buffers may then go.
        ctx = self._ctx
        if ctx is not None and ctx._closed:
            ctx._shut.wait(timeout=30)

    def _test_slow(self) -> bool:
        if self._done:
            self._outcome()
            return True
        self._shut_first()
        comp = ffi.new(_COMP)
        rc = lib.host_test(self._ctx._handle(), self._tag, comp)
        self._ctx._check(rc, self._what)
        if rc == 0:
            return False
        self._finish(comp)
        return True

    def _wait_slow(self, timeout: float | None) -> Any:
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float, np.integer))):
            raise InvalidArgument(f"timeout must be a number of seconds or None, got {brief(timeout)}")
        if self._done:
            return self._outcome()
        self._shut_first()
        comp = ffi.new(_COMP)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            rc = lib.host_wait(self._ctx._handle(), self._tag, max(0, int(left * 1e9)),
                               self._poll_ns, comp)
            if rc == 0:
                self._finish(comp)
                return self._value
            if rc != -errno.ETIMEDOUT:  # this slice ended, the op goes on
                self._ctx._check(rc, self._what)
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"{self._what} did not complete within {timeout} s")


_fast.bind(*(int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
             for name in ("host_post", "host_wait", "host_test", "host_done")), Request)


class PersistentRequest(_fast.PersistentCore):
    """An op set up once and posted many times (``*_init``); buffers stay registered.

    post() and test() are the calls a loop makes between other work: their common case is
    in C (host/py/persistent.c: the tag kept there, the C API called straight away); the
    rest is here (a Request is made only for wait() and cancel())."""

    def __init__(self, ctx: Context, what: str, op: Any, keys: list[int], keep: tuple[Any, ...],
                 result: Result | None = None, nbytes: int = 0) -> None:
        super().__init__(ctx, op, int(ffi.cast("uintptr_t", op)), ctx._post_timeout_ns,
                         ctx._orphans)  # _staged: Context._persistent and _gpu set it
        self._what = what
        self._keys = keys
        self._keep = keep
        self._result = result
        self._nbytes = nbytes
        self._tagp = ffi.new(_TAG)
        self._comp = ffi.new(_COMP)
        op.small = nbytes <= SMALL_MAX_BYTES  # as _post_tag sets it; post() skips that

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("posted" if self._tag else "idle")
        return f"<PersistentRequest {self._what} {state}>"

    def _check(self) -> None:
        if self._ctx.closed:
            # Raised once the device stopped (as Context._check does): the caller may then
            # free the buffers a posted op was writing into.
            self._ctx._shut.wait(timeout=30)
            raise OffloadError(f"{self._what}: the context closed (persistent requests die "
                               "with it)")
        if self._freed:
            raise InvalidArgument(f"{self._what}: the persistent request was freed")

    def _post_slow(self) -> PersistentRequest:
        return self._post_checked()

    def _post_failed(self, rc: int) -> None:
        self._ctx._check(rc, f"posting {self._what}")  # raises for every error host_post returns
        raise RuntimeError(f"posting {self._what}: host_post returned {rc}")

    def _post_checked(self) -> PersistentRequest:
        self._check()
        if self._tag:
            raise InvalidArgument(
                f"{self._what}: already posted and not complete; call wait() before post()"
            )
        self._tag = self._ctx._post_tag(self._op, self._what, self._nbytes, self._tagp)
        return self

    def _request(self) -> Request:
        if self._req is None:
            self._req = Request(self._ctx, self._tag, self._what, self._keep, self._result,
                                self._ctx._poll_ns)
        return self._req

    def cancel(self) -> bool:
        """Abort the posted op (see Request.cancel); False if none was in flight."""
        self._check()
        if not self._tag:
            return False
        req = self._request()
        self._tag, self._req = 0, None
        return req.cancel()

    def _test_slow(self) -> bool:
        ctx = self._ctx
        if ctx._closed or self._freed:
            self._check()
        tag = self._tag
        if not tag:
            return True
        if self._req is not None:  # a wait() timed out on it before
            if not self._req.test():
                return False
            self._tag, self._req = 0, None
            return True
        comp = self._comp
        rc = lib.host_test(ctx._ptr, tag, comp)
        if rc == 0:
            return False
        self._tag = 0
        if rc < 0:
            self._ctx._check(rc, self._what)
        if comp.status != 0:
            self._failed(comp.status, comp.detail, comp.result0, comp.result1)
        return True

    def _failed(self, status: int, detail: int, result0: int, result1: int) -> None:
        raise completion_error(self._what, status, detail, result0, result1)

    def wait(self, timeout: float | None = None) -> Any:
        self._check()
        if not self._tag:
            raise InvalidArgument(f"{self._what}: wait() without a post()")
        req = self._request()
        try:
            return req.wait(timeout)
        except Timeout:
            if not req._done:
                raise  # still posted: wait() or test() again
            self._tag, self._req = 0, None
            raise
        except OffloadError:
            self._tag, self._req = 0, None
            raise
        finally:
            if req._done:
                self._tag, self._req = 0, None

    def free(self) -> None:
        """Release the registrations; waits for a posted op first."""
        if self._freed:
            return
        if self._tag and not self._ctx.closed:
            self.wait()
        self._freed = True
        if not self._ctx.closed:
            for key in self._keys:
                lib.host_mr_release(self._ctx._handle(), key)
        self._keys = []
        self._keep = ()

    def __enter__(self) -> PersistentRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
