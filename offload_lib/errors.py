"""Exception hierarchy shared by every module of offload_lib.

Host C calls return 0 or a negative errno, which :func:`check_rc` turns into an exception;
an error completion's status (enum offload_status) goes through :func:`completion_error`.
"""
from __future__ import annotations

import errno
import os

from offload_lib._native import lib


def brief(value: object) -> str:
    """``value`` for an error message: its repr if short, else its type (an array passed
    where a number or a name goes would print whole)."""
    text = repr(value)
    return text if len(text) <= 80 else f"a {type(value).__module__}.{type(value).__name__}"


class OffloadError(Exception):
    """Base class of every error raised by offload_lib."""


class InvalidArgument(OffloadError, TypeError):
    """Bad input detected before anything was posted (or answered by the firmware)."""


class PeerFailure(OffloadError):
    """A peer rank died or became unreachable; ``rank`` names it."""

    def __init__(self, message: str, rank: int = -1) -> None:
        super().__init__(message)
        self.rank = rank


class PeerClosed(PeerFailure):
    """A peer rank closed its context (it left the job cleanly) before taking its part;
    ``rank`` names it. It did not fail: ``ctx.failed_ranks()`` does not list it,
    ``ctx.closed_ranks()`` does."""


class Timeout(OffloadError):
    """An operation did not complete within its time bound."""


class Canceled(OffloadError):
    """The request was cancelled with ``Request.cancel()``."""


class RemoteAccessError(OffloadError):
    """A remote read/write was refused: bad rkey, out of bounds or wrong access."""


class Unsupported(OffloadError, NotImplementedError):
    """The operation exists elsewhere but not in this backend or build; the message says
    what is supported instead."""


class ConfigError(InvalidArgument):
    """A configuration key is unknown or has a bad value."""


# enum offload_status (offload_abi.h), by name
OK = lib.OFFLOAD_OK
ERR_INVALID = lib.OFFLOAD_ERR_INVALID
ERR_REMOTE_ACCESS = lib.OFFLOAD_ERR_REMOTE_ACCESS
ERR_PEER = lib.OFFLOAD_ERR_PEER
ERR_TIMEOUT = lib.OFFLOAD_ERR_TIMEOUT
ERR_NO_SPACE = lib.OFFLOAD_ERR_NO_SPACE
ERR_CANCELED = lib.OFFLOAD_ERR_CANCELED
ERR_UNSUPPORTED = lib.OFFLOAD_ERR_UNSUPPORTED
ERR_INTERNAL = lib.OFFLOAD_ERR_INTERNAL
ERR_PEER_OP = lib.OFFLOAD_ERR_PEER_OP
ERR_LINK_DOWN = lib.OFFLOAD_ERR_LINK_DOWN
ERR_COUNT_MISMATCH = lib.OFFLOAD_ERR_COUNT_MISMATCH
ERR_PEER_CLOSED = lib.OFFLOAD_ERR_PEER_CLOSED
ERR_MISMATCH = lib.OFFLOAD_ERR_MISMATCH

# What a signature's op field (opcode | mode << 8) holds, in words.
_OP_NAMES = {lib.OFFLOAD_OP_BARRIER: "barrier", lib.OFFLOAD_OP_ALLTOALL: "all-to-all",
             lib.OFFLOAD_OP_ALLTOALLV: "all-to-all-v", lib.OFFLOAD_OP_BROADCAST: "broadcast",
             lib.OFFLOAD_OP_ALLGATHER: "all-gather",
             lib.OFFLOAD_OP_AGREE: "create_team or shrink (an agreement)"}


def _op_name(sig_op: int) -> str:
    """A signature's op field (opcode | mode << 8) in words."""
    opcode = sig_op & ((1 << lib.OFFLOAD_SIG_MODE_SHIFT) - 1)
    name = _OP_NAMES.get(opcode, f"opcode {opcode}")
    mode = sig_op >> lib.OFFLOAD_SIG_MODE_SHIFT
    if mode & lib.OFFLOAD_CMD_F_SLOTS:
        name += " in slot mode"
    if mode & lib.OFFLOAD_CMD_F_PLACE:
        name = "placed " + name
    return name


