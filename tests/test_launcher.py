"""offload_lib.launcher and the `dpa-offload` CLI: real child processes, each under a timeout."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from offload_lib import cli
from offload_lib.errors import InvalidArgument
from offload_lib.launcher import SHM_DIR, cleanup_stale_segments, job_segments, launch, new_job_name

REPO = Path(__file__).resolve().parents[1]
JOB_RE = re.compile(r"dpaoff-\d+-\d+-[0-9a-f]{16}")
SLACK = 2.0  # scheduling noise on a loaded CI machine


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def run(nprocs: int, code: str, **kw) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    rc = launch(nprocs, py(code), stdout=out, stderr=err, **kw)
    return rc, out.getvalue(), err.getvalue(), time.monotonic() - t0


PRELUDE = """
import os, signal, sys, time
rank = int(os.environ["OFFLOAD_RANK"])
"""


def test_new_job_name():
    name = new_job_name()
    assert JOB_RE.fullmatch(name)
    assert name.startswith(f"dpaoff-{os.getuid()}-{os.getpid()}-")
    assert new_job_name(owner_pid=1234).split("-")[2] == "1234"
    assert new_job_name() != name


@pytest.mark.timeout(60)
def test_ranks_get_env_and_prefixed_output():
    code = PRELUDE + """
e = os.environ
print(f"rank={e['OFFLOAD_RANK']} size={e['OFFLOAD_SIZE']} local={e['OFFLOAD_LOCAL_RANK']} "
      f"job={e['OFFLOAD_JOB']} extra={e.get('MY_VAR')}")
print(f"to stderr {rank}", file=sys.stderr)
sys.stdout.write("no newline")
"""
    rc, out, err, _ = run(3, code, env={**os.environ, "MY_VAR": "passed"})
    assert rc == 0
    lines = out.splitlines()
    jobs = set()
    for r in range(3):
        (line,) = [ln for ln in lines if ln.startswith(f"[{r}] rank=")]
        m = re.fullmatch(rf"\[{r}\] rank={r} size=3 local={r} job=(\S+) extra=passed", line)
        assert m, line
        jobs.add(m.group(1))
        assert f"[{r}] no newline" in lines
        assert f"[{r}] to stderr {r}" in err.splitlines()
    (job,) = jobs  # one job name shared by all ranks
    assert JOB_RE.fullmatch(job)
    assert "to stderr" not in out and "rank=" not in err


@pytest.mark.timeout(60)
def test_ranks_share_the_launchers_session_in_groups_of_their_own():
    """A session of its own would be a scheduling group of its own (autogroup): a rank
    moved onto a CPU other sessions kept busy waited there up to 788 ms. A process group
    of its own: the terminal's Ctrl-C reaches the launcher only, and killpg a rank's
    children."""
    code = PRELUDE + """
print(f"sid={os.getsid(0)} pgid={os.getpgid(0)} pid={os.getpid()}")
"""
    rc, out, _, _ = run(2, code)
    assert rc == 0
    rows = re.findall(r"\[\d\] sid=(\d+) pgid=(\d+) pid=(\d+)", out)
    assert len(rows) == 2, out
    for sid, pgid, pid in rows:
        assert int(sid) == os.getsid(0) and pgid == pid, out


@pytest.mark.timeout(60)
def test_large_output_does_not_deadlock():
    code = PRELUDE + """
line = "x" * 999
for i in range(2000):
    print(line)
    print(line, file=sys.stderr)
print("y" * 200_000)  # one line longer than a pipe buffer
"""
    rc, out, err, _ = run(2, code)
    assert rc == 0
    assert len(out.splitlines()) == 2 * 2001 and len(err.splitlines()) == 2 * 2000
    assert f"[1] {'y' * 200_000}" in out.splitlines()


@pytest.mark.timeout(60)
def test_failing_rank_stops_the_survivors():
    code = PRELUDE + """
if rank == 1:
    time.sleep(0.2)
    sys.exit(3)
time.sleep(60)
"""
    grace = 0.5
    rc, _, err, elapsed = run(3, code, grace=grace)
    assert rc == 3
    assert "dpa-offload run: rank 1 failed (exit code 3)" in err
    assert "stopped rank(s) 0, 2" in err
    assert elapsed < grace + 3 + SLACK


@pytest.mark.timeout(60)
def test_survivors_may_exit_on_their_own_within_grace():
    code = PRELUDE + """
if rank == 0:
    sys.exit(7)
time.sleep(0.3)
print("observed the failure", file=sys.stderr)
sys.exit(1)
"""
    rc, _, err, elapsed = run(3, code, grace=20.0)
    assert rc == 7  # the first failure decides
    assert "rank 0 failed (exit code 7)" in err
    assert "[1] observed the failure" in err and "[2] observed the failure" in err
    assert "stopped" not in err
    assert elapsed < 10


@pytest.mark.timeout(60)
def test_rank_killed_by_signal():
    code = PRELUDE + """
if rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""
    rc, _, err, elapsed = run(3, code, grace=0.2)
    assert rc == 128 + signal.SIGKILL
    assert "dpa-offload run: rank 2 failed (killed by SIGKILL)" in err
    assert elapsed < 0.2 + 3 + SLACK


@pytest.mark.timeout(60)
def test_survivor_ignoring_sigterm_gets_sigkill():
    code = PRELUDE + """
if rank == 0:
    time.sleep(1.0)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(60)
"""
    grace = 0.2
    rc, _, err, elapsed = run(2, code, grace=grace)
    assert rc == 1
    assert "stopped rank(s) 1" in err
    assert 1.0 + grace + 2.0 - 0.1 < elapsed < 1.0 + grace + 3 + SLACK


