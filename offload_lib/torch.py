"""torch.distributed backend ``"dpa"``: collectives of a process group run on the DPA.

    import torch.distributed as dist
    import offload_lib.torch  # registers the backend
    dist.init_process_group("dpa")  # under torchrun or `dpa-offload run`

Served: ``all_to_all_single`` (even or with split sizes), ``all_gather_into_tensor``,
``broadcast`` and ``barrier``, on CPU tensors and (staged, see docs/gpu.md) CUDA tensors;
and (offload_lib._torch_forms) the group's name and description (funcol, torch.compile,
DeviceMesh, DTensor), the coalesced all-gather, the list forms of all-gather, all-to-all
and scatter, and the reductions (allreduce, reduce_scatter_tensor and their coalesced and
list forms; SUM, AVG, PRODUCT, MAX, MIN) reduced by the DPA threads. Every other collective raises :class:`offload_lib.Unsupported` naming the
served ones; use a gloo or NCCL group beside this one for them.

The default group opens this process's DPA context (config from ``OFFLOAD_CONFIG`` and
``OFFLOAD_<KEY>``); ``dist.new_group`` makes a team in the same context. The job name and,
for hardware backends, the queue exchange go through the group's c10d store.
"""
from __future__ import annotations

import secrets
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from offload_lib._torch_forms import TorchForms, WorkBase
from offload_lib.bootstrap import World
from offload_lib.context import MAX_TEAMS, Context, Team
from offload_lib.errors import InvalidArgument, OffloadError, Unsupported

BACKEND = "dpa"
SUPPORTED = ("all_to_all_single", "all_gather_into_tensor", "broadcast", "barrier",
             "all_gather_single_coalesced", "allgather", "alltoall", "scatter", "allreduce",
             "allreduce_coalesced", "reduce_scatter_tensor", "reduce_scatter_single_coalesced",
             "reduce_scatter")

_KEY = "dpa-offload"


class _StoreExchange:
    """The bootstrap's allgather over a c10d store (``World.comm`` duck type)."""

    def __init__(self, store: Any, rank: int, size: int, prefix: str) -> None:
        self._store, self._rank, self._size, self._prefix = store, rank, size, prefix
        self._round = 0

    def allgather(self, data: bytes) -> list[bytes]:
        key = f"{self._prefix}/ag{self._round}/"
        self._round += 1
        self._store.set(key + str(self._rank), data)
        return [bytes(self._store.get(key + str(r))) for r in range(self._size)]


class _Process:
    """This process's DPA context, shared by every "dpa" group; one per init_process_group."""

    def __init__(self) -> None:
        self.ctx: Context | None = None
        self.store: Any = None  # the default group's store: every rank of the job sees it
        self.inits = 0  # default groups created so far: names this generation's store keys

    def open(self, store: Any, rank: int, size: int) -> Context:
        from offload_lib.config import load_config
        from offload_lib.discovery import select_backend
        from offload_lib.launcher import new_job_name

        if self.ctx is not None and not self.ctx.closed:
            raise OffloadError("a 'dpa' default group exists already in this process: "
                               "call dist.destroy_process_group() first")
        self.inits += 1
        prefix = f"{_KEY}/{self.inits}"
        config = load_config()
        backend, _reason = select_backend(config)
        exchange = _StoreExchange(store, rank, size, prefix)
        hosts = {h.decode() for h in exchange.allgather(socket.gethostname().encode())}
        if backend == "emulator" and len(hosts) > 1:
            raise OffloadError(f"the emulator runs every rank on one machine, but the group "
                               f"spans {sorted(hosts)}")
        if rank == 0:
            store.set(f"{prefix}/job", new_job_name())
            store.set(f"{prefix}/key", secrets.token_hex(8))
        job = bytes(store.get(f"{prefix}/job")).decode()
        key = bytes(store.get(f"{prefix}/key")).decode()
        # As ol.init() opens it (rank 0 clears what dead jobs left first).
        self.ctx = Context.from_world(config, World(rank, size, job, "torch", exchange, key),
                                      backend)
        self.store = store
        return self.ctx

    def team(self, store: Any, group_rank: int, ranks: list[int]) -> Team:
        """A team for a dist.new_group: its id comes from a job-wide counter in the store,
        so that groups created by different subsets of ranks never share one."""
        ctx = self.ctx
        if ctx is None or ctx.closed:
            raise OffloadError("create the default group with dist.init_process_group('dpa') "
                               "before dist.new_group")
        if group_rank == 0:
            team_id = int(self.store.add(f"{_KEY}/{self.inits}/teams", 1))
            store.set(f"{_KEY}/team", str(team_id))
        team_id = int(bytes(store.get(f"{_KEY}/team")))
        if team_id >= MAX_TEAMS:
            raise OffloadError(f"at most {MAX_TEAMS - 1} groups besides the world can use the "
                               "'dpa' backend in one job")
        return ctx._make_team(ctx._new_team_id(team_id), ranks)


_process = _Process()


