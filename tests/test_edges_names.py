"""Jobs and their names in /dev/shm (issue 15): ranks die with their launcher, the stale
sweep removes only what no live process uses, object names are unguessable and checked
after opening, the file bootstrap is authenticated, and two jobs forced to one name do not
merge. Each test failed before its fix.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from offload_lib.launcher import SHM_DIR, job_segments, new_job_name

RANK = r'''
import os, sys, time
import numpy as np
import offload_lib as ol
out = sys.argv[1]
ctx = ol.init()
a = ctx.empty(1024, np.int64)           # a ctx.empty() segment besides the job segment
open(os.path.join(out, f"pid{ctx.rank}"), "w").write(str(os.getpid()))
src = np.arange(4 * ctx.size, dtype=np.int64) + 100 * ctx.rank
for i in range(int(os.environ.get("ROUNDS", "1000000"))):
    a[:] = 0
    ctx.world.alltoall(src, a[:src.size]).wait(timeout=30)
    want = np.concatenate([np.arange(4 * ctx.rank, 4 * ctx.rank + 4) + 100 * p
                           for p in range(ctx.size)])
    assert (a[:src.size] == want).all(), a[:src.size]
    time.sleep(0.05)
open(os.path.join(out, f"ok{ctx.rank}"), "w").write("ok")
ctx.close()
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OFFLOAD_") and k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _wait_files(d, names, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(d, n)) for n in names):
        assert time.monotonic() < deadline, f"{names} never appeared in {os.listdir(d)}"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(") ")[1][0] != "Z"


def _hand_job(tmp_path, job: str, size: int, key: str, rounds: str = "1000000"):
    """Ranks started by hand (the launcher's environment, no launcher)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return [subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                             env=_env(OFFLOAD_RANK=str(r), OFFLOAD_SIZE=str(size),
                                      OFFLOAD_JOB=job, OFFLOAD_JOB_KEY=key, ROUNDS=rounds),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for r in range(size)]


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


# -- item 6: ranks die with their launcher; the sweep spares live jobs ----------------------

@pytest.mark.timeout(60)
def test_ranks_die_with_a_killed_launcher(tmp_path):
    """SIGKILL to `dpa-offload run`: its ranks die within a second, and the next job's
    start removes what they left in /dev/shm (before: they ran on, and the next job
    deleted their live segments)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "offload_lib.cli", "run", "-n", "2", "--", sys.executable,
         str(script), str(tmp_path)], env=_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    pids: list[int] = []
    try:
        _wait_files(tmp_path, ["pid0", "pid1"])
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        jobs = {n.split("-r")[0] for n in os.listdir(SHM_DIR)
                if n.startswith(f"dpaoff-{os.getuid()}-{launcher.pid}-")}
        assert jobs, "the job's segments are not in /dev/shm"
        launcher.kill()
        launcher.wait()
        t0 = time.monotonic()
        while any(_alive(p) for p in pids):
            assert time.monotonic() - t0 < 1.0, "ranks outlived their launcher by 1 s"
            time.sleep(0.01)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in pids:  # a failed check must not leave them running
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    import offload_lib as ol  # the next job's start sweeps what the dead job left
    with ol.init():
        pass
    for job in jobs:
        assert not job_segments(job), job_segments(job)


@pytest.mark.timeout(90)
def test_the_stale_sweep_spares_a_live_job(tmp_path):
    """A live job whose name carries a dead pid (its launcher died, or a name made by
    hand): another job's start must not delete its segments (before: it did, and the live
    job then failed with RemoteAccessError)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    job = new_job_name(owner_pid=dead.pid)
    procs = _hand_job(tmp_path, job, 2, secrets.token_hex(8))
    try:
        _wait_files(tmp_path, ["pid0", "pid1"])
        before = job_segments(job)
        assert len(before) >= 3, before  # the job segment and two ctx.empty() segments
        import offload_lib as ol
        with ol.init():  # rank 0 of a one-rank job: sweeps stale segments
            pass
        assert job_segments(job) == before, "the sweep removed a live job's segments"
        time.sleep(0.5)  # the live job goes on exchanging through them
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
    finally:
        _stop(procs)
    import offload_lib as ol
    with ol.init():  # now they are stale: the next start removes them
        pass
    assert not job_segments(job), job_segments(job)


# -- item 7: names nobody can guess or plant --------------------------------------------------

