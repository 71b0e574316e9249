"""The benchmark's registry (one entry per collective) and its cases: data patterns exact
in every dtype, the offloaded op and its MPI twin, and the check of every result."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from offload_lib.errors import OffloadError

PROG = "dpa-offload bench"
DEFAULT_SIZES = "1K,4K,64K,256K,1M,4M"
GB = 1e9
MPI_HINT = "install it with: pip install dpa-offload[mpi]"
# the moe benchmark's own options: (flag, default, help)
MOE_OPTIONS = (
    ("--tokens", 4096, "tokens per rank"),
    ("--hidden", 2048, "elements per token row"),
    ("--topk", 2, "experts per token"),
    ("--experts", 8, "experts in all, split evenly over the ranks"),
)
_MOE_DESTS = tuple(flag[2:] for flag, _, _ in MOE_OPTIONS)
# Exit codes of a worker: a wrong result must never be mistaken for a crash or a timeout.
EXIT_WRONG_RESULT = 3


# ---------------------------------------------------------------------------------------------
# the registry: one entry per collective; ``case`` is None until it is implemented


@dataclass(frozen=True)
class Collective:
    name: str
    desc: str
    # busbw = algbw * bus_factor(n), as nccl-tests defines it
    bus_factor: Callable[[int], float]
    # per-rank buffers and the two ways to run one op on them; see _AlltoallCase
    case: Callable[..., Any] | None = None
    # what --compare mpi times, for the table's header
    mpi_desc: str = ""
    # whether --persistent has a meaning (a *_init form exists)
    persistent: bool = False
    # a module with its own measurement, table and options (work, aggregate, format_table,
    # check_args); used instead of ``case`` by collectives that are not one op per size
    suite: str | None = None

    @property
    def implemented(self) -> bool:
        return self.case is not None or self.suite is not None


def _reduction_case(name: str, *args: Any) -> Any:
    from offload_lib.bench import reduce as _bench_reduce  # it imports this module

    return getattr(_bench_reduce, name)(*args)


def _all_but_one(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


# ---------------------------------------------------------------------------------------------
# data patterns: values exact in every numeric dtype, and different for each (source, dest) pair


def _modulus(dt: np.dtype) -> int:
    if dt.kind == "b":
        return 2
    if dt.kind in "fc":
        nmant = np.finfo(dt).nmant
        return min(2 ** (nmant + 1), 2 ** 24)
    bits = 8 * dt.itemsize
    return min(2 ** (bits - 1 if dt.kind == "i" else bits), 2 ** 24)


def block_pattern(dt: np.dtype, src_rank: int, dst_rank: int, count: int) -> np.ndarray:
    """What ``src_rank`` sends to ``dst_rank``: ``count`` elements of ``dt``."""
    j = np.arange(count, dtype=np.int64)
    vals = (src_rank * 7919 + dst_rank * 104729 + j * 31 + 1) % _modulus(dt)
    return vals.astype(dt)


def _poison(expected: np.ndarray) -> np.ndarray:
    """An array that differs from ``expected`` in every element."""
    m = _modulus(expected.dtype)
    real = expected.real if expected.dtype.kind == "c" else expected
    return ((real.astype(np.int64) + 1) % m).astype(expected.dtype)


class WrongResult(OffloadError):
    """The benchmark's own correctness check failed."""


# ---------------------------------------------------------------------------------------------
# all-to-all