def context() -> Context | None:
    """The DPA context the "dpa" groups of this process use (None before init)."""
    return _process.ctx


class _Work(WorkBase):
    """A posted collective; ``wait()`` blocks until it completed (raising its error)."""

    def __init__(self, req: Any, result: list[torch.Tensor], timeout: timedelta) -> None:
        super().__init__()
        self._req = req
        self._result = result
        self._timeout = timeout
        self._error: BaseException | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        bound = timeout if timeout > timedelta(0) else self._timeout
        try:
            self._req.wait(bound.total_seconds())
        except BaseException as e:
            self._error = e
            raise
        return True

    def is_completed(self) -> bool:
        try:
            return bool(self._req.test())
        except OffloadError as e:
            self._error = e
            return True


def _rows(t: torch.Tensor) -> tuple[int, int]:
    """(dim-0 length, elements per dim-0 row): torch splits along dim 0."""
    if t.dim() == 0:
        return 1, 1
    rows = int(t.shape[0])
    return rows, (t.numel() // rows if rows else 0)


def _splits(sizes: Sequence[int], rows: int, n: int, name: str) -> list[int]:
    if not sizes:
        if rows % n:
            raise InvalidArgument(f"{name} has {rows} rows in dim 0, which do not split evenly "
                                  f"over {n} ranks: pass split sizes or a multiple of {n} rows")
        return [rows // n] * n
    out = [int(s) for s in sizes]
    if len(out) != n or any(s < 0 for s in out) or sum(out) != rows:
        raise InvalidArgument(f"{name} split sizes {out} must be {n} non-negative counts adding up "
                              f"to its {rows} rows in dim 0")
    return out


def _unsupported(name: str) -> Any:
    def refuse(self: ProcessGroupDPA, *args: Any, **kwargs: Any) -> Any:
        raise Unsupported(f"the 'dpa' backend does not serve {name}: it serves "
                          f"{', '.join(SUPPORTED)}. Run {name} on a gloo or nccl group "
                          "(dist.new_group(backend='gloo')) beside it")
    refuse.__name__ = name
    return refuse


class ProcessGroupDPA(TorchForms, dist.ProcessGroup):
    """One "dpa" process group: a team of the process's DPA context."""

    def __init__(self, team: Team, timeout: timedelta, owns_context: bool) -> None:
        super().__init__(team.rank, team.size)
        self.team = team
        self._timeout = timeout
        self._owns_context = owns_context

    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    def _work(self, req: Any, result: list[torch.Tensor]) -> _Work:
        return _Work(req, result, self._timeout)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                          opts: Any = None) -> _Work:
        n = self.team.size
        if not output_split_sizes and not input_split_sizes:
            return self._work(self.team.alltoall(input, output), [output])
        in_rows, in_width = _rows(input)
        out_rows, out_width = _rows(output)
        sends = _splits(input_split_sizes, in_rows, n, "input")
        recvs = _splits(output_split_sizes, out_rows, n, "output")
        if in_rows and out_rows and in_width != out_width:
            raise InvalidArgument(f"input rows hold {in_width} elements but output rows hold "
                                  f"{out_width}: dims after the first must match")
        width = in_width or out_width
        req = self.team.alltoallv(input, [s * width for s in sends], output,
                                  recv_counts=[r * width for r in recvs])
        return self._work(req, [output])

    alltoall_base = all_to_all_single  # its name before torch 2.6

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> _Work:
        return self._work(self.team.allgather(input, output), [output])

    _allgather_base = all_gather_single  # its name before torch 2.6

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _Work:
        if len(tensors) != 1:
            raise InvalidArgument(f"broadcast takes one tensor per call, got {len(tensors)}")
        root = int(getattr(opts, "rootRank", 0))
        return self._work(self.team.broadcast(tensors[0], root), tensors)

    def barrier(self, opts: Any = None) -> _Work:
        return self._work(self.team.barrier(), [])

    def shutdown(self) -> None:
        ctx = self.team._ctx
        if self._owns_context and not ctx.closed:
            ctx.close()

    abort = shutdown


for _name in ("reduce", "allgather_coalesced", "gather", "send", "recv", "recv_anysource",
              "monitored_barrier"):
    setattr(ProcessGroupDPA, _name, _unsupported(_name))


def _create(opts: Any, _backend_options: Any) -> ProcessGroupDPA:
    store, rank, size = opts.store, int(opts.group_rank), int(opts.group_size)
    ranks = [int(r) for r in (opts.global_ranks_in_group or range(size))]
    ctx = _process.ctx
    if ctx is None or ctx.closed:
        if dist.is_initialized():
            raise OffloadError(
                "the 'dpa' backend must serve the default group: dist.init_process_group('dpa') "
                "(or a device map such as 'cpu:gloo,cuda:dpa'), then dist.new_group for more")
        # The default group: group rank = world rank.
        ctx = _process.open(store, rank, size)
        return ProcessGroupDPA(ctx.world, opts.timeout, owns_context=True)
    return ProcessGroupDPA(_process.team(store, rank, ranks), opts.timeout, owns_context=False)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