@pytest.mark.timeout(60)
def test_planted_names_neither_block_nor_feed_a_job(tmp_path):
    """Files planted under the names a job would use next (ctx.empty() segments, the
    bootstrap's) neither make ctx.empty() fail nor reach the job (before: "File exists",
    and the file bootstrap handed the planted bytes to rank 0)."""
    job = new_job_name()
    key = secrets.token_hex(8)
    for name in [f"{job}-r{r}-s{s}" for r in range(2) for s in range(1, 9)] + \
            [f"{job}-ag0-r{r}" for r in range(2)]:
        with open(os.path.join(SHM_DIR, name), "wb") as f:
            f.write(b"planted")
    procs = _hand_job(tmp_path, job, 2, key, rounds="3")
    try:
        for p in procs:
            out = p.communicate(timeout=45)[0].decode()
            assert p.returncode == 0, out
        _wait_files(tmp_path, ["ok0", "ok1"])
    finally:
        _stop(procs)
        for name in os.listdir(SHM_DIR):
            if name.startswith(job):
                os.unlink(os.path.join(SHM_DIR, name))

    from offload_lib.bootstrap import World, allgather
    from offload_lib.errors import OffloadError
    # the file bootstrap: a planted answer is no answer (it waits for rank 1's, then times out)
    job = new_job_name()
    os.makedirs(os.path.join(SHM_DIR, f"{job}.boot"), mode=0o700)
    with open(os.path.join(SHM_DIR, f"{job}.boot", "ag0-r1"), "wb") as f:
        f.write(b"planted bytes")
    try:
        with pytest.raises(OffloadError, match="rank 1"):
            allgather(World(0, 2, job, "dpa-offload", key=key), b"mine", timeout=0.5)
    finally:
        import shutil
        shutil.rmtree(os.path.join(SHM_DIR, f"{job}.boot"), ignore_errors=True)


@pytest.mark.timeout(60)
def test_a_job_segment_someone_else_made_is_refused(tmp_path):
    """A job segment that exists before the job, with a mode that lets others in (or, run
    as root, another owner), is refused at init instead of used."""
    job = new_job_name()
    path = os.path.join(SHM_DIR, job)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
    os.fchmod(fd, 0o666)
    os.close(fd)
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import offload_lib as ol; ol.init()"],
            env=_env(OFFLOAD_RANK="0", OFFLOAD_SIZE="2", OFFLOAD_JOB=job,
                     OFFLOAD_JOB_KEY=secrets.token_hex(8), OFFLOAD_BOOTSTRAP_TIMEOUT="2"),
            capture_output=True, text=True, timeout=30)
        assert out.returncode != 0
        assert "not a private file of this user" in out.stderr, out.stderr
        assert os.stat(path).st_size == 0, "the refused segment was used"
    finally:
        os.unlink(path)


# -- item 8: two jobs forced to one name ------------------------------------------------------

@pytest.mark.timeout(90)
def test_two_jobs_under_one_name_do_not_merge(tmp_path):
    """Jobs A and B forced to the same OFFLOAD_JOB, their ranks started interleaved: one
    job runs, every rank of the other fails at init with "job name in use", and no rank
    exchanges data with the other job (before: A0 paired with B1)."""
    job = new_job_name()
    keys = {"A": secrets.token_hex(8), "B": secrets.token_hex(8)}
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    procs = {}
    for r in range(2):
        for name in "AB":
            d = tmp_path / name
            d.mkdir(exist_ok=True)
            procs[name, r] = subprocess.Popen(
                [sys.executable, str(script), str(d)],
                env=_env(OFFLOAD_RANK=str(r), OFFLOAD_SIZE="2", OFFLOAD_JOB=job,
                         OFFLOAD_JOB_KEY=keys[name], ROUNDS="3",
                         OFFLOAD_BOOTSTRAP_TIMEOUT="10"),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        outs = {k: p.communicate(timeout=60)[0].decode() for k, p in procs.items()}
    finally:
        _stop(procs.values())
        for name in os.listdir(SHM_DIR):
            if name.startswith(job):
                os.unlink(os.path.join(SHM_DIR, name))
    ok = {name for name in "AB"
          if all(procs[name, r].returncode == 0 for r in range(2))}
    assert len(ok) == 1, outs
    other = ({"A", "B"} - ok).pop()
    for r in range(2):
        assert procs[other, r].returncode != 0, outs
        assert "job name in use" in outs[other, r], outs[other, r]
