"""A witness of the times this machine's CPUs did not run at all, for hang checks on VMs.

A hypervisor stops a VM's vCPUs now and then (a CPU quota spent, a nested host's own
scheduling): on this VM under busy loops, for ~100 ms at a time, several times a second.
The guest cannot always tell: steal time shows some of it and not the rest
(docs/performance.md). While a vCPU is stopped, every rank on it waits, whatever library it
uses. The witness is one process pinned to each CPU that sleeps 1 ms at a time, real-time
(SCHED_FIFO) where allowed: it then wakes late only when its CPU did not run at all (checked
against `perf sched`: each late wake is a gap with no scheduler event on that CPU). Without
the privilege it runs at nice 0, which preempts ``nice -n 19`` loops but can wait a few ms
behind busy ranks, and overstates a stop by that much. Processes, not threads: a thread
stopped with the GIL held would make the others wake late too. Each late wake, over LATE_S,
is appended to the file as "cpu start end" (time.monotonic seconds: a hang check times its
ops on that clock). A stop is on record only once its CPU runs again, and an op can end while
another CPU is still stopped (its part there was done): each witness also keeps the time of
its last wake in FILE.beat, and stopped_during waits until every CPU's witness has woken
after t1.

    python tests/_pause_witness.py FILE     # until killed, or its parent dies

A hang check subtracts ``stopped_during(FILE, t0, t1)`` from what it measured.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import signal
import struct
import sys
import time

LATE_S = 0.005  # a wake this much later than asked for is a stop, not scheduling noise
WAIT_S = 3.0  # the longest stop stopped_during waits out (VM stops seen here: up to ~1 s)
BEAT = struct.Struct("d")  # one per CPU in FILE.beat: the time of its witness's last wake
_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before we armed
        os._exit(0)


def _watch(cpu: int, slot: int, out: int, beats: mmap.mmap) -> None:
    os.sched_setaffinity(0, {cpu})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except PermissionError:
        if slot == 0:
            print("pause witness: SCHED_FIFO refused, running at nice 0: a wait behind busy "
                  "threads may be recorded as a stop", file=sys.stderr)
    last = time.monotonic()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        if now - last > 0.001 + LATE_S:
            os.write(out, f"{cpu} {last + 0.001:.6f} {now:.6f}\n".encode())
        BEAT.pack_into(beats, slot * BEAT.size, now)  # after the stop is on record
        last = now


def _wait_beats(path: str, t1: float) -> None:
    """Until every CPU's witness has woken after t1 (or WAIT_S passed)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(path + ".beat", "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        if data and min(b for (b,) in BEAT.iter_unpack(data)) > t1:
            return
        time.sleep(0.001)


def stopped_during(path: str, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which some CPU's witness did not run (the union of the
    late wakes recorded in path), once every CPU's witness has run after t1."""
    _wait_beats(path, t1)
    spans = []
    try:
        with open(path) as f:
            for line in f:
                _, a, b = line.split()
                lo, hi = max(float(a), t0), min(float(b), t1)
                if lo < hi:
                    spans.append((lo, hi))
    except FileNotFoundError:
        return 0.0
    total, end = 0.0, t0
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def main(path: str) -> None:
    _die_with(os.getppid())  # the test that started us
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    cpus = sorted(os.sched_getaffinity(0))
    with open(path + ".beat", "w+b") as f:
        f.truncate(BEAT.size * len(cpus))  # zeros: no wake yet
        beats = mmap.mmap(f.fileno(), 0)
    parent = os.getpid()
    for slot, cpu in enumerate(cpus):
        if os.fork() == 0:
            _die_with(parent)
            _watch(cpu, slot, out, beats)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1])
