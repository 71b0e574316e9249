#!/usr/bin/env python3
"""What a persistent all-to-all costs the thread that overlaps it with other work.

    dpa-offload run -n 4 -- python scripts/bench_overlap.py --size 1M --work-ms 20

Each iteration (after a barrier): ``p.post()``, then ``--work-ms`` of numpy matrix products
on the same thread, then ``p.test()`` until it says done (1 ms sleeps between tries). The
table gives, per rank, the median calling-thread CPU time (``time.thread_time``) of the
post() and of the test() that found the op done, their sum, and how many test() calls that
took; every iteration's result is checked. time.thread_time is a system call whose own cost
is inside both intervals.

Every third iteration times, at the same two points, a C call that does nothing
(``host_num_threads``, through cffi) instead of post() and test(), which still run
untimed, and every third nothing at all: what a call from Python pays there (after 20 ms
of other work its code and data are out of the caches and TLBs: several microseconds in
this VM), and what the measurement itself does. The "other work" runs on the
calling thread: BLAS is held to one thread (``--blas-threads``) unless asked otherwise,
since a multithreaded BLAS in each of four ranks on two cores keeps spinning threads
competing with the rank's own.

With ``--compare mpi`` (start it with mpirun: ``mpirun -n 4 --oversubscribe --bind-to none
python scripts/bench_overlap.py --compare mpi``), the same loop then runs Open MPI's
persistent all-to-all (``comm.Alltoall_init``: ``Start()``, the work, ``Test()``; MPI 4) on
the same buffers in the same processes, and the line gives its two calls' CPU beside ours.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _blas_threads() -> str:
    """--blas-threads, read before numpy loads BLAS (which reads the environment once)."""
    for i, a in enumerate(sys.argv):
        if a == "--blas-threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--blas-threads="):
            return a.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _blas_threads()

import numpy as np  # noqa: E402

import offload_lib as ol  # noqa: E402
from offload_lib._native import lib  # noqa: E402
from offload_lib.config import parse_size  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1M", help="bytes per peer (1M)")
    ap.add_argument("--work-ms", type=float, default=20.0, help="work between post and test")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--buffers", choices=("numpy", "shared"), default="numpy")
    ap.add_argument("--blas-threads", default="1",
                    help="BLAS threads per rank for the work (1: it runs on the calling thread)")
    ap.add_argument("--compare", choices=("mpi",), help="also time Open MPI's persistent "
                    "all-to-all at the same points (start with mpirun)")
    args = ap.parse_args()
    with ol.init() as ctx:
        n, me, team = ctx.size, ctx.rank, ctx.world
        count = parse_size(args.size) // 4
        alloc = (lambda k: ctx.empty(k, np.float32)) if args.buffers == "shared" else \
            (lambda k: np.empty(k, np.float32))
        src, dst = alloc(n * count), alloc(n * count)
        src[:] = np.repeat(np.arange(n, dtype=np.float32) + 100 * me, count)
        want = np.repeat(np.arange(n, dtype=np.float32) * 100 + me, count)
        work = np.random.default_rng(me).random((256, 256))
        p = team.alltoall_init(src, dst)
        post_cpu, test_cpu, tests = [], [], []
        floors: dict[str, tuple[list[float], list[float]]] = {"noop": ([], []), "empty": ([], [])}
        handle = ctx._handle()
        for it in range(3 * (args.iters + 5)):
            # Every third iteration times a no-op C call through cffi at the same points
            # instead, every third nothing at all (thread_time's own cost there).
            floor = ("ours", "noop", "empty")[it % 3]
            dst[:] = -1
            team.barrier().wait()
            c0 = time.thread_time()
            if floor == "ours":
                p.post()
                c1 = time.thread_time()
            else:
                if floor == "noop":
                    lib.host_num_threads(handle)
                c1 = time.thread_time()
                p.post()
            end = time.perf_counter() + args.work_ms / 1e3
            while time.perf_counter() < end:
                work @ work
            k = 0
            if floor != "ours":
                c2 = time.thread_time()
                if floor == "noop":
                    lib.host_num_threads(handle)
                c3 = time.thread_time()
            while True:
                if floor == "ours":
                    c2 = time.thread_time()
                done = p.test()
                if floor == "ours":
                    c3 = time.thread_time()
                k += 1
                if done:
                    break
                time.sleep(0.001)
            if not np.array_equal(dst, want):
                raise SystemExit(f"rank {me}: WRONG RESULT in iteration {it}")
            if it < 15:
                continue
            if floor == "ours":
                post_cpu.append(c1 - c0)
                test_cpu.append(c3 - c2)
                tests.append(k)
            else:
                floors[floor][0].append(c1 - c0)
                floors[floor][1].append(c3 - c2)
        p.free()
        us = 1e6
        mpi = ""
        if args.compare == "mpi":
            m_post, m_test = _mpi_overlap(src, dst, want, work, args)
            mpi = (f"; Open MPI Alltoall_init: Start {np.median(m_post) * us:.1f} us, Test (done) "
                   f"{np.median(m_test) * us:.1f} us, together "
                   f"{np.median(np.add(m_post, m_test)) * us:.1f} us")
        print(f"rank {me}/{n} {args.size} per peer {args.buffers}: post {np.median(post_cpu) * us:.1f} us, "
              f"test (done) {np.median(test_cpu) * us:.1f} us, together "
              f"{np.median(np.add(post_cpu, test_cpu)) * us:.1f} us; test() calls per op: median "
              f"{int(np.median(tests))}, max {max(tests)}; at the same points a no-op C call "
              f"through cffi {_pair(floors['noop'])}, nothing {_pair(floors['empty'])}{mpi}",
              flush=True)
    return 0


def _pair(times: tuple[list[float], list[float]]) -> str:
    return f"{np.median(times[0]) * 1e6:.1f} + {np.median(times[1]) * 1e6:.1f} us"


def _mpi_overlap(src: np.ndarray, dst: np.ndarray, want: np.ndarray, work: np.ndarray,
                 args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Our loop with Open MPI's persistent all-to-all: Start() and the Test() that found
    it done, calling-thread CPU seconds per timed iteration."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    req = comm.Alltoall_init(src, dst)
    post_cpu, test_cpu = [], []
    for it in range(args.iters + 5):
        dst[:] = -1
        comm.Barrier()
        c0 = time.thread_time()
        req.Start()
        c1 = time.thread_time()
        end = time.perf_counter() + args.work_ms / 1e3
        while time.perf_counter() < end:
            work @ work
        while True:
            c2 = time.thread_time()
            done = req.Test()
            c3 = time.thread_time()
            if done:
                break
            time.sleep(0.001)
        if not np.array_equal(dst, want):
            raise SystemExit(f"rank {comm.rank}: WRONG MPI RESULT in iteration {it}")
        if it >= 5:
            post_cpu.append(c1 - c0)
            test_cpu.append(c3 - c2)
    req.Free()
    return post_cpu, test_cpu


if __name__ == "__main__":
    raise SystemExit(main())