def _mismatch_error(what: str, peer: int, result0: int, theirs: int,
                    itemsize: int | None) -> InvalidArgument:
    kind, ours = result0 >> lib.OFFLOAD_MISMATCH_SHIFT, result0 & ((1 << lib.OFFLOAD_MISMATCH_SHIFT) - 1)
    tail = ("; every rank must post the same collectives, in the same order and with the"
            " same arguments, on a team: nothing was moved and the team goes on")
    eager = lib.OFFLOAD_SIG_EAGER << lib.OFFLOAD_SIG_MODE_SHIFT
    if kind == lib.OFFLOAD_MISMATCH_OP and ours ^ theirs == eager:
        how = ("eagerly (the size is within its eager_max)", "with a ready (the size is above"
               " its eager_max)")
        mine, other = (how[0], how[1]) if ours & eager else (how[1], how[0])
        return InvalidArgument(f"{what}: rank {peer} sends its data {other} where this rank"
                               f" sends its data {mine}: set the same eager_max on every rank;"
                               " nothing was moved and the team goes on")
    if kind == lib.OFFLOAD_MISMATCH_OP:
        return InvalidArgument(f"{what}: rank {peer} runs {_op_name(theirs)} where this rank"
                               f" runs {_op_name(ours)}{tail}")
    if kind == lib.OFFLOAD_MISMATCH_ROOT:
        return InvalidArgument(f"{what}: rank {peer} names root {theirs} where this rank names"
                               f" root {ours}{tail}")
    if kind == lib.OFFLOAD_MISMATCH_SIZE:
        unit, size = ("bytes", 1) if itemsize is None else ("elements", itemsize)
        return InvalidArgument(f"{what}: rank {peer} moves blocks of size {theirs // size}"
                               f" {unit} where this rank's are {ours // size} {unit}{tail}")
    return InvalidArgument(f"{what}: rank {peer} built this team from another member list"
                           f" (or order, or team id: fingerprint {theirs:#x}, ours"
                           f" {ours:#x}){tail}")


def completion_error(what: str, status: int, detail: int, result0: int, result1: int,
                     itemsize: int | None = None) -> OffloadError:
    """The exception for an error completion of ``what`` (an op name); sizes in the
    message are in elements of ``itemsize`` bytes, or in bytes without it."""
    if status == ERR_INVALID:
        return InvalidArgument(
            f"{what}: the firmware rejected the command (sizes, counts or team do not match"
            f" across ranks; rank {detail} is involved)"
        )
    if status == ERR_COUNT_MISMATCH:
        unit, size = ("bytes", 1) if itemsize is None else ("elements", itemsize)
        return InvalidArgument(
            f"{what}: rank {detail} sends {result0 // size} {unit} but recv_counts (or the"
            f" output split sizes) expect {result1 // size} from it; nothing was written")
    if status == ERR_REMOTE_ACCESS:
        return RemoteAccessError(
            f"{what}: rank {detail} refused a remote access (unknown or revoked key, out of"
            " bounds, or wrong access rights)"
        )
    if status == ERR_PEER:
        return PeerFailure(
            f"{what}: rank {detail} failed (its process died or became unreachable); this"
            " team fails every later op: continue on ctx.create_team() over the survivors"
            " (ctx.failed_ranks() lists the dead)", rank=detail)
    if status == ERR_MISMATCH:
        return _mismatch_error(what, detail, result0, result1, itemsize)
    if status == ERR_PEER_CLOSED:
        return PeerClosed(
            f"{what}: rank {detail} closed its context (it left the job) before taking its"
            " part; this team fails every later op: continue on ctx.shrink() (or"
            " ctx.create_team() without it)", rank=detail)
    if status == ERR_TIMEOUT:
        return Timeout(
            f"{what}: the firmware aborted the op after op_timeout (a rank never posted its"
            " part?); this team fails every later op: create a new team, or raise op_timeout")
    if status == ERR_NO_SPACE:
        unit, size = ("bytes", 1) if itemsize is None else ("elements", itemsize)
        return InvalidArgument(
            f"{what}: destination too small: {result0 // size} {unit} arrive but dst holds"
            f" {result1 // size}; nothing was written"
        )
    if status == ERR_CANCELED:
        return Canceled(
            f"{what}: canceled (rank {detail} cancelled an op of this team); the team fails"
            " every later op: create a new team")
    if status == ERR_UNSUPPORTED:
        return Unsupported(f"{what}: not supported by this backend (see docs/hardware.md)")
    if status == ERR_LINK_DOWN:
        return PeerFailure(
            f"{what}: every rail to rank {detail} is down (no port left to reach it); this"
            " team fails every later op", rank=detail)
    if status == ERR_PEER_OP:
        return OffloadError(
            f"{what}: rank {detail} failed its part of the op (its own error says why: a"
            " destination too small, a cancel, its op_timeout); what it sent is not valid"
        )
    return OffloadError(f"{what}: internal error (status {status}, detail {detail})")


def check_rc(rc: int, what: str) -> None:
    """Raise for a negative errno returned by the host C API."""
    if rc >= 0:
        return
    err = -rc
    if err == errno.ETIMEDOUT:
        raise Timeout(f"{what}: timed out")
    if err == errno.EAGAIN:
        raise Timeout(f"{what}: the command ring stayed full (raise post_timeout or ring_entries)")
    if err == errno.EBUSY:
        raise OffloadError(f"{what}: too many requests were never waited for; call wait() on them")
    if err == errno.EINVAL:
        raise InvalidArgument(f"{what}: invalid argument")
    if err == errno.ENOSPC:
        raise OffloadError(f"{what}: out of registration slots; free buffers or requests")
    if err == errno.EPROTO:
        raise OffloadError(f"{what}: the job segment belongs to another job or the ranks disagree on its size")
    if err == errno.ESHUTDOWN:
        raise OffloadError(f"{what}: the context closed (ctx.close() was called while this "
                           "call was inside it)")
    if err == errno.EADDRINUSE:
        raise OffloadError(f"{what}: another live process already holds this rank")
    raise OffloadError(f"{what}: {os.strerror(err)}")
