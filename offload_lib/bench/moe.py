"""``dpa-offload bench moe``: MoE token dispatch and combine (offload_lib.moe) against mpi4py.

One configuration per run (``--tokens``, ``--hidden``, ``--topk``, ``--experts``, ``--dtype``):
every rank routes its tokens to ``topk`` distinct experts drawn from a seeded generator (so
every rank can recompute every other rank's routing and check what it received), then times,
per iteration and each after a barrier, ``Dispatcher.dispatch`` and ``Dispatcher.combine``.
The "experts" are the identity scaled by the token's weights, computed once outside the timing.

``--compare mpi`` times the usual mpi4py implementation in the same processes, with the same
routing arithmetic as offload_lib.moe: dispatch = the gather of the rows into a send buffer,
then ``comm.Alltoall`` of the row counts, ``comm.Alltoallv`` of the rows and of the routing
metadata; combine = ``comm.Alltoallv`` of the rows back, packed by source rank, then
``sum_rows`` (gather each token's rows, add them). The offload side has the DPA do both
scatters and gathers: dispatch gathers the rows from x by index, combine lands each row in
its token's slot, so its host work is ``moe.sum_slots`` (contiguous adds). Sums are float32
for float16/float32 payloads, in rank order, rounded once, on both sides.

Rows of the table: one per phase, and "both" (dispatch + combine of the same iteration).
``rows`` and ``bytes``: token rows a rank sends in that phase (mean over ranks); GB/s = bytes
/ time; time: median over iterations of the slowest rank.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from offload_lib.bench.cases import GB, WrongResult
from offload_lib.bench.table import header_lines, render_rows, summarize
from offload_lib.moe import _PAYLOADS, _bf16_bits_to_f32

__all__ = ["aggregate", "check_args", "format_table", "routing", "token_rows", "work"]

SEED = 20261129
DTYPES = ("float16", "float32", "float64")
PHASES = ("dispatch", "combine", "both")  # both: dispatch + combine of one iteration


# ---------------------------------------------------------------------------------------------
# inputs every rank can recompute for every other rank


def routing(rank: int, tokens: int, topk: int, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s ``topk_idx`` (int64, ``topk`` distinct experts per token, uniform) and
    ``topk_weights`` (float32, multiples of 1/4 in [0.25, 1])."""
    rng = np.random.default_rng([SEED, rank])
    idx = np.argsort(rng.random((tokens, experts)), axis=1)[:, :topk].astype(np.int64)
    weights = rng.integers(1, 5, size=(tokens, topk)).astype(np.float32) / np.float32(4)
    return idx, weights


