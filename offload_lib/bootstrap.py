"""Who am I, how many are we, and what is the job called.

Under ``dpa-offload run``: from OFFLOAD_RANK / OFFLOAD_SIZE / OFFLOAD_JOB. Under mpirun:
from mpi4py's COMM_WORLD (rank 0 names the job, everyone learns it). Otherwise: one rank.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any

from offload_lib.errors import InvalidArgument, OffloadError
from offload_lib.launcher import SHM_DIR, new_job_name

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD")


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    job: str
    launcher: str  # "dpa-offload", "mpi" or "single"
    comm: Any = None  # the mpi4py communicator when launched by mpirun
    # The job's secret (hex), the same on every rank: it tells our job from another one
    # given the same name, and authenticates the file bootstrap. Empty: derived from the
    # name (ranks started by hand without OFFLOAD_JOB_KEY).
    key: str = ""

    @property
    def key64(self) -> int:
        """The secret as the 64-bit value the job segment keeps (never 0)."""
        digest = hashlib.sha256(f"{self.job}\0{self.key}".encode()).digest()
        return int.from_bytes(digest[:8], "little") or 1


def _from_env(env: dict[str, str]) -> World:
    try:
        rank, size = int(env["OFFLOAD_RANK"]), int(env["OFFLOAD_SIZE"])
    except ValueError:
        raise InvalidArgument(
            f"OFFLOAD_RANK={env.get('OFFLOAD_RANK')!r} / OFFLOAD_SIZE={env.get('OFFLOAD_SIZE')!r} "
            "must be integers (they are set by `dpa-offload run`)"
        ) from None
    job = env.get("OFFLOAD_JOB", "")
    if not (0 <= rank < size) or not job:
        raise InvalidArgument(
            f"inconsistent launch environment: OFFLOAD_RANK={rank}, OFFLOAD_SIZE={size}, "
            f"OFFLOAD_JOB={job!r}; start ranks with `dpa-offload run -n N -- ...`"
        )
    return World(rank, size, job, "dpa-offload", key=env.get("OFFLOAD_JOB_KEY", ""))


def _from_mpi(one_host: bool) -> World | None:
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    job, key = comm.bcast((new_job_name(), secrets.token_hex(8)) if comm.rank == 0 else None,
                          root=0)
    hosts = comm.allgather(socket.gethostname())
    if one_host and len(set(hosts)) > 1:
        raise OffloadError(
            f"the emulator runs every rank on one machine, but the job spans {sorted(set(hosts))}"
        )
    return World(comm.rank, comm.size, job, "mpi", comm, key)


_ROUNDS: dict[str, int] = {}


def _boot_dir(job: str) -> str:
    """The job's bootstrap directory: 0700, ours, made by whichever rank comes first. Its
    name is known once the job runs, but no other user can create anything inside."""
    path = os.path.join(SHM_DIR, f"{job}.boot")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OffloadError(f"bootstrap: {path} is not a private directory of this user "
                           "(made by someone else?); refusing to use it")
    return path


def _mac(world: World, rnd: int, rank: int, data: bytes) -> bytes:
    msg = f"{world.job}|{rnd}|{rank}|".encode() + data
    return hmac.new(world.key.encode() or world.job.encode(), msg, hashlib.sha256).digest()


def _read_answer(world: World, path: str, rnd: int, rank: int) -> bytes | None:
    """Rank's answer at path, if it is there and authentic (a regular file of ours whose
    MAC the job's key makes); anything else is not an answer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        raw = f.read()
    mac, data = raw[:32], raw[32:]
    return data if hmac.compare_digest(mac, _mac(world, rnd, rank, data)) else None


def allgather(world: World, data: bytes, timeout: float) -> list[bytes]:
    """Every rank's ``data``, in rank order, over the launcher's own channel: mpi4py under
    mpirun; under `dpa-offload run`, files in the job's private bootstrap directory
    (0700, named after the job, so the launcher's sweep removes it), each authenticated
    with the job's key (OFFLOAD_JOB_KEY): a file nobody of the job wrote is no answer."""
    if world.size == 1:
        return [data]
    if world.comm is not None:
        return list(world.comm.allgather(data))
    rnd = _ROUNDS.get(world.job, 0)
    _ROUNDS[world.job] = rnd + 1
    base = os.path.join(_boot_dir(world.job), f"ag{rnd}")
    tmp = f"{base}-r{world.rank}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_mac(world, rnd, world.rank, data) + data)
    os.replace(tmp, f"{base}-r{world.rank}")
    deadline = time.monotonic() + timeout
    out: list[bytes] = []
    for r in range(world.size):
        got = _read_answer(world, f"{base}-r{r}", rnd, r)
        while got is None:
            if time.monotonic() > deadline:
                raise OffloadError(f"bootstrap allgather: rank {r} did not answer within "
                                   f"{timeout:g} s (bootstrap_timeout)")
            time.sleep(0.001)
            got = _read_answer(world, f"{base}-r{r}", rnd, r)
        out.append(got)
    return out


def discover(env: dict[str, str] | None = None, one_host: bool = True) -> World:
    """one_host: the emulator's ranks must share a machine; hardware backends need not."""
    env = dict(os.environ) if env is None else env
    if "OFFLOAD_RANK" in env or "OFFLOAD_SIZE" in env:
        return _from_env(env)
    if any(k in env for k in _MPI_ENV):
        world = _from_mpi(one_host)
        if world is not None:
            return world
    return World(0, 1, new_job_name(), "single", key=secrets.token_hex(8))
