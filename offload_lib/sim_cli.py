"""``dpa-offload sim``: the firmware in simulated time (the dpa-sim binary, built with the
package from the same firmware sources; docs/simulation.md).

    dpa-offload sim alltoall -n 64 --size 1M [--model f.yaml] [--seed K] [--trace out.json]
    dpa-offload sim allgather -n 8 --size 64K --sweep n=8..64 [--csv F] [--plot F]
    dpa-offload sim explore [--seeds 0..1999] [--jobs 2] [--budget S]
    dpa-offload sim replay g1:48213 [--events F]
    dpa-offload sim check [-n 2..64] [--threads T]
    dpa-offload sim model [--model f.yaml] [--markdown]
"""
from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from offload_lib import sim_model
from offload_lib.config import parse_size
from offload_lib.errors import InvalidArgument

COLLECTIVES = ("alltoall", "alltoallv", "moe", "barrier", "broadcast", "allgather",
               "reduce_scatter", "allreduce")
REAL_LIMIT = 256 << 20   # --payload auto: real bytes while all buffers fit in this
GB = 1e9


def _range(text: str, what: str) -> tuple[int, int]:
    try:
        lo, _, hi = text.partition("..")
        return int(lo), int(hi or lo)
    except ValueError:
        raise InvalidArgument(f"{what} wants LO..HI, e.g. 0..1999, got {text!r}") from None


def _bus_factor(coll: str, n: int) -> float:
    if coll == "broadcast":
        return 1.0
    if coll == "allreduce":
        return 2 * (n - 1) / n
    if coll == "barrier":
        return 0.0
    return (n - 1) / n


def _op_size(coll: str, n: int, size: int) -> int:
    """The per-op size dpa-sim takes, from nccl-tests' size (bytes per rank)."""
    if coll in ("alltoall", "alltoallv", "allgather"):
        if size and size < n:
            raise InvalidArgument(f"--size {size} is less than one byte per rank of {n}: raise it")
        return size // n
    if coll == "moe":
        return size  # bytes per token (a row)
    if coll == "reduce_scatter":
        return size // (8 * n) * 8 * n
    if coll == "allreduce":
        return size // 8 * 8
    return 0 if coll == "barrier" else size


def _buffers(coll: str, n: int, size: int) -> int:
    return 2 * size * n if coll != "barrier" else 0


def _topology(text: str) -> dict[str, int]:
    if text == "switch":
        return {"topo_hosts_per_leaf": 0}
    kind, _, rest = text.partition(":")
    if kind != "fattree":
        raise InvalidArgument(f"--topology {text!r}: want 'switch' or "
                              "'fattree:hosts_per_leaf=K,uplinks=U'")
    out = {"topo_hosts_per_leaf": 32, "topo_uplinks": 32}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        names = {"hosts_per_leaf": "topo_hosts_per_leaf", "uplinks": "topo_uplinks"}
        if key not in names or not value.isdigit() or int(value) < 1:
            raise InvalidArgument(f"--topology: {part!r} is not hosts_per_leaf=K or uplinks=U (K, U >= 1)")
        out[names[key]] = int(value)
    return out


