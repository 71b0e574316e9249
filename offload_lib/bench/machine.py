"""The machine the ranks run on: ``--background-load`` and ``--fixed-layout``.

``--fixed-layout``: the ranks start with address-space layout randomization off.

On a machine whose ranks share cores, a small op's time depends on where each process's
libraries landed: two processes that take turns on a core with their code at the same
addresses find the branch predictors trained for them, and with randomized layouts they do
not, by a different amount in every job. On this 2-vCPU VM, 1 KiB all-to-alls at n=4: with
ASLR each job's times spread 11-17 us (ours) and 13-16 us (Open MPI), their ratio
0.88-1.15; with the layout fixed, 10.1-10.7 and 9.6-10.0 us in every job
(docs/performance.md, nineteenth session). Fixed, a comparison between builds or libraries
repeats; with ASLR, as users run, it is one draw of the layouts.

Linux's personality flag ADDR_NO_RANDOMIZE (what ``setarch -R`` sets) is inherited by the
launcher's or mpirun's children and applies from their exec on; this process keeps its own
layout and gets its flag back afterwards.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
import sys
from collections.abc import Iterator

ADDR_NO_RANDOMIZE = 0x0040000
_QUERY = 0xFFFFFFFF  # personality(0xffffffff) returns the persona and changes nothing


class LayoutError(RuntimeError):
    """The kernel would not turn address-space randomization off for the ranks."""


def _personality(persona: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.personality
    fn.argtypes, fn.restype = [ctypes.c_ulong], ctypes.c_int
    rc = fn(persona)
    if rc == -1:
        err = ctypes.get_errno()
        raise LayoutError(f"personality() failed: {os.strerror(err)}"
                          + (" (a container's seccomp profile may forbid ADDR_NO_RANDOMIZE; "
                             "run without --fixed-layout)" if err == errno.EPERM else ""))
    return rc


@contextlib.contextmanager
def fixed_layout(on: bool) -> Iterator[None]:
    """Within the block, processes this one starts run with a fixed address layout."""
    if not on:
        yield
        return
    old = _personality(_QUERY)
    _personality(old | ADDR_NO_RANDOMIZE)
    if not _personality(_QUERY) & ADDR_NO_RANDOMIZE:
        _personality(old)
        raise LayoutError("personality() did not keep ADDR_NO_RANDOMIZE")
    try:
        yield
    finally:
        _personality(old)


def layout_randomized() -> bool:
    """Was this process's address layout randomized at its exec?"""
    try:
        with open("/proc/sys/kernel/randomize_va_space", encoding="ascii") as f:
            if f.read().strip() == "0":
                return False
        with open("/proc/self/personality", encoding="ascii") as f:
            return not int(f.read(), 16) & ADDR_NO_RANDOMIZE
    except (OSError, ValueError):
        return True  # not Linux, or no procfs: assume the usual


# One per core, at the lowest priority: the load a data loader or a logger puts on a
# machine, which must not slow a collective down (the ranks do not yield to it). In a session
# of their own, as someone else's process: with autogroup, nice counts only within a session,
# and the ranks (ours under the launcher, both libraries' under mpirun) must not share one
# with the loops in one run and not in another.
_BUSY_LOOP = "import os\nos.nice(19)\nwhile True:\n    pass\n"


@contextlib.contextmanager
def background_load(on: bool) -> Iterator[None]:
    """Within the block, one busy loop per core runs beside whatever this process starts."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if on:
            for _ in range(len(os.sched_getaffinity(0))):
                procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP],
                                              stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
