"""Local launcher behind ``dpa-offload run -n N -- cmd ...``.

Starts N ranks with OFFLOAD_RANK/SIZE/JOB/LOCAL_RANK set (and torchrun's RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT for torch.distributed), forwards their output prefixed with
``[rank] ``, stops the job when a rank fails, and always removes the job's /dev/shm segments.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import IO, Any, TextIO

from offload_lib.errors import InvalidArgument, brief

__all__ = ["launch", "new_job_name", "cleanup_stale_segments", "job_segments", "SHM_DIR"]

SHM_DIR = "/dev/shm"
JOB_PREFIX = "dpaoff"
KILL_AFTER_TERM_S = 2.0
_POLL_S = 0.02
_MAX_LINE = 1024 * 1024  # longer lines are forwarded in pieces
_PROG = "dpa-offload run"


def new_job_name(owner_pid: int | None = None) -> str:
    """``dpaoff-<uid>-<pid>-<16 hex>``: unique, and tells cleanup_stale_segments whose it is."""
    pid = os.getpid() if owner_pid is None else owner_pid
    return f"{JOB_PREFIX}-{os.getuid()}-{pid}-{secrets.token_hex(8)}"


def job_segments(job: str) -> list[str]:
    """Names in SHM_DIR that belong to ``job`` (the job name itself or names starting with it)."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(job))
    except FileNotFoundError:
        return []