class _Case:
    """What the exchange cases share: run one op into a poisoned destination, then check.
    Subclasses provide dst, mpi_dst, expected, offload(), mpi() and check(which)."""

    def verify(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        run = self.offload if which == "offload" else self.mpi
        dst[:] = _poison(self.expected)
        self._fill(dst)
        run()
        self.check(which)

    def _fill(self, dst: np.ndarray) -> None:
        """What a case needs in the poisoned destination before the op (a broadcast root's
        buffer is its source)."""


class _AlltoallCase(_Case):
    """Buffers for one message size; ``offload()`` and ``mpi()`` each run one all-to-all."""

    def __init__(self, ctx: Any, team: Any, comm: Any, count: int, dt: np.dtype,
                 buffers: str, persistent: bool) -> None:
        n, me = team.size, team.rank
        total = count * n
        alloc = (lambda: ctx.empty(total, dt)) if buffers == "shared" else (
            lambda: np.empty(total, dt))
        self.team, self.comm, self.count = team, comm, count
        self.src, self.dst = alloc(), alloc()
        self.src[:] = np.concatenate([block_pattern(dt, me, p, count) for p in range(n)])
        self.expected = np.concatenate([block_pattern(dt, q, me, count) for q in range(n)])
        self.persistent = team.alltoall_init(self.src, self.dst) if persistent else None
        self.mpi_src = self.mpi_dst = None
        if comm is not None:  # MPI gets ordinary numpy arrays of the same size, same data
            self.mpi_src, self.mpi_dst = self.src.copy(), np.empty(total, dt)
            from mpi4py import MPI

            self._mpi_bufs = ([self.mpi_src.view(np.uint8), MPI.BYTE],
                              [self.mpi_dst.view(np.uint8), MPI.BYTE])

    def offload(self) -> None:
        if self.persistent is not None:
            self.persistent.post()
            self.persistent.wait()
        else:
            self.team.alltoall(self.src, self.dst).wait()

    def mpi(self) -> None:
        self.comm.Alltoall(*self._mpi_bufs)

    def check(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        bad = np.flatnonzero(dst != self.expected)
        if bad.size:
            i = int(bad[0])
            q, j = divmod(i, self.count) if self.count else (0, i)
            raise WrongResult(
                f"{which} all-to-all gave a WRONG RESULT on rank {self.team.rank}/{self.team.size} "
                f"with {self.count} elements per peer: {bad.size} elements differ; first at "
                f"index {i} (block from rank {q}, element {j}): got {dst[i].item()!r}, "
                f"expected {self.expected[i].item()!r}"
            )

    def close(self) -> None:
        if self.persistent is not None:
            self.persistent.free()


# ---------------------------------------------------------------------------------------------
# all-to-all-v


def alltoallv_counts(n: int, count: int) -> np.ndarray:
    """The benchmark's count matrix: ``m[r, j]`` elements rank r sends to rank j.

    Uneven around ``count`` (from 0.5x to 1.5x, cyclic in r + j), so every row and every column
    adds up to about ``n * count``, and every rank can compute the whole matrix.
    """
    r, j = np.indices((n, n))
    factor = 0.5 + (((r + j) % n) + 0.5) / n
    return np.rint(count * factor).astype(np.int64)


class _AlltoallvCase(_Case):
    """Buffers for one average message size; ``offload()`` and ``mpi()`` each run one
    all-to-all-v, counts exchanged as part of the op (by the DPA; by ``comm.Alltoall``)."""

    def __init__(self, ctx: Any, team: Any, comm: Any, count: int, dt: np.dtype,
                 buffers: str, persistent: bool) -> None:
        n, me = team.size, team.rank
        m = alltoallv_counts(n, count)
        self.team, self.comm, self.count, self.matrix = team, comm, count, m
        self.sends, self.recvs = m[me], m[:, me]
        # algbw's bytes: what the average rank sends (the matrix is the same on every rank)
        self.bytes_per_rank = int(m.sum()) * dt.itemsize // n
        n_src, n_dst = int(self.sends.sum()), int(self.recvs.sum())
        alloc = (lambda k: ctx.empty(k, dt)) if buffers == "shared" else (
            lambda k: np.empty(k, dt))
        self.src, self.dst = alloc(n_src), alloc(n_dst)
        self.src[:] = _packed([block_pattern(dt, me, p, int(self.sends[p])) for p in range(n)], dt)
        self.expected = _packed([block_pattern(dt, q, me, int(self.recvs[q])) for q in range(n)],
                                dt)
        self.got_counts: dict[str, np.ndarray] = {}
        if comm is not None:
            from mpi4py import MPI

            self.mpi_src, self.mpi_dst = self.src.copy(), np.empty(n_dst, dt)
            # counts in elements: one element = itemsize bytes, whatever the dtype
            self._mpi_type = MPI.BYTE.Create_contiguous(dt.itemsize).Commit()
            self._scounts = self.sends.astype(np.int32)
            self._sdispls = _displs(self._scounts)
            self._rcounts = np.empty(n, np.int32)
            self._int = MPI.INT

    def offload(self) -> None:
        self.got_counts["offload"] = self.team.alltoallv(self.src, self.sends, self.dst).wait()

    def mpi(self) -> None:
        comm, t = self.comm, self._mpi_type
        comm.Alltoall([self._scounts, self._int], [self._rcounts, self._int])
        rdispls = _displs(self._rcounts)
        comm.Alltoallv([self.mpi_src, (self._scounts, self._sdispls), t],
                       [self.mpi_dst, (self._rcounts, rdispls), t])
        self.got_counts["mpi"] = self._rcounts

    def check(self, which: str) -> None:
        me, n = self.team.rank, self.team.size
        where = (f"{which} all-to-all-v gave a WRONG RESULT on rank {me}/{n} with "
                 f"{self.count} elements per peer on average")
        got = np.asarray(self.got_counts.get(which))
        if got.shape != (n,) or (got != self.recvs).any():
            raise WrongResult(f"{where}: receive counts {got.tolist()}, expected "
                              f"{self.recvs.tolist()}")
        dst = self.dst if which == "offload" else self.mpi_dst
        bad = np.flatnonzero(dst != self.expected)
        if bad.size:
            i = int(bad[0])
            q = int(np.searchsorted(np.cumsum(self.recvs), i, side="right"))
            j = i - int(self.recvs[:q].sum())
            raise WrongResult(
                f"{where}: {bad.size} elements differ; first at index {i} (block from rank {q}, "
                f"element {j}): got {dst[i].item()!r}, expected {self.expected[i].item()!r}")

    def close(self) -> None:
        if self.comm is not None:
            self._mpi_type.Free()


# ---------------------------------------------------------------------------------------------
# multicast: broadcast and all-gather


def _injected(ctx: Any) -> int:
    return int(ctx.stats()["mcast_bytes_sent"])


class _BroadcastCase(_Case):
    """One buffer of ``count`` elements broadcast from rank 0 (nccl-tests: size = buffer)."""

    def __init__(self, ctx: Any, team: Any, comm: Any, count: int, dt: np.dtype,
                 buffers: str, persistent: bool) -> None:
        self.ctx, self.team, self.comm, self.count = ctx, team, comm, count
        self.bytes_per_rank = count * dt.itemsize   # algbw = size / time
        self.expected = block_pattern(dt, 0, 0, count)
        self.dst = ctx.empty(count, dt) if buffers == "shared" else np.empty(count, dt)
        self.mpi_dst = np.empty(count, dt) if comm is not None else None

    def _fill(self, dst: np.ndarray) -> None:
        if self.team.rank == 0:   # the root's buffer is the source: always the data
            dst[:] = self.expected

    def offload(self) -> None:
        self.team.broadcast(self.dst, root=0).wait()

    def mpi(self) -> None:
        self.comm.Bcast(self.mpi_dst.view(np.uint8), root=0)

    def check(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        bad = np.flatnonzero(dst != self.expected)
        if bad.size:
            i = int(bad[0])
            raise WrongResult(
                f"{which} broadcast gave a WRONG RESULT on rank {self.team.rank}/{self.team.size}"
                f" with {self.count} elements: {bad.size} differ; first at {i}: got "
                f"{dst[i].item()!r}, expected {self.expected[i].item()!r}")

    def close(self) -> None:
        pass


class _AllgatherCase(_Case):
    """All-gather into ``count`` elements in all (nccl-tests: size = the output buffer), so
    each rank contributes count / n."""

    def __init__(self, ctx: Any, team: Any, comm: Any, count: int, dt: np.dtype,
                 buffers: str, persistent: bool) -> None:
        n, me = team.size, team.rank
        per = count // n
        self.ctx, self.team, self.comm, self.count, self.per = ctx, team, comm, count, per
        self.bytes_per_rank = per * n * dt.itemsize  # algbw = size / time, as nccl-tests
        alloc = (lambda k: ctx.empty(k, dt)) if buffers == "shared" else (
            lambda k: np.empty(k, dt))
        self.src, self.dst = alloc(per), alloc(per * n)
        self.src[:] = block_pattern(dt, me, 0, per)
        self.expected = _packed([block_pattern(dt, q, 0, per) for q in range(n)], dt)
        if comm is not None:
            self.mpi_src, self.mpi_dst = self.src.copy(), np.empty(per * n, dt)

    def offload(self) -> None:
        self.team.allgather(self.src, self.dst).wait()

    def mpi(self) -> None:
        self.comm.Allgather(self.mpi_src.view(np.uint8), self.mpi_dst.view(np.uint8))

    def check(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        bad = np.flatnonzero(dst != self.expected)
        if bad.size:
            i = int(bad[0])
            raise WrongResult(
                f"{which} all-gather gave a WRONG RESULT on rank {self.team.rank}/"
                f"{self.team.size} with {self.per} elements per rank: {bad.size} differ; first "
                f"at {i} (block of rank {i // max(self.per, 1)}): got {dst[i].item()!r}, "
                f"expected {self.expected[i].item()!r}")

    def close(self) -> None:
        pass


def _packed(blocks: list[np.ndarray], dt: np.dtype) -> np.ndarray:
    return np.concatenate(blocks) if blocks else np.empty(0, dt)


def _displs(counts: np.ndarray) -> np.ndarray:
    out = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=out[1:])
    return out


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("alltoall", "block j of src goes to rank j", _all_but_one, _AlltoallCase,
               mpi_desc="comm.Alltoall", persistent=True),
    Collective("alltoallv", "variable-size all-to-all, counts exchanged by the DPA",
               _all_but_one, _AlltoallvCase,
               mpi_desc="comm.Alltoall of the counts + comm.Alltoallv"),
    Collective("broadcast", "multicast broadcast from rank 0", _one, _BroadcastCase,
               mpi_desc="comm.Bcast"),
    Collective("allgather", "multicast all-gather", _all_but_one, _AllgatherCase,
               mpi_desc="comm.Allgather"),
    Collective("moe", "MoE dispatch + combine (offload_lib.moe)", _all_but_one,
               suite="offload_lib.bench.moe"),
    Collective("allreduce", "SUM allreduce reduced by the DPA threads", lambda n: 2 * (n - 1) / n,
               lambda *a: _reduction_case("AllreduceCase", *a), mpi_desc="comm.Allreduce"),
    Collective("reduce_scatter", "SUM reduce-scatter reduced by the DPA threads", _all_but_one,
               lambda *a: _reduction_case("ReduceScatterCase", *a),
               mpi_desc="comm.Reduce_scatter_block"),
)}
