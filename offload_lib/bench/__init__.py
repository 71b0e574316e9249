"""``dpa-offload bench``: nccl-tests-style collective benchmarks, optionally against MPI.

The parent process (``main``) starts N ranks running ``python -m offload_lib.bench --worker ...``,
with the local launcher, or with ``mpirun`` under ``--compare mpi`` so that every rank can time
both offload_lib and MPI on the same machine state. Each rank writes its raw per-iteration times
to ``<result-dir>/rank<r>.json``; the parent takes, per size, the median over iterations of the
slowest rank and prints the table. ``moe`` is not one op per size: its measurement, options
and table live in offload_lib.bench.moe (the registry's ``suite``).

The package: ``cases`` (the registry, data patterns, one case per collective), ``runner``
(arguments, the worker, the parent), ``table`` (aggregation and the table), ``moe`` and
``reduce`` (their suites' cases).
"""
from __future__ import annotations

from offload_lib.bench.cases import (
    COLLECTIVES,
    GB,
    WrongResult,
    _AlltoallCase,
    _AlltoallvCase,
    _poison,
    alltoallv_counts,
    block_pattern,
)
from offload_lib.bench.runner import _timed, find_mpirun, main, parse_args, parse_sizes
from offload_lib.bench.table import aggregate, format_table, make_row, summarize

__all__ = ["COLLECTIVES", "GB", "WrongResult", "aggregate", "alltoallv_counts", "block_pattern",
           "find_mpirun", "format_table", "main", "make_row", "parse_args", "parse_sizes",
           "summarize", "_AlltoallCase", "_AlltoallvCase", "_poison", "_timed"]