def _job_in_use(job: str) -> bool:
    """Does a live process use the job? Every rank holds a shared flock on the job segment
    while it lives (emulator/emu_job.c); a process that died holds nothing."""
    try:
        fd = os.open(os.path.join(SHM_DIR, job), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _remove(path: str, uid: int) -> bool:
    """Remove a file (or a bootstrap directory) of uid's; nothing else."""
    try:
        st = os.lstat(path)
        if st.st_uid != uid:
            return False
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        elif stat.S_ISREG(st.st_mode):
            os.unlink(path)
        else:
            return False
    except OSError:
        return False
    return True


def _remove_job_segments(job: str) -> list[str]:
    """The job's names in SHM_DIR, unless a live process still uses the job (another job
    forced to the same name, say)."""
    if _job_in_use(job):
        return []
    uid = os.getuid()
    return [name for name in job_segments(job) if _remove(os.path.join(SHM_DIR, name), uid)]


_SEGMENT_RE = re.compile(rf"({JOB_PREFIX}-(\d+)-(\d+)-[0-9a-f]{{16}})")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def cleanup_stale_segments(uid: int | None = None) -> list[str]:
    """Remove SHM_DIR names of ``uid``'s dead jobs; return the removed names.

    Only names of jobs ``dpaoff-<uid>-<pid>-<16 hex>`` owned by ``uid`` are looked at. A job
    is dead when its ``<pid>`` (the launcher, or rank 0 under mpirun) is gone and no live
    process holds its job segment (every rank flocks it while it lives): ranks that outlive
    a launcher keep their job. Other users' names and live jobs' are kept.
    """
    uid = os.getuid() if uid is None else uid
    try:
        names = sorted(os.listdir(SHM_DIR))
    except FileNotFoundError:
        return []
    removed = []
    verdict: dict[str, bool] = {}
    for name in names:
        m = _SEGMENT_RE.match(name)
        if not m or int(m.group(2)) != uid:
            continue
        job = m.group(1)
        if job not in verdict:
            verdict[job] = not _pid_alive(int(m.group(3))) and not _job_in_use(job)
        if verdict[job] and _remove(os.path.join(SHM_DIR, name), uid):
            removed.append(name)
    return removed


# ---------------------------------------------------------------------------------------------
# output forwarding


class _Forwarder(threading.Thread):
    """Copies one child pipe to ``target``, prefixing every line; always drains the pipe."""

    def __init__(self, rank: int, pipe: IO[bytes], target: TextIO, lock: threading.Lock) -> None:
        super().__init__(name=f"dpa-offload-fwd-{rank}", daemon=True)
        self.prefix = f"[{rank}] "
        self.pipe, self.target, self.lock = pipe, target, lock
        self.broken = False

    def run(self) -> None:
        # Whole lines are written under the shared lock so ranks never interleave inside a
        # line. readline(limit) bounds memory: a line longer than _MAX_LINE is written in
        # pieces, and only those pieces may interleave with other ranks' lines.
        pending: list[bytes] = []
        for piece in iter(lambda: self.pipe.readline(_MAX_LINE), b""):
            pending.append(piece)
            if piece.endswith(b"\n") or sum(map(len, pending)) >= _MAX_LINE:
                self._write(self.prefix + b"".join(pending).decode("utf-8", errors="replace"))
                pending = []
        if pending:
            self._write(self.prefix + b"".join(pending).decode("utf-8", errors="replace") + "\n")
        self.pipe.close()

    def _write(self, text: str) -> None:
        if self.broken:
            return
        try:
            with self.lock:
                self.target.write(text)
                self.target.flush()
        except (OSError, ValueError):
            # stdout closed (e.g. piped into `head`): keep draining so the rank never blocks.
            self.broken = True


# ---------------------------------------------------------------------------------------------
# signals: SIGINT/SIGTERM to the launcher must still stop the ranks (each runs in its own process
# group, outside the terminal's foreground group, so Ctrl-C does not reach them) and remove the
# job's segments.


class _Interrupted(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _SignalGuard:
    def __init__(self) -> None:
        self.stopping = False
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # e.g. under nohup: keep ignoring
                    self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # A second signal while we are already stopping the ranks must not abort the cleanup.
        if not self.stopping:
            self.stopping = True
            raise _Interrupted(signum)

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.saved.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------------------------------------
# process control


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is not None:
        return  # reaped: its pid (and group id) may already belong to someone else
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> list[int]:
    """SIGTERM every running rank's process group, SIGKILL what is left after 2 s; return ranks."""
    running = [r for r, p in enumerate(procs) if p.poll() is None]
    for r in running:
        _signal_group(procs[r], signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_TERM_S
    while time.monotonic() < deadline and any(procs[r].poll() is None for r in running):
        time.sleep(_POLL_S)
    for r in running:
        _signal_group(procs[r], signal.SIGKILL)
    for r in running:
        procs[r].wait()
    return running


def _check_args(nprocs: int, cmd: Sequence[str], grace: float, timeout: float | None) -> None:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise InvalidArgument(f"number of ranks must be an integer >= 1, got {brief(nprocs)}")
    if isinstance(cmd, str) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise InvalidArgument(
            f"cmd must be a non-empty list of strings, e.g. ['python', 'script.py'], got {cmd!r}"
        )
    if grace < 0:
        raise InvalidArgument(f"grace must be >= 0 seconds, got {brief(grace)}")
    if timeout is not None and timeout <= 0:
        raise InvalidArgument(f"timeout must be > 0 seconds or None, got {brief(timeout)}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Ranks die with their launcher. A rank the launcher starts gets SIGKILL when the launcher
# dies (PR_SET_PDEATHSIG, kept across exec); a process further down (a shell wrapper's
# child) has the read end of a pipe whose write end only the launcher holds: once the
# launcher is gone it reads EOF, and ol.init() watches for that (watch_launcher).
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
LAUNCHER_PIPE_ENV = "OFFLOAD_LAUNCHER_PIPE"  # "<fd>:<inode>" of the pipe's read end


def _die_with(parent: int) -> Callable[[], None]:
    prctl = _LIBC.prctl  # looked up before fork: the child only calls it

    def arm() -> None:  # runs in the child between fork and exec
        # Own process group (killpg reaches the rank's children) but the launcher's session: a
        # new session is a new autogroup, and a rank alone in one, moved onto a CPU that other
        # sessions kept busy, waited there up to 788 ms (docs/performance.md, issue 16,
        # sixteenth session). mpirun does the same.
        os.setpgid(0, 0)
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before we armed: follow it
            os.kill(os.getpid(), signal.SIGKILL)
    return arm


def watch_launcher(env: Mapping[str, str] | None = None) -> None:
    """In a rank: die (SIGKILL) when the launcher that started the job dies, also where
    the launcher is not our parent. A no-op outside `dpa-offload run`, or when the pipe
    named in the environment is not ours (a child that inherited only the environment)."""
    spec = (os.environ if env is None else env).get(LAUNCHER_PIPE_ENV, "")
    fd_s, _, ino_s = spec.partition(":")
    try:
        fd, ino = int(fd_s), int(ino_s)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return
    if not stat.S_ISFIFO(st.st_mode) or st.st_ino != ino or _watching:
        return
    _watching.append(fd)

    def watch() -> None:
        while True:
            try:
                if os.read(fd, 1) == b"":  # EOF: the launcher's end closed with it
                    os.kill(os.getpid(), signal.SIGKILL)
            except InterruptedError:
                continue
            except OSError:
                return

    threading.Thread(target=watch, name="dpa-launcher-watch", daemon=True).start()


_watching: list[int] = []


def _rank_env(base: Mapping[str, str], rank: int, size: int, job: str, key: str,
              port: int, pipe: str) -> dict[str, str]:
    env = dict(base)
    # Pipes make Python block-buffer; a rank killed at the end of the grace period would lose
    # the very lines that explain the failure.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(
        OFFLOAD_RANK=str(rank), OFFLOAD_SIZE=str(size), OFFLOAD_JOB=job,
        OFFLOAD_JOB_KEY=key,  # the job's secret (bootstrap.World.key)
        OFFLOAD_LOCAL_RANK=str(rank), **{LAUNCHER_PIPE_ENV: pipe},
        # torchrun's variables, so that dist.init_process_group("dpa") finds its store.
        RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
    )
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(port))
    return env


def launch(
    nprocs: int,
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    grace: float = 3.0,
    timeout: float | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``cmd`` as ``nprocs`` ranks of one job; return 0 when all ranks exit 0.

    ``env`` is the ranks' base environment (default os.environ); OFFLOAD_RANK, OFFLOAD_SIZE,
    OFFLOAD_JOB, OFFLOAD_JOB_KEY and OFFLOAD_LOCAL_RANK are added. The ranks die with the
    launcher (SIGKILL), however it ends. ``stdout``/``stderr`` default to sys.stdout /
    sys.stderr at call time. When a rank fails, the others get ``grace`` seconds to exit on their
    own, then SIGTERM, then SIGKILL 2 s later; the result is the first failing rank's exit code
    (128 + signal number if it was killed). ``timeout`` seconds after the start everything is
    stopped and 124 is returned. 127 means a rank could not be started.
    """
    _check_args(nprocs, cmd, grace, timeout)
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    base_env = os.environ if env is None else env
    lock = threading.Lock()

    def say(msg: str) -> None:
        try:
            with lock:
                err.write(f"{_PROG}: {msg}\n")
                err.flush()
        except (OSError, ValueError):
            pass

    job, key = new_job_name(), secrets.token_hex(8)
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    forwarders: list[_Forwarder] = []
    guard = _SignalGuard()
    life_r, life_w = os.pipe()  # ranks see EOF on life_r once we are gone (watch_launcher)
    pipe = f"{life_r}:{os.fstat(life_r).st_ino}"
    with guard:
        try:
            for rank in range(nprocs):
                try:
                    p = subprocess.Popen(
                        list(cmd), env=_rank_env(base_env, rank, nprocs, job, key, port, pipe),
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, pass_fds=(life_r,),
                        preexec_fn=_die_with(os.getpid()),
                    )
                except OSError as e:
                    say(f"cannot start {cmd[0]!r} for rank {rank}: {e.strerror or e}")
                    return 127
                procs.append(p)
                assert p.stdout is not None and p.stderr is not None
                forwarders += [_Forwarder(rank, p.stdout, out, lock),
                               _Forwarder(rank, p.stderr, err, lock)]
                forwarders[-2].start()
                forwarders[-1].start()
            os.close(life_r)
            life_r = -1
            return _supervise(procs, forwarders, grace, timeout, say)
        except _Interrupted as e:
            stopped = _stop(procs)
            if stopped:
                say(f"interrupted by {signal.Signals(e.signum).name}; "
                    f"stopped rank(s) {_ranks(stopped)}")
            if e.signum == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise SystemExit(128 + e.signum) from None
        finally:
            guard.stopping = True
            try:
                _stop(procs)
                # A rank's own children may still hold its pipes open: don't wait forever.
                deadline = time.monotonic() + 2.0
                for f in forwarders:
                    f.join(timeout=max(0.0, deadline - time.monotonic()))
            finally:
                _remove_job_segments(job)
                for fd in (life_r, life_w):
                    if fd >= 0:
                        os.close(fd)


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _supervise(
    procs: Sequence[subprocess.Popen[bytes]],
    forwarders: Sequence[_Forwarder],
    grace: float,
    timeout: float | None,
    say: Callable[[str], None],
) -> int:
    start = time.monotonic()
    first_failure: int | None = None  # the result code
    grace_deadline = float("inf")
    running = set(range(len(procs)))
    while running:
        for rank in sorted(running):
            code = procs[rank].poll()
            if code is None:
                continue
            running.discard(rank)
            if code != 0:
                # Let the rank's last words (a traceback, say) come out before our verdict.
                for f in forwarders[2 * rank:2 * rank + 2]:
                    f.join(timeout=0.5)
                say(f"rank {rank} failed ({_describe_exit(code)})")
                if first_failure is None:
                    first_failure = 128 - code if code < 0 else code
                    grace_deadline = time.monotonic() + grace
        if not running:
            break
        now = time.monotonic()
        if timeout is not None and now - start >= timeout:
            say(f"timeout of {timeout:g} s expired; stopping rank(s) {_ranks(sorted(running))}")
            _stop(procs)
            return 124
        if now >= grace_deadline:
            stopped = _stop(procs)
            say(f"grace period of {grace:g} s is over; stopped rank(s) {_ranks(stopped)}")
            break
        time.sleep(_POLL_S)
    return first_failure or 0
