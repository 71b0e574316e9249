"""`dpa-offload bench allreduce` and `bench reduce_scatter` (SUM): the cases bench.py runs.

Inputs are the benchmark's integer patterns; the DPA's result is checked bit for bit against
the reference of its fixed order (offload_lib._reduce.reference), MPI's against the same
within the float tolerance of another order."""
from __future__ import annotations

from typing import Any

import numpy as np

from offload_lib._reduce import reference
from offload_lib.bench import WrongResult, block_pattern


class _ReductionCase:
    kind = ""

    def __init__(self, ctx: Any, team: Any, comm: Any, count: int, dt: np.dtype,
                 buffers: str, persistent: bool) -> None:
        n, me = team.size, team.rank
        self.team, self.comm, self.count = team, comm, count
        self.bytes_per_rank = count * dt.itemsize  # size: the input buffer, as nccl-tests
        alloc = (lambda k: ctx.empty(k, dt)) if buffers == "shared" else (
            lambda k: np.empty(k, dt))
        out = count if self.kind == "allreduce" else count // n
        self.src, self.dst = alloc(count), alloc(out)
        self.src[:] = block_pattern(dt, me, 0, count)
        total = reference("sum", [block_pattern(dt, q, 0, count) for q in range(n)])
        lo = 0 if self.kind == "allreduce" else me * out
        self.expected = np.asarray(total[lo:lo + out]).astype(dt)
        self.mpi_dst = None
        if comm is not None:
            self.mpi_src, self.mpi_dst = self.src.copy(), np.empty(out, dt)

    def verify(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        dst.fill(0)
        (self.offload if which == "offload" else self.mpi)()
        self.check(which)

    def check(self, which: str) -> None:
        dst = self.dst if which == "offload" else self.mpi_dst
        if which == "offload" or dst.dtype.kind != "f":
            bad = np.flatnonzero(dst != self.expected)
        else:  # MPI sums in another order
            bad = np.flatnonzero(~np.isclose(dst, self.expected, rtol=1e-5 * self.team.size))
        if bad.size:
            i = int(bad[0])
            raise WrongResult(f"{which} {self.kind} gave a WRONG RESULT on rank {self.team.rank}/"
                              f"{self.team.size}: {bad.size} elements differ; first at {i}: got "
                              f"{dst[i].item()!r}, expected {self.expected[i].item()!r}")

    def close(self) -> None:
        pass


class AllreduceCase(_ReductionCase):
    kind = "allreduce"

    def offload(self) -> None:
        self.team.allreduce(self.src, "sum", out=self.dst).wait()

    def mpi(self) -> None:
        from mpi4py import MPI

        self.comm.Allreduce(self.mpi_src, self.mpi_dst, op=MPI.SUM)


class ReduceScatterCase(_ReductionCase):
    kind = "reduce_scatter"

    def offload(self) -> None:
        self.team.reduce_scatter(self.src, self.dst, "sum").wait()

    def mpi(self) -> None:
        from mpi4py import MPI

        self.comm.Reduce_scatter_block(self.mpi_src, self.mpi_dst, op=MPI.SUM)