@pytest.mark.timeout(60)
def test_timeout_stops_everything():
    rc, _, err, elapsed = run(2, PRELUDE + "time.sleep(60)\n", timeout=0.5)
    assert rc == 124
    assert "timeout of 0.5 s expired" in err
    assert elapsed < 0.5 + 3 + SLACK


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exit_code", [0, 4])
def test_leftover_shm_segments_are_removed(exit_code):
    code = PRELUDE + f"""
job = os.environ["OFFLOAD_JOB"]
for suffix in ("", f".rank{{rank}}"):
    open(os.path.join("{SHM_DIR}", job + suffix), "w").close()
print("job", job)
sys.exit({exit_code} if rank == 1 else 0)
"""
    rc, out, _, _ = run(2, code)
    assert rc == exit_code
    job = re.search(r"job (\S+)", out).group(1)
    assert job_segments(job) == []


@pytest.mark.timeout(60)
def test_missing_program_returns_127():
    err = io.StringIO()
    assert launch(2, ["/nonexistent/program"], stderr=err) == 127
    assert "/nonexistent/program" in err.getvalue()


@pytest.mark.parametrize("kw", [
    dict(nprocs=0, cmd=["true"]), dict(nprocs=2, cmd=[]), dict(nprocs=2, cmd="true"),
    dict(nprocs=2, cmd=["true"], grace=-1), dict(nprocs=2, cmd=["true"], timeout=0),
])
def test_bad_launch_arguments(kw):
    with pytest.raises(InvalidArgument):
        launch(**kw)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, expected_rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_ranks_and_cleans_up(sig, expected_rc):
    rank_code = ("import os, time; job = os.environ['OFFLOAD_JOB']; "
                 f"open('{SHM_DIR}/' + job + '.seg', 'w').close(); "
                 "print('ready', os.getpid(), job, flush=True); time.sleep(60)")
    launcher_code = ("import sys; from offload_lib.cli import main; "
                     "sys.exit(main(['run', '-n', '2', '--', sys.executable, '-c', "
                     f"{rank_code!r}]))")
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath}
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code], env=env, stdout=subprocess.PIPE, text=True,
        # a SIGINT ignored by our own parent must not make this test hang
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        pids, jobs = [], set()
        while len(pids) < 2:
            line = launcher.stdout.readline()
            assert line, "launcher exited before the ranks were ready"
            _, _, pid, job = line.split()
            pids.append(int(pid))
            jobs.add(job)
        (job,) = jobs
        assert job_segments(job)
        launcher.send_signal(sig)
        assert launcher.wait(timeout=15) == expected_rc
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert job_segments(job) == []
    finally:
        launcher.kill()
        launcher.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.timeout(60)
def test_cleanup_stale_segments():
    uid = os.getuid()
    dead = _dead_pid()
    stale = f"dpaoff-{uid}-{dead}-{os.urandom(8).hex()}"
    live = f"dpaoff-{uid}-{os.getpid()}-{os.urandom(8).hex()}"
    foreign = f"dpaoff-{uid + 1}-{dead}-{os.urandom(8).hex()}"  # another user's name
    names = [stale, stale + ".rank0", live + ".seg", foreign]
    for name in names:
        Path(SHM_DIR, name).touch()
    try:
        removed = cleanup_stale_segments()
        assert stale in removed and stale + ".rank0" in removed
        assert live + ".seg" not in removed and foreign not in removed
        assert Path(SHM_DIR, live + ".seg").exists() and Path(SHM_DIR, foreign).exists()
        # a name claiming uid+1 on a file we own is not that user's to lose, nor ours to touch
        assert foreign not in cleanup_stale_segments(uid + 1)
    finally:
        for name in names:
            Path(SHM_DIR, name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.mark.timeout(60)
def test_cli_run(capfd):
    rc = cli.main(["run", "-n", "2", "--", *py(PRELUDE + "print('hello from', rank)")])
    assert rc == 0
    out = capfd.readouterr().out.splitlines()
    assert "[0] hello from 0" in out and "[1] hello from 1" in out


@pytest.mark.timeout(60)
def test_cli_run_passes_config_and_fails_like_the_rank(tmp_path, capfd):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dpa_threads: 4\n")
    code = PRELUDE + "print('config', os.environ['OFFLOAD_CONFIG']); sys.exit(5 if rank else 0)"
    rc = cli.main(["run", "-n", "2", "--config", str(cfg), "--grace", "0.5", "--", *py(code)])
    assert rc == 5
    captured = capfd.readouterr()
    assert f"[0] config {cfg}" in captured.out.splitlines()
    assert "rank 1 failed (exit code 5)" in captured.err


def test_cli_run_rejects_bad_config_before_starting(tmp_path, capfd):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dpa_threads: 0\n")
    assert cli.main(["run", "-n", "2", "--config", str(cfg), "--", "false"]) == 2
    assert "dpa_threads" in capfd.readouterr().err


@pytest.mark.parametrize("argv", [["run", "--", "true"], ["run", "-n", "0", "--", "true"],
                                  ["run", "-n", "2"], ["frobnicate"], []])
def test_cli_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2


def test_cli_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dpa-offload ")


def test_cli_info(capsys, monkeypatch):
    monkeypatch.delenv("OFFLOAD_BACKEND", raising=False)
    monkeypatch.delenv("OFFLOAD_CONFIG", raising=False)
    assert cli.main(["info"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.match(r"backend: (emulator|flexio) \u2014 \S", first)
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"backend", "reason", "devices", "details"} <= set(info)