def _modulus(dt: np.dtype, topk: int) -> int:
    # token values are integers below this: exact in dt, and a combined sum stays finite
    return 2048 if dt != np.float16 else max(16, min(2048, 32768 // topk))


def token_rows(rank: int, tokens: np.ndarray, hidden: int, dt: np.dtype, topk: int) -> np.ndarray:
    """Rows ``tokens`` of rank ``rank``'s input x: [len(tokens), hidden] of dt."""
    t = np.asarray(tokens, np.int64)[:, None] * 131 + rank * 7919
    vals = (t + np.arange(hidden, dtype=np.int64)[None, :] * 31) % _modulus(dt, topk)
    return vals.astype(dt)


def _expert(recv_x: np.ndarray, recv_idx: np.ndarray, recv_w: np.ndarray) -> np.ndarray:
    """y[row] = sum_j w[row, j] * recv_x[row] over the local experts j (identity experts)."""
    acc = np.float64 if recv_x.dtype == np.float64 else np.float32
    scale = np.where(recv_idx >= 0, recv_w, 0).sum(axis=1, dtype=acc)
    return (recv_x.astype(acc) * scale[:, None]).astype(recv_x.dtype)


class _Expected:
    """What rank ``me`` must receive from dispatch and get back from combine."""

    def __init__(self, me: int, n: int, tokens: int, hidden: int, topk: int, experts: int,
                 dt: np.dtype) -> None:
        per_rank = experts // n
        rows, idx, w, counts = [], [], [], []
        for r in range(n):
            r_idx, r_w = routing(r, tokens, topk, experts)
            mine = (r_idx // per_rank) == me
            toks = np.flatnonzero(mine.any(axis=1))
            counts.append(toks.size)
            rows.append(token_rows(r, toks, hidden, dt, topk))
            idx.append(np.where(mine[toks], r_idx[toks] - me * per_rank, -1))
            w.append(np.where(mine[toks], r_w[toks], np.float32(0)))
        self.me, self.n = me, n
        self.recv_rows = np.array(counts, np.int64)
        self.x = np.concatenate(rows)
        self.idx = np.concatenate(idx).astype(np.int64)
        self.w = np.concatenate(w)
        _, my_w = routing(me, tokens, topk, experts)
        acc = np.float64 if dt == np.float64 else np.float32
        x = token_rows(me, np.arange(tokens), hidden, dt, topk).astype(acc)
        self.out = x * my_w.sum(axis=1, dtype=acc)[:, None]
        self.rtol = 4 * topk * float(np.finfo(dt).eps)

    def check_dispatch(self, which: str, recv_x: Any, recv_idx: Any, recv_w: Any) -> None:
        where = f"{which} MoE dispatch gave a WRONG RESULT on rank {self.me}/{self.n}"
        for name, got, want in (("recv_x", recv_x, self.x), ("recv_topk_idx", recv_idx, self.idx),
                                ("recv_topk_weights", recv_w, self.w)):
            got = np.asarray(got)
            if got.shape != want.shape or got.dtype != want.dtype:
                raise WrongResult(f"{where}: {name} is {got.dtype}{list(got.shape)}, expected "
                                  f"{want.dtype}{list(want.shape)} (rows per source "
                                  f"{self.recv_rows.tolist()})")
            bad = np.argwhere(got != want)
            if bad.size:
                pos = tuple(int(i) for i in bad[0])
                src = int(np.searchsorted(np.cumsum(self.recv_rows), pos[0], side="right"))
                raise WrongResult(f"{where}: {name} differs in {len(bad)} places; first at "
                                  f"{list(pos)} (a row from rank {src}): got {got[pos].item()!r}, "
                                  f"expected {want[pos].item()!r}")

    def check_combine(self, which: str, out: Any) -> None:
        where = f"{which} MoE combine gave a WRONG RESULT on rank {self.me}/{self.n}"
        got = np.asarray(out)
        if got.shape != self.out.shape:
            raise WrongResult(f"{where}: shape {list(got.shape)}, expected {list(self.out.shape)}")
        err = np.abs(got.astype(self.out.dtype) - self.out)
        bad = np.argwhere(~(err <= self.rtol * np.abs(self.out)))
        if bad.size:
            pos = tuple(int(i) for i in bad[0])
            raise WrongResult(f"{where}: {len(bad)} elements off by more than {self.rtol:.2g} "
                              f"(relative); first at {list(pos)}: got {got[pos].item()!r}, "
                              f"expected {self.out[pos].item()!r}")


# ---------------------------------------------------------------------------------------------
# the mpi4py equivalent


def _displs(counts: np.ndarray) -> np.ndarray:
    out = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=out[1:])
    return out


class _MpiMoe:
    """Dispatch and combine with mpi4py, the same host work as offload_lib.moe.Dispatcher."""

    def __init__(self, comm: Any, tokens: int, hidden: int, topk: int, experts: int,
                 dt: np.dtype, max_send: int, max_recv: int) -> None:
        from mpi4py import MPI

        self.comm, self.n, self.me = comm, comm.Get_size(), comm.Get_rank()
        self.per_rank = experts // self.n
        self.tokens, self.hidden, self.dt, self.width = tokens, hidden, dt, 2 * topk
        self.row_type = MPI.BYTE.Create_contiguous(dt.itemsize).Commit()
        self.int64 = MPI.INT64_T
        self.int = MPI.INT
        # dispatch's send, combine's receive (and a zero row for sum_rows)
        self.stage = np.empty((max_send + 1, hidden), dt)
        self.scratch = np.empty((tokens, hidden), dt)
        self.recv = np.empty((max_recv, hidden), dt)
        self.meta_send = np.empty((max_send, self.width), np.int64)
        self.meta_recv = np.empty((max_recv, self.width), np.int64)
        self.recv_rows = np.empty(self.n, np.int32)

    def close(self) -> None:
        self.row_type.Free()

    def _v(self, buf: np.ndarray, rows: np.ndarray, per_row: int, t: Any) -> list[Any]:
        counts = rows * per_row
        return [buf, (counts, _displs(counts)), t]

    def dispatch(self, x: np.ndarray, idx: np.ndarray, w: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[Any, ...]]:
        n, k, hidden = self.n, idx.shape[1], self.hidden
        owners = idx // self.per_rank
        in_rank = np.zeros((idx.shape[0], n), dtype=bool)
        in_rank[np.arange(idx.shape[0])[:, None], owners] = True
        dest, tok = np.nonzero(in_rank.T)
        send_rows = np.bincount(dest, minlength=n).astype(np.int32)
        nsend = tok.size
        stage = self.stage[:nsend]
        np.take(x, tok, axis=0, out=stage, mode="clip")
        meta = self.meta_send[:nsend]
        mine = owners[tok] == dest[:, None]
        np.copyto(meta[:, :k], np.where(mine, idx[tok] - (dest * self.per_rank)[:, None], -1))
        meta[:, k:].view(np.float64)[...] = np.where(mine, w[tok], 0.0)

        comm = self.comm
        comm.Alltoall([send_rows, self.int], [self.recv_rows, self.int])
        recv_rows = self.recv_rows.copy()
        comm.Alltoallv(self._v(stage, send_rows, hidden, self.row_type),
                       self._v(self.recv, recv_rows, hidden, self.row_type))
        comm.Alltoallv(self._v(meta, send_rows, self.width, self.int64),
                       self._v(self.meta_recv, recv_rows, self.width, self.int64))
        nrecv = int(recv_rows.sum())
        got = self.meta_recv[:nrecv]
        recv_w = got[:, k:].view(np.float64).astype(w.dtype)
        return self.recv[:nrecv], got[:, :k].copy(), recv_w, (tok, send_rows, recv_rows)

    def combine(self, y: np.ndarray, handle: tuple[Any, ...]) -> np.ndarray:
        tok, send_rows, recv_rows = handle
        back = self.stage[:tok.size + 1]
        self.comm.Alltoallv(self._v(y, recv_rows, self.hidden, self.row_type),
                            self._v(back, send_rows, self.hidden, self.row_type))
        back[tok.size] = 0
        return sum_rows(back, tok, self.tokens, self.dt.name, self.scratch).astype(self.dt,
                                                                                copy=False)


def sum_rows(back: np.ndarray, tokens: np.ndarray, num_tokens: int, payload: str,
             scratch: np.ndarray) -> np.ndarray:
    """out[t] = the sum of the rows ``back[i]`` with ``tokens[i] == t``, in row order, widened
    to the payload's accumulation type; ``back`` holds one zero row after those ``tokens``
    names, and ``scratch`` (reused between calls) at least num_tokens rows like back's.
    (The usual host side of an MPI combine, where the rows come back packed by source
    rank; offload_lib.moe's combine lands them in slots and uses moe.sum_slots.)

    By contribution rather than by source rank: the c-th contributions of all tokens are
    gathered at once (a zero row where a token has fewer), so each step is one gather and
    one contiguous add, where adding into out[tokens of a rank] takes a gather, an add and
    a scatter. Gathers go into memory that is already mapped: a fresh array of this size
    costs the kernel a page fault and a page of zeros per 4 KiB."""
    p = _PAYLOADS[payload]
    hidden = back.shape[1]
    zero_row = back.shape[0] - 1
    order = np.argsort(tokens, kind="stable")  # by token, each token's rows in row order
    per_token = np.bincount(tokens, minlength=num_tokens)
    depth = int(per_token.max()) if per_token.size else 0
    if depth == 0:
        return np.zeros((num_tokens, hidden), p.acc)
    sorted_tokens = tokens[order]
    first = np.cumsum(per_token) - per_token
    nth = np.arange(order.size) - first[sorted_tokens]
    pos = np.full((depth, num_tokens), zero_row, np.intp)
    pos[nth, sorted_tokens] = order
    rows = back.view(np.uint16) if payload == "bfloat16" else back.view(payload)
    tmp = scratch.reshape(-1)[:num_tokens * hidden].view(rows.dtype).reshape(num_tokens, hidden)
    out = np.empty((num_tokens, hidden), p.acc)
    for c in range(depth):
        same = c == 0 and rows.dtype == p.acc  # the first gather can land in out itself
        # mode="clip": with "raise", numpy gathers into a temporary first (indices are valid)
        got = np.take(rows, pos[c], axis=0, out=out if same else tmp, mode="clip")
        if same:
            continue
        vals = _bf16_bits_to_f32(got) if payload == "bfloat16" else got
        if c == 0:
            out[...] = vals
        else:
            out += vals
    return out


# ---------------------------------------------------------------------------------------------
# one rank


def _timed_pair(dispatch: Callable[[], Any], combine: Callable[[Any], Any],
                barrier: Callable[[], None], warmup: int, iters: int) -> dict[str, list[float]]:
    """Per timed iteration: dispatch, then combine of its handle, each after a barrier."""
    times: dict[str, list[float]] = {f"{p}_{m}": [] for p in PHASES for m in ("s", "cpu_s")}
    for it in range(warmup + iters):
        barrier()
        c0, t0 = time.thread_time(), time.perf_counter()
        handle = dispatch()
        t1, c1 = time.perf_counter(), time.thread_time()
        barrier()
        c2, t2 = time.thread_time(), time.perf_counter()
        combine(handle)
        t3, c3 = time.perf_counter(), time.thread_time()
        if it >= warmup:
            times["dispatch_s"].append(t1 - t0)
            times["dispatch_cpu_s"].append(c1 - c0)
            times["combine_s"].append(t3 - t2)
            times["combine_cpu_s"].append(c3 - c2)
            times["both_s"].append(t1 - t0 + t3 - t2)
            times["both_cpu_s"].append(c1 - c0 + c3 - c2)
    return times


def work(ctx: Any, team: Any, comm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Check, then time, offload_lib.moe (and mpi4py); one result entry per phase."""
    from offload_lib import moe

    n, me, dt = team.size, team.rank, args.dtype
    tokens, hidden, topk, experts = args.tokens, args.hidden, args.topk, args.experts
    idx, w = routing(me, tokens, topk, experts)
    x = ctx.empty((tokens, hidden), dt) if args.buffers == "shared" else np.empty(
        (tokens, hidden), dt)
    x[...] = token_rows(me, np.arange(tokens), hidden, dt, topk)
    expected = _Expected(me, n, tokens, hidden, topk, experts, dt)
    nsend = int(((idx // (experts // n))[:, :, None] == np.arange(n)).any(axis=1).sum())
    nrecv = int(expected.recv_rows.sum())
    row_bytes = hidden * dt.itemsize
    entries = [{"phase": "dispatch", "rows": nsend, "bytes": nsend * row_bytes},
               {"phase": "combine", "rows": nrecv, "bytes": nrecv * row_bytes},
               {"phase": "both", "rows": nsend + nrecv, "bytes": (nsend + nrecv) * row_bytes}]

    def measure(which: str, dispatch: Callable[..., Any], combine: Callable[..., Any],
                barrier: Callable[[], None]) -> None:
        recv_x, recv_idx, recv_w, handle = dispatch(x, idx, w)
        expected.check_dispatch(which, recv_x, recv_idx, recv_w)
        y = _expert(np.asarray(recv_x), np.asarray(recv_idx), np.asarray(recv_w))
        expected.check_combine(which, combine(y, handle))
        last: dict[str, Any] = {}

        def run_dispatch() -> Any:
            last["d"] = dispatch(x, idx, w)
            return last["d"][3]

        def run_combine(h: Any) -> None:
            last["c"] = combine(y, h)

        times = _timed_pair(run_dispatch, run_combine, barrier, args.warmup, args.iters)
        expected.check_dispatch(which, *last["d"][:3])
        expected.check_combine(which, last["c"])
        for e in entries:
            e[f"{which}_s"] = times[f"{e['phase']}_s"]
            e[f"{which}_cpu_s"] = times[f"{e['phase']}_cpu_s"]

    d = moe.Dispatcher(team, experts, hidden, tokens, dt)
    measure("offload", d.dispatch, d.combine, lambda: team.barrier().wait())
    if comm is not None:
        m = _MpiMoe(comm, tokens, hidden, topk, experts, dt, nsend, nrecv)
        try:
            measure("mpi", m.dispatch, m.combine, comm.Barrier)
        finally:
            m.close()
    return entries


# ---------------------------------------------------------------------------------------------
# the parent: options, aggregation, the table


def check_args(args: argparse.Namespace) -> str | None:
    """Why these options do not fit the moe benchmark, or None."""
    if "sizes" in args.given:
        return "moe takes --tokens/--hidden/--topk/--experts, not --sizes"
    if args.persistent:
        return "moe has no persistent form; drop --persistent"
    if args.dtype.name not in DTYPES:
        return f"moe moves {', '.join(DTYPES)} payloads, not {args.dtype.name}"
    if args.experts % args.nranks:
        return (f"--experts {args.experts} does not split evenly over {args.nranks} ranks: "
                f"use a multiple of {args.nranks}")
    if args.topk > args.experts:
        return f"--topk {args.topk} is more than --experts {args.experts}"
    return None


def aggregate(nranks: int, per_rank: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per phase: the slowest rank's median time, the mean rows/bytes per rank."""
    rows = []
    for i, entry in enumerate(per_rank[0]["results"]):
        mine = [r["results"][i] for r in per_rank]
        nbytes = float(np.mean([e["bytes"] for e in mine]))
        t = summarize([e["offload_s"] for e in mine])
        row: dict[str, Any] = {
            "phase": entry["phase"], "rows": float(np.mean([e["rows"] for e in mine])),
            "bytes": nbytes, "time_us": t * 1e6, "gbps": nbytes / t / GB if t > 0 else 0.0,
            "cpu_us": float(np.median(entry["offload_cpu_s"])) * 1e6,
        }
        if "mpi_s" in entry:
            mt = summarize([e["mpi_s"] for e in mine])
            row.update(mpi_time_us=mt * 1e6, mpi_gbps=nbytes / mt / GB if mt > 0 else 0.0,
                       mpi_cpu_us=float(np.median(entry["mpi_cpu_s"])) * 1e6,
                       ratio=mt / t if t > 0 else float("nan"))
        rows.append(row)
    return rows


# (key, header, unit, width, format)
_COLUMNS = (
    ("phase", "phase", "", 10, "{}"),
    ("rows", "rows", "(per rank)", 12, "{:.0f}"),
    ("bytes", "bytes", "(per rank)", 12, "{:.0f}"),
    ("time_us", "time_us", "(us)", 11, "{:.1f}"),
    ("gbps", "GB/s", "", 8, "{:.2f}"),
    ("cpu_us", "cpu_us", "(us)", 10, "{:.1f}"),
)
_MPI_COLUMNS = (
    ("mpi_time_us", "mpi_time_us", "(us)", 13, "{:.1f}"),
    ("mpi_gbps", "mpi_GB/s", "", 10, "{:.2f}"),
    ("mpi_cpu_us", "mpi_cpu_us", "(us)", 12, "{:.1f}"),
    ("ratio", "ratio", "(mpi/ours)", 12, "{:.2f}"),
)


def format_table(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    compare = bool(rows) and "mpi_time_us" in rows[0]
    cols = _COLUMNS + (_MPI_COLUMNS if compare else ())
    lines = [
        *header_lines({"collective": "moe", **meta}),
        f"# tokens: {meta.get('tokens', '?')}  hidden: {meta.get('hidden', '?')}  "
        f"topk: {meta.get('topk', '?')}  experts: {meta.get('experts', '?')}  "
        f"dtype: {meta.get('dtype', '?')}  buffers (x): {meta.get('buffers', '?')}  "
        f"iters: {meta.get('iters', '?')}  warmup: {meta.get('warmup', '?')}  "
        f"launcher: {meta.get('launcher', '?')}",
        "# offload: offload_lib.moe.Dispatcher dispatch (2 all-to-all-v: rows, routing "
        "metadata) and combine (1 placed all-to-all-v + sum); counts exchanged by the DPA",
    ]
    if compare:
        lines.append(f"# mpi: {meta.get('mpi', '?')} (mpi4py {meta.get('mpi4py', '?')}), same "
                     "processes: dispatch = gather + Alltoall(counts) + Alltoallv(rows) + "
                     "Alltoallv(metadata), combine = Alltoallv(rows) + sum_rows (gather, "
                     "add); ours: the DPA gathers (dispatch) and places (combine) the rows, the "
                     "host adds (moe.sum_slots)")
    lines += [
        "# time: median over iterations of the slowest rank; rows/bytes: token rows a rank "
        "sends (mean over ranks); GB/s = bytes/time (1e9); cpu_us: rank 0's thread CPU time",
    ]
    return "\n".join(lines + render_rows(cols, rows)) + "\n"
