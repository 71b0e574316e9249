"""The ``dpa-offload`` command: ``run``, ``info``, ``bringup``, ``bench`` and ``sim``."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from offload_lib.errors import OffloadError

__all__ = ["main"]

PROG = "dpa-offload"


def _version() -> str:
    from importlib import metadata

    try:
        candidates = metadata.packages_distributions().get("offload_lib", [])
    except Exception:
        candidates = []
    for dist in [*candidates, "dpa-offload", "offload_lib", "offload-lib"]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "0+unknown"


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def _seconds(minimum_exclusive: bool) -> Callable[[str], float]:
    what = "> 0" if minimum_exclusive else ">= 0"

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds {what}, got {text!r}") from None
        if x < 0 or (minimum_exclusive and x == 0) or x != x:
            raise argparse.ArgumentTypeError(f"expected seconds {what}, got {text!r}")
        return x

    return parse


# ---------------------------------------------------------------------------------------------
# run


def _cmd_run(args: argparse.Namespace) -> int:
    from offload_lib.config import load_config
    from offload_lib.launcher import launch

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        args.parser.error("give the command to run after '--', "
                          "e.g. dpa-offload run -n 2 -- python script.py")
    env = dict(os.environ)
    if args.config is not None:
        env["OFFLOAD_CONFIG"] = os.path.abspath(args.config)
    try:
        # Fail once here rather than N times in the ranks.
        load_config(args.config, env)
    except OffloadError as e:
        print(f"{PROG} run: {e}", file=sys.stderr)
        return 2
    try:
        return launch(args.nprocs, cmd, env=env, grace=args.grace, timeout=args.timeout)
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------------------------------
# info


def _format_info(info: dict[str, Any]) -> str:
    """The first line says which backend and why; then a device table and the libraries."""
    lines = [f"backend: {info.get('backend')} \N{EM DASH} {info.get('reason')}",
             f"requested: {info.get('requested', '?')}"]
    if info.get("flexio runtime"):
        lines.append(f"flexio runtime: {info['flexio runtime']}")
    devices = info.get("devices") or []
    if not devices:
        lines.append("RDMA devices: none")
    else:
        lines.append("RDMA devices:")
        rows = [("NAME", "MODEL", "PART", "DPA", "FIRMWARE")] + [
            (d.get("name", "?"), d.get("model", "?"),
             "-" if d.get("part_id") is None else f"0x{d['part_id']:04x}",
             "yes" if d.get("dpa") else "no", d.get("fw_ver") or "-")
            for d in devices]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    for key, value in (info.get("details") or {}).items():
        lines.append(f"{key}: {'-' if value in (None, {}, []) else value}")
    return "\n".join(line.rstrip() for line in lines)


def _cmd_info(args: argparse.Namespace) -> int:
    from offload_lib import discovery
    from offload_lib.config import load_config

    if args.mpi:
        return _info_mpi(args.json)

    try:
        info = discovery.describe(load_config(args.config))
    except OffloadError as e:
        print(f"{PROG} info: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2, default=str) if args.json else _format_info(info))
    # "none": the configured backend is not available here.
    return 1 if info.get("backend") == "none" else 0


def _info_mpi(as_json: bool) -> int:
    from offload_lib import mpi_lib

    try:
        info = mpi_lib.describe()
    except OffloadError as e:
        print(f"{PROG} info --mpi: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(info, indent=2))
    else:
        print(info["library"])
        for key in ("c_library", "pkgconfig", "mpicc", "mpirun", "mpicc_showme", "manual"):
            print(f"{key}: {info.get(key) or '-'}")
    return 0


# ---------------------------------------------------------------------------------------------
# mpirun


def _cmd_mpirun(args: argparse.Namespace) -> int:
    from offload_lib import mpi_lib

    user = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not user:
        args.parser.error("give mpirun's arguments, e.g. dpa-offload mpirun -n 4 ./app")
    mpirun = mpi_lib.find_mpirun()
    try:
        if mpirun is None:
            raise mpi_lib.MpiUnavailable(f"no mpirun next to {sys.executable} or on PATH: "
                                         f"{mpi_lib.HINT}")
        lib = mpi_lib.library()
    except OffloadError as e:
        print(f"{PROG} mpirun: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.mpi_stats:
        env["DPA_OFFLOAD_MPI_STATS"] = "1"
    argv, env = mpi_lib.launch_command(user, lib, mpirun, env)
    return subprocess.call(argv, env=env)


# ---------------------------------------------------------------------------------------------
# bringup


def _cmd_bringup(args: argparse.Namespace) -> int:
    from offload_lib.bringup import run_bringup

    failed = run_bringup(args.config, timeout=args.step_timeout)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# bench


def _cmd_bench(argv: Sequence[str]) -> int:
    from offload_lib import bench

    return int(bench.main(list(argv)) or 0)


# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Offload collectives to a (possibly emulated) DPU.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{run,mpirun,info,bringup,bench}")

    run = sub.add_parser(
        "run", help="start N local ranks of a program",
        usage=f"{PROG} run -n N [--config FILE] [--timeout S] [--grace S] -- cmd [args ...]")
    run.add_argument("-n", "--nprocs", type=_positive_int, required=True, metavar="N",
                     help="number of ranks")
    run.add_argument("--config", metavar="FILE",
                     help="YAML config file (passed to the ranks as OFFLOAD_CONFIG)")
    run.add_argument("--timeout", type=_seconds(True), metavar="S",
                     help="stop all ranks after S seconds (exit code 124)")
    run.add_argument("--grace", type=_seconds(False), default=3.0, metavar="S",
                     help="seconds the other ranks get to exit after one fails (default 3)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the program and its arguments")
    run.set_defaults(func=_cmd_run, parser=run)

    info = sub.add_parser("info", help="show the hardware found and the backend chosen")
    info.add_argument("--json", action="store_true", help="print the result as JSON")
    info.add_argument("--config", metavar="FILE", help="YAML config file")
    info.add_argument("--mpi", action="store_true",
                      help="print the path of libdpaoffload_mpi.so (built for this MPI first)")
    info.set_defaults(func=_cmd_info)

    mpirun = sub.add_parser(
        "mpirun", help="run an unmodified MPI program with its collectives offloaded",
        usage=f"{PROG} mpirun [--mpi-stats] [--] <mpirun arguments ...>",
        description="Runs mpirun with libdpaoffload_mpi.so preloaded on every rank and "
                    "OFFLOAD_*/DPA_OFFLOAD_* variables forwarded; the arguments go to "
                    "mpirun unchanged.")
    mpirun.add_argument("--mpi-stats", action="store_true",
                        help="print offloaded / passed-through counts at MPI_Finalize")
    mpirun.add_argument("args", nargs=argparse.REMAINDER)
    mpirun.set_defaults(func=_cmd_mpirun, parser=mpirun)

    bringup = sub.add_parser(
        "bringup", help="check a FlexIO setup step by step, one line a step",
        description="Checks, in order, the FlexIO runtime, permissions, the RDMA device, "
                    "the DPA process, its RPC, one rank and two ranks; stops at the first "
                    "failure and says what to check next. flexio_runtime: model (e.g. "
                    "OFFLOAD_FLEXIO_RUNTIME=model) runs it on the FlexIO model.")
    bringup.add_argument("--config", metavar="FILE", help="YAML config file")
    bringup.add_argument("--step-timeout", type=_seconds(False), default=30.0, metavar="S",
                         help="seconds a step may take (default 30)")
    bringup.set_defaults(func=_cmd_bringup)

    bench = sub.add_parser("bench", add_help=False,
                           help="collective benchmarks (see 'dpa-offload bench -h')")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=lambda a: _cmd_bench(a.args))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # bench and sim own all of their options, including -h and ones that look like ours.
    if argv[:1] == ["bench"]:
        return _cmd_bench(argv[1:])
    if argv[:1] == ["sim"]:
        from offload_lib import sim_cli

        return sim_cli.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"{PROG} {_version()}")
        return 0
    if args.command is None:
        parser.error("choose a command: run, mpirun, info, bringup or bench")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
