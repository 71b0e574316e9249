"""Who am I, how many are we, and what is the job called.

Under ``dpa-offload run``: from OFFLOAD_RANK / OFFLOAD_SIZE / OFFLOAD_JOB. Under mpirun:
from mpi4py's COMM_WORLD (rank 0 names the job, everyone learns it). Otherwise: one rank.
"""
from __future__ import annotations

import os
import socket
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
    return World(rank, size, job, "dpa-offload")


def _from_mpi(one_host: bool) -> World | None:
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    job = comm.bcast(new_job_name() if comm.rank == 0 else None, root=0)
    hosts = comm.allgather(socket.gethostname())
    if one_host and len(set(hosts)) > 1:
        raise OffloadError(
            f"the emulator runs every rank on one machine, but the job spans {sorted(set(hosts))}"
        )
    return World(comm.rank, comm.size, job, "mpi", comm)


_ROUNDS: dict[str, int] = {}


def allgather(world: World, data: bytes, timeout: float) -> list[bytes]:
    """Every rank's ``data``, in rank order, over the launcher's own channel: mpi4py under
    mpirun; under `dpa-offload run`, files in the job's private shared-memory namespace
    (0600, named after the job, so the launcher's sweep removes them)."""
    if world.size == 1:
        return [data]
    if world.comm is not None:
        return list(world.comm.allgather(data))
    rnd = _ROUNDS.get(world.job, 0)
    _ROUNDS[world.job] = rnd + 1
    base = os.path.join(SHM_DIR, f"{world.job}-ag{rnd}")
    tmp = f"{base}-r{world.rank}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, f"{base}-r{world.rank}")
    deadline = time.monotonic() + timeout
    out: list[bytes] = []
    for r in range(world.size):
        path = f"{base}-r{r}"
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise OffloadError(f"bootstrap allgather: rank {r} did not answer within "
                                   f"{timeout:g} s (bootstrap_timeout)")
            time.sleep(0.001)
        with open(path, "rb") as f:
            out.append(f.read())
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
    return World(0, 1, new_job_name(), "single")