def _signal_death(signum: int, n: int, stderr: str) -> str:
    """What to tell a user whose dpa-sim a signal ended (a SIGKILL is mostly the OOM killer)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = (f"dpa-sim (n={n}) was killed by {name}")
    if signum == signal.SIGKILL:
        why += (": most likely the kernel's OOM killer (every rank holds O(n) state; "
                "docs/simulation.md, Scale): use fewer ranks or --payload phantom")
    tail = stderr.strip().splitlines()[-3:]
    return why + ("; its last words: " + " | ".join(tail) if tail else "")


def run_one(coll: str, n: int, size: int, model: dict[str, int], *, seed: int = 1,
            threads: int = 16, chunk: int = 1 << 20, a2a_window: int = 0, payload: str = "auto",
            iters: int = 1, trace: str | None = None, events: str | None = None,
            extra: Sequence[str] = ()) -> dict[str, Any]:
    """One simulated op (the last of ``iters``); returns dpa-sim's result, plus a row."""
    if payload == "auto":
        payload = "real" if _buffers(coll, n, size) <= REAL_LIMIT and coll != "moe" else "phantom"
    if payload == "phantom" and coll in ("reduce_scatter", "allreduce"):
        raise InvalidArgument(f"{coll} reduces the bytes it moves: phantom payload cannot run it; "
                              f"use --payload real (n*size <= {REAL_LIMIT >> 20} MiB)")
    wire = ["coll=alltoallv", "vmode=3"] if coll == "moe" else [f"coll={coll}"]
    args = [str(sim_model.binary()), "run", *wire, f"n={n}", f"size={_op_size(coll, n, size)}",
            f"seed={seed}", f"threads={threads}", f"chunk={chunk}", f"a2a_window={a2a_window}",
            f"payload={payload}", f"iters={iters}", *extra]
    args += [f"model.{k}={v}" for k, v in model.items()]
    if trace:
        args.append(f"trace={trace}")
    if events:
        args.append(f"events={events}")
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode < 0:
        raise RuntimeError(_signal_death(-proc.returncode, n, proc.stderr))
    if proc.returncode == 2 or not proc.stdout.strip():
        raise InvalidArgument(proc.stderr.strip() or f"dpa-sim failed (exit {proc.returncode})")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if not res.get("ok"):
        raise RuntimeError(f"simulation failed: {res.get('error')}")
    t = res["time_ps"] / 1e12
    res["payload"] = payload
    if coll == "moe":  # nccl-tests' size: what a rank sends
        size = int(res["inj_bytes_mean"])
    res["row"] = {
        "size": size, "n": n, "time_us": t * 1e6,
        "algbw": size / t / GB if t > 0 and size else 0.0,
        "busbw": size / t / GB * _bus_factor(coll, n) if t > 0 and size else 0.0,
        "inj_mb": res["inj_bytes_mean"] / 1e6, "link_max_mb": res["inj_bytes_max"] / 1e6,
        "busy_mean": 100 * res["dpa_busy_mean"], "busy_max": 100 * res["dpa_busy_max"],
        "passes": res["passes"] / n, "events": res["events"],
    }
    if coll == "allgather":
        res["row"]["ring_mb"] = (n - 1) / n * size / 1e6
        eff = {**sim_model.defaults(), **model}
        res["row"]["ring_us"] = sim_model.ring_allgather_closed_form_s(eff, n, size // n) * 1e6
    return res


_COLS = (("size", "size", "(B)", 11, "{:d}"), ("n", "n", "", 6, "{:d}"),
         ("time_us", "time_us", "(us)", 12, "{:.2f}"), ("algbw", "algbw", "(GB/s)", 9, "{:.2f}"),
         ("busbw", "busbw", "(GB/s)", 9, "{:.2f}"), ("inj_mb", "inj/rank", "(MB)", 10, "{:.3f}"),
         ("link_max_mb", "link_max", "(MB)", 10, "{:.3f}"),
         ("busy_mean", "dpa_busy", "(% mean)", 10, "{:.1f}"),
         ("busy_max", "dpa_busy", "(% max)", 10, "{:.1f}"),
         ("passes", "passes", "(/rank)", 9, "{:.0f}"))


def format_table(title: str, rows: Sequence[dict[str, Any]]) -> str:
    from offload_lib.bench.table import render_rows

    cols = list(_COLS)
    if rows and "ring_mb" in rows[0]:
        cols.insert(6, ("ring_mb", "ring_inj", "(MB)", 10, "{:.3f}"))
    if rows and "closed_us" in rows[0]:
        cols += [("closed_us", "closed_us", "(us)", 12, "{:.2f}"),
                 ("closed_ratio", "sim/closed", "", 11, "{:.4f}")]
    return "\n".join([f"# {title}", *render_rows(cols, rows)])


def _sweep_ns(text: str) -> list[int]:
    key, _, rng = text.partition("=")
    if key != "n":
        raise InvalidArgument(f"--sweep {text!r}: want n=LO..HI (doubling), e.g. n=8..64")
    lo, hi = _range(rng, "--sweep n=")
    if lo < 2 or hi < lo:
        raise InvalidArgument(f"--sweep {text!r}: want 2 <= LO <= HI")
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def _human(nbytes: float) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and int(nbytes) % (1 << shift) == 0:
            return f"{int(nbytes) >> shift} {unit}"
    return f"{int(nbytes)} B"


def build_figure(coll: str, rows: Sequence[dict[str, Any]]) -> Any:
    """The sweep's figure: predicted time against ranks; for the multicast all-gather also
    a ring's closed-form time (where the curves cross is where multicast starts to win)
    and the bytes each rank injects, multicast S/n against a ring's (n-1)/n x S."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    ns = [r["n"] for r in rows]
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    gather = coll == "allgather"
    fig, axes = plt.subplots(1, 2 if gather else 1, figsize=(11 if gather else 6, 4.2))
    ax = axes[0] if gather else axes
    ax.loglog(ns, [r["time_us"] for r in rows], "o-", label=f"{coll} (simulated)")
    if gather:
        ax.loglog(ns, [r["ring_us"] for r in rows], "s--", label="ring all-gather (closed form)")
        wins = [r["n"] for r in rows if r["time_us"] < r["ring_us"]]
        if wins:
            ax.axvspan(min(wins), max(wins), color="tab:green", alpha=0.12,
                       label=f"multicast faster (n = {min(wins)}..{max(wins)})")
    if rows and "closed_us" in rows[0]:
        ax.loglog(ns, [r["closed_us"] for r in rows], "s--", label="closed form")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("time (us)")
    ax.set_title(f"{coll}, size {_human(rows[0]['size'])} (nccl-tests' size)" if rows else coll)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if gather:
        axes[1].loglog(ns, [r["inj_mb"] for r in rows], "o-", label="multicast: injected per rank")
        axes[1].loglog(ns, [r["ring_mb"] for r in rows], "s--", label="ring: (n-1)/n x S per rank")
        axes[1].set_xscale("log", base=2)
        axes[1].set_xlabel("ranks")
        axes[1].set_ylabel("MB injected per rank")
        axes[1].grid(True, which="both", alpha=0.3)
        axes[1].legend(fontsize=8)
    for a in fig.axes:
        a.xaxis.set_major_formatter(plain)
        a.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        a.yaxis.set_major_formatter(plain)
        a.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    fig.tight_layout()
    return fig


def _plot(path: str, coll: str, rows: Sequence[dict[str, Any]]) -> None:
    try:
        fig = build_figure(coll, rows)
    except ImportError:  # checked before the run; here only if it broke meanwhile
        raise InvalidArgument("--plot needs matplotlib (pip install 'dpa-offload[plot]')") from None
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_collective(coll: str, argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"dpa-offload sim {coll}")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--size", default="1M", help="bytes per rank (nccl-tests' size), e.g. 64K, 1M; "
                   "moe: ignored (--tokens x --hidden x 2 bytes, bf16)")
    p.add_argument("--tokens", type=int, default=4096, help="moe: tokens per rank (top-8 of 256 "
                   "experts, Zipf(1.2) popularity)")
    p.add_argument("--hidden", type=int, default=7168, help="moe: hidden size (bf16 rows)")
    p.add_argument("--model", help="YAML file of parameter: value (see 'dpa-offload sim model')")
    p.add_argument("--profile", choices=("default", "mechanics"), default="default")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=16, help="DPA threads per rank (default 16)")
    p.add_argument("--chunk-size", default="1M")
    p.add_argument("--a2a-window", type=int, default=0)
    p.add_argument("--mcast-roots", type=int, default=2, help="broadcast/all-gather: ranks that "
                   "inject at once (config.py's mcast_roots, default 2)")
    p.add_argument("--topology", default="switch")
    p.add_argument("--payload", choices=("real", "phantom", "auto"), default="auto")
    p.add_argument("--iters", type=int, default=1)
    p.add_argument("--trace", help="Chrome/Perfetto trace (JSON) of the measured op")
    p.add_argument("--events", help="the canonical event stream (text)")
    p.add_argument("--sweep", help="n=LO..HI: n doubling from LO")
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(list(argv))
    size = 2 * a.hidden if coll == "moe" else parse_size(a.size)
    known = sim_model.defaults()
    model = dict(sim_model.MECHANICS) if a.profile == "mechanics" else {}
    model.update(_topology(a.topology))
    model.update(sim_model.load_overrides(a.model, known))
    ns = _sweep_ns(a.sweep) if a.sweep else [a.n]
    for n in ns:
        if n < 1:  # the upper bound is dpa-sim's (SIM_MAX_RANKS), which names it
            raise InvalidArgument(f"-n {n}: a job holds at least 1 rank")
    if a.mcast_roots < 1:
        raise InvalidArgument(f"--mcast-roots {a.mcast_roots}: want at least 1 rank injecting at once")
    if a.plot and not a.sweep:
        raise InvalidArgument("--plot draws a sweep: add --sweep n=LO..HI")
    if a.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InvalidArgument("--plot needs matplotlib (pip install 'dpa-offload[plot]'), or drop --plot "
                                  "and plot the CSV yourself") from None
    rows = []
    for n in ns:
        res = run_one(coll, n, size, model, seed=a.seed, threads=a.threads,
                      chunk=parse_size(a.chunk_size), a2a_window=a.a2a_window, payload=a.payload,
                      iters=a.iters, trace=a.trace if n == ns[-1] else None,
                      events=a.events if n == ns[-1] else None,
                      extra=[f"tokens={a.tokens}"] if coll == "moe" else [f"roots={a.mcast_roots}"])
        row = res["row"]
        if coll == "alltoall" and a.profile == "mechanics" and a.threads == 1 and a.a2a_window == 1:
            eff = {**known, **model}
            closed = sim_model.pairwise_closed_form_s(eff, n, size // n) * 1e6
            row.update(closed_us=closed, closed_ratio=row["time_us"] / closed)
        rows.append(row)
        if a.json:
            print(json.dumps({k: v for k, v in res.items() if k != "row"} | {"row": row}))
    if not a.json:
        print(format_table(f"dpa-offload sim {coll}: {a.threads} DPA threads/rank, chunk {a.chunk_size}, "
                           f"topology {a.topology}, seed {a.seed}, payload {res['payload']} "
                           "(model predictions; see docs/simulation.md)", rows))
    if a.sweep:
        path = a.csv or f"sim_{coll}_sweep.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"# wrote {path}")
        if a.plot:
            _plot(a.plot, coll, rows)
            print(f"# wrote {a.plot}")
    return 0


def _cmd_explore(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="dpa-offload sim explore")
    p.add_argument("--seeds", default="0..1999")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--budget", type=float, default=0, help="seconds (0: no limit)")
    a = p.parse_args(list(argv))
    lo, hi = _range(a.seeds, "--seeds")
    jobs = max(1, a.jobs)
    t0 = time.monotonic()
    procs = [subprocess.Popen([str(sim_model.binary()), "explore", f"seeds={lo}..{hi}", f"stride={jobs}",
                               f"offset={j}", f"budget_s={a.budget}"], stdout=subprocess.PIPE, text=True)
             for j in range(jobs)]
    seeds = failures = ops_ok = ops_err = 0
    for proc in procs:
        out, _ = proc.communicate()
        for line in out.splitlines():
            rec = json.loads(line)
            if "failed_seed" in rec:
                print(f"FAILED seed {rec['failed_seed']}: {rec['error']}\n  replay: {rec['replay']}")
            else:
                seeds += rec["seeds"]
                failures += rec["failures"]
                ops_ok += rec.get("ops_ok", 0)
                ops_err += rec.get("ops_err", 0)
    print(json.dumps({"seeds": seeds, "failures": failures, "ops_ok": ops_ok, "ops_failed_named": ops_err,
                      "elapsed_s": round(time.monotonic() - t0, 3), "jobs": jobs}))
    return 1 if failures else 0


def _cmd_replay(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="dpa-offload sim replay")
    p.add_argument("token", help="GEN:SEED as the explorer printed it, e.g. g1:48213")
    p.add_argument("--events")
    a = p.parse_args(list(argv))
    gen, _, seed = a.token.partition(":")
    if gen != "g1" or not seed.isdigit():
        raise InvalidArgument(f"replay {a.token!r}: this build's generator is g1 (want g1:SEED); "
                              "a token of another generator names another scenario")
    args = [str(sim_model.binary()), "replay", f"seed={seed}"] + ([f"events={a.events}"] if a.events else [])
    return subprocess.call(args)


def _cmd_check(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="dpa-offload sim check")
    p.add_argument("-n", default="2..64")
    p.add_argument("--threads", type=int, default=4)
    a = p.parse_args(list(argv))
    lo, hi = _range(a.n, "-n")
    return subprocess.call([str(sim_model.binary()), "check", f"n={lo}..{hi}", f"threads={a.threads}"])


def _cmd_model(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="dpa-offload sim model")
    p.add_argument("--model")
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args(list(argv))
    values = sim_model.defaults()
    values.update(sim_model.load_overrides(a.model, values))
    if a.markdown:
        print(sim_model.markdown_table(values))
        return 0
    unit = sim_model.units()
    for name, v in values.items():
        conf, src = sim_model.SOURCES.get(name, ("?", "?"))
        print(f"{name:22} {v:>12} {unit.get(name, ''):12} {conf}  {src}")
    return 0


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd in COLLECTIVES:
            return _cmd_collective(cmd, rest)
        handlers = {"explore": _cmd_explore, "replay": _cmd_replay, "check": _cmd_check, "model": _cmd_model}
        if cmd not in handlers:
            raise InvalidArgument(f"sim {cmd!r}: want one of {', '.join(COLLECTIVES + tuple(handlers))}")
        return handlers[cmd](rest)
    except (InvalidArgument, RuntimeError) as e:
        print(f"dpa-offload sim: {e}", file=sys.stderr)
        return 2
