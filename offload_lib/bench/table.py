"""Aggregation over ranks (per size, the median over iterations of the slowest rank) and
the nccl-tests-style table."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from offload_lib.bench.cases import GB, PROG

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
         if meta.get("background_load") else []) + \
        (["# address layout: fixed (the ranks ran with ASLR off)"]
         if meta.get("layout_randomized") is False else [])


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
