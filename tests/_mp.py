"""A small multi-rank harness: run one script as N ranks of a `dpa-offload run` job.

    out = run_ranks(3, '''
        ctx = ol.init()
        ...
        assert ...
    ''', timeout=60)

The body is dedented and prefixed with PRELUDE (imports, ``rank``/``size`` from the launcher's
environment and a ``check_equal`` helper); a line that marks the rank as finished is appended.
The test fails, with every rank's output, when the job exits non-zero, hits ``timeout``, or a
rank returns without reaching the end of the script. Returns each rank's output (stdout and
stderr, the ``[rank] `` prefix removed), indexed by rank.
"""
from __future__ import annotations

import io
import re
import os
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping

import pytest

from offload_lib.launcher import launch

__all__ = ["run_ranks", "run_job", "probe_tag", "PRELUDE", "DONE_MARK"]

DONE_MARK = "__rank_done__"

PRELUDE = '''\
import faulthandler, os, signal, sys, time
import numpy as np
import offload_lib as ol

# A rank stopped by the launcher (timeout, or a peer failed) shows where it was stuck.
faulthandler.register(signal.SIGTERM, chain=True)

rank = int(os.environ["OFFLOAD_RANK"])
size = int(os.environ["OFFLOAD_SIZE"])


def threads_left(prefixes=("dpa-", "fxm-"), wait=2.0):
    """This process's threads named with one of prefixes, once none is left or after
    `wait` s: a joined thread's /proc entry goes a moment after pthread_join returns (the
    kernel wakes the joiner at the thread's exit, before it reaps it)."""
    import glob

    deadline = time.monotonic() + wait
    while True:
        names = []
        for comm in glob.glob(f"/proc/{os.getpid()}/task/*/comm"):
            try:
                with open(comm) as f:
                    names.append(f.read().strip())
            except FileNotFoundError:  # reaped while we looked
                pass
        left = [t for t in names if t.startswith(prefixes)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def check_equal(got, want, what):
    """Element-by-element comparison; on mismatch say where and what."""
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} elements differ; first at [{i}]: "
            f"got {got[i]!r}, want {want[i]!r}"
        )


def own_session():
    """Go on in a session of our own, as torchrun starts its ranks. The launcher made us a
    process group leader, which setsid refuses: a child goes on, we wait for it (passing
    the launcher's SIGTERM and SIGINT on, so that its traceback shows) and end as it did;
    it dies with us."""
    import ctypes

    parent = os.getpid()
    child = os.fork()
    if child:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: os.kill(child, signum))
        status = os.waitpid(child, 0)[1]
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before we armed
        os._exit(1)
    os.setsid()

'''


def _split_by_rank(text: str, n: int) -> tuple[list[str], list[str]]:
    per_rank: list[list[str]] = [[] for _ in range(n)]
    other: list[str] = []
    for line in text.splitlines():
        if line.startswith("["):
            head, sep, rest = line.partition("] ")
            if sep and head[1:].isdigit() and int(head[1:]) < n:
                per_rank[int(head[1:])].append(rest)
                continue
        other.append(line)
    return ["\n".join(lines) for lines in per_rank], other


def run_job(n: int, script_body: str, timeout: float = 60,
            env: Mapping[str, str] | None = None, grace: float = 3.0
            ) -> tuple[int, list[str], list[str], float]:
    """Run ``script_body`` as ``n`` ranks and report, without judging: (launcher exit code,
    each rank's output, the launcher's own lines, seconds taken)."""
    body = textwrap.dedent(script_body)
    script = PRELUDE + body + f"\nprint({DONE_MARK!r}, flush=True)\n"
    run_env = dict(os.environ)
    # Never inherit a launch environment (e.g. pytest itself started under dpa-offload run).
    for key in ("OFFLOAD_RANK", "OFFLOAD_SIZE", "OFFLOAD_JOB", "OFFLOAD_LOCAL_RANK",
                "MASTER_ADDR", "MASTER_PORT"):
        run_env.pop(key, None)
    run_env["PYTHONUNBUFFERED"] = "1"
    run_env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a traceback
    if env:
        run_env.update(env)
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory(prefix="dpaoff-test-") as tmp:
        path = os.path.join(tmp, "rank_script.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        t0 = time.monotonic()
        rc = launch(n, [sys.executable, path], env=run_env, grace=grace, timeout=timeout,
                    stdout=out, stderr=err)
        elapsed = time.monotonic() - t0
    ranks, other = _split_by_rank(out.getvalue() + err.getvalue(), n)
    return rc, ranks, other, elapsed


def run_ranks(n: int, script_body: str, timeout: float = 60,
              env: Mapping[str, str] | None = None) -> list[str]:
    """Run ``script_body`` as ``n`` ranks; fail the test unless every rank finished cleanly."""
    rc, ranks, other, elapsed = run_job(n, script_body, timeout, env)
    missing = [r for r in range(n) if DONE_MARK not in ranks[r]]
    if rc != 0 or missing:
        why = ("timed out after %g s" % timeout) if rc == 124 else f"exit code {rc}"
        if rc == 0:
            why = f"rank(s) {missing} did not reach the end of the script"
        report = [f"{n}-rank job failed: {why} ({elapsed:.1f} s)"]
        for r in range(n):
            report.append(f"----- rank {r} -----\n{ranks[r]}")
        if other:
            report.append("----- launcher -----\n" + "\n".join(other))
        pytest.fail("\n".join(report), pytrace=False)
    return [text.replace(DONE_MARK, "").rstrip("\n") for text in ranks]


def probe_tag(ctx) -> int | None:
    """Post (and finish) a barrier and return its tag. The host numbers posts 1, 2, 3, ...,
    so two probes whose tags differ by one prove that nothing was posted in between."""
    req = ctx.world.barrier()
    req.wait(timeout=10)
    m = re.search(r"tag=(\d+)", repr(req))
    return int(m.group(1)) if m else None
