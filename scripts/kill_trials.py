#!/usr/bin/env python3
"""Seeded random-kill trials: N ranks run a seeded stream of collectives (all-to-all,
all-to-all-v, broadcast, all-gather, barrier; sizes from 8 B to 1 MiB per peer), one seeded
victim is SIGKILLed at a seeded point of it, and the survivors follow the documented
recovery (README, "When things go wrong"): PeerFailure naming the victim within 1 s of the
death, failed_ranks() listing it, ctx.shrink(), then an exact all-to-all on the team it
gives, which must be the same team on every survivor. After each trial nothing of the job
may be left in /dev/shm and no rank process may be alive.

    python scripts/kill_trials.py --trials 50 -n 8 --seed 1     # docs/reliability.md
    python scripts/kill_trials.py --trials 3 -n 8 --seed 7      # what CI runs

Exit status 0 when every trial passed. Output: one line per trial, then a summary with the
slowest detection and recovery.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time

import numpy as np

from offload_lib.launcher import job_segments, launch

RANK = r'''
import json, os, signal, sys, time
import numpy as np
import offload_lib as ol

rank, size = int(os.environ["OFFLOAD_RANK"]), int(os.environ["OFFLOAD_SIZE"])
seed, trial, flags = int(os.environ["KT_SEED"]), int(os.environ["KT_TRIAL"]), os.environ["KT_DIR"]
rng = np.random.default_rng([seed, trial])  # the same draws on every rank
victim = int(rng.integers(size))
kill_at = int(rng.integers(0, 12))          # ops completed before the kill
kill_delay = float(rng.uniform(0.0, 0.004))  # into that op
KINDS = ["alltoall", "alltoallv", "broadcast", "allgather", "barrier"]
plan = [(KINDS[int(k)], int(e)) for k, e in zip(rng.integers(len(KINDS), size=64),
                                                 rng.integers(0, 18, size=64))]
print(json.dumps({"pid": os.getpid(), "job": os.environ["OFFLOAD_JOB"]}), flush=True)


def post(team, kind, exp, i):
    """One op of the plan on team, and the check of its result (element counts are
    2**exp / 8 per peer: 8 B to 1 MiB of int64)."""
    n, me = team.size, team.rank
    per = max(1, (1 << exp) // 8)
    tag = 1_000_000 * i
    if kind == "alltoall":
        src = np.arange(per * n, dtype=np.int64) + tag + 1000 * me
        dst = np.full(per * n, -1, np.int64)
        want = np.concatenate([np.arange(per * me, per * (me + 1)) + tag + 1000 * p
                               for p in range(n)])
        return team.alltoall(src, dst), lambda: (dst == want).all()
    if kind == "alltoallv":
        counts = [(per + 3 * ((me + d) % n)) for d in range(n)]
        src = np.concatenate([np.full(c, tag + 1000 * me + d, np.int64)
                              for d, c in enumerate(counts)])
        got = [(per + 3 * ((p + me) % n)) for p in range(n)]
        dst = np.full(sum(got), -1, np.int64)
        want = np.concatenate([np.full(c, tag + 1000 * p + me, np.int64)
                               for p, c in enumerate(got)])
        return team.alltoallv(src, counts, dst), lambda: (dst == want).all()
    if kind == "broadcast":
        root = i % n
        want = np.arange(per, dtype=np.int64) + tag + root
        buf = want.copy() if me == root else np.full(per, -1, np.int64)
        return team.broadcast(buf, root=root), lambda: (buf == want).all()
    if kind == "allgather":
        src = np.arange(per, dtype=np.int64) + tag + 1000 * me
        dst = np.full(per * n, -1, np.int64)
        want = np.concatenate([np.arange(per, dtype=np.int64) + tag + 1000 * p
                               for p in range(n)])
        return team.allgather(src, dst), lambda: (dst == want).all()
    return team.barrier(), lambda: True


ctx = ol.init()
w = ctx.world
w.barrier().wait(timeout=60)
out = {"rank": rank}
for i, (kind, exp) in enumerate(plan):
    req, check = post(w, kind, exp, i)
    if rank == victim and i == kill_at:
        time.sleep(kill_delay)
        with open(os.path.join(flags, "killed.tmp"), "w") as f:
            f.write(repr(time.monotonic()))  # CLOCK_MONOTONIC: the same in every process
        os.rename(os.path.join(flags, "killed.tmp"), os.path.join(flags, "killed"))
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        req.wait(timeout=30)
    except ol.PeerFailure as e:
        t1 = time.monotonic()
        killed = float(open(os.path.join(flags, "killed")).read())
        assert e.rank == victim and f"rank {victim}" in str(e), (victim, str(e))
        assert victim in ctx.failed_ranks(), ctx.failed_ranks()
        out.update(op=i, kind=kind, detect_s=t1 - max(t0, killed))
        break
    assert check(), f"op {i} ({kind}, 2**{exp} B per peer) completed wrong"
else:
    raise AssertionError("no PeerFailure although a rank died")
t0 = time.monotonic()
team = ctx.shrink()
per = 1 + int(rng.integers(1, 1 << 15))
n, me = team.size, team.rank
src = np.arange(per * n, dtype=np.int64) + 1000 * rank
dst = np.zeros_like(src)
team.alltoall(src, dst).wait(timeout=30)
want = np.concatenate([np.arange(per * me, per * (me + 1)) + 1000 * r for r in team.ranks])
assert (dst == want).all(), "the all-to-all after shrink is wrong"
team.barrier().wait(timeout=30)
out.update(team=list(team.ranks), recover_s=time.monotonic() - t0)
print(json.dumps(out), flush=True)
ctx.close()
'''


def trial(n: int, seed: int, index: int, script: str) -> dict:
    """Run one trial; a dict with its verdict ("ok", or what went wrong) and numbers."""
    rng = np.random.default_rng([seed, index])
    victim = int(rng.integers(n))
    with tempfile.TemporaryDirectory(prefix="dpaoff-kt-") as flags:
        env = dict(os.environ, KT_SEED=str(seed), KT_TRIAL=str(index), KT_DIR=flags,
                   PYTHONUNBUFFERED="1")
        for key in ("OFFLOAD_RANK", "OFFLOAD_SIZE", "OFFLOAD_JOB", "OFFLOAD_JOB_KEY"):
            env.pop(key, None)
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        rc = launch(n, [sys.executable, script], env=env, grace=20.0, timeout=120,
                    stdout=out, stderr=err)
        took = time.monotonic() - t0
    lines: dict[int, list[dict]] = {r: [] for r in range(n)}
    for line in out.getvalue().splitlines():
        head, _, body = line.partition("] ")
        if head.startswith("[") and body.startswith("{"):
            lines[int(head[1:])].append(json.loads(body))
    res = {"trial": index, "victim": victim, "rc": rc, "s": round(took, 2)}
    pids = [d["pid"] for r in lines for d in lines[r] if "pid" in d]
    jobs = {d["job"] for r in lines for d in lines[r] if "job" in d}
    survivors = [r for r in range(n) if r != victim]
    finals = {r: next((d for d in lines[r] if "team" in d), None) for r in survivors}
    problems = []
    if rc == 0 or f"rank {victim} failed" not in err.getvalue():
        problems.append(f"launcher: rc {rc}, does not name rank {victim}")
    for r, d in finals.items():
        if d is None:
            problems.append(f"survivor {r} did not recover")
    teams = {tuple(d["team"]) for d in finals.values() if d}
    if len(teams) > 1 or (teams and teams.pop() != tuple(survivors)):
        problems.append(f"survivors got different teams: {[d and d['team'] for d in finals.values()]}")
    detect = [d["detect_s"] for d in finals.values() if d]
    recover = [d["recover_s"] for d in finals.values() if d]
    if detect and max(detect) >= 1.0:
        problems.append(f"PeerFailure {max(detect):.2f} s after the death")
    left = [name for job in jobs for name in job_segments(job)]
    if left:
        problems.append(f"left in /dev/shm: {left}")
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
             open(f"/proc/{p}/stat").read().split(") ")[1][0] != "Z"]
    if alive:
        problems.append(f"rank processes alive after the job: {alive}")
    res.update(kind=next((d["kind"] for d in finals.values() if d), None),
               op=next((d["op"] for d in finals.values() if d), None),
               detect_max_s=round(max(detect), 4) if detect else None,
               recover_max_s=round(max(recover), 4) if recover else None,
               verdict="ok" if not problems else "; ".join(problems))
    if problems:
        res["output"] = out.getvalue()[-4000:] + err.getvalue()[-2000:]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("-n", type=int, default=8, help="ranks per trial")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write every trial's record here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dpaoff-kt-") as d:
        script = os.path.join(d, "rank.py")
        with open(script, "w") as f:
            f.write(RANK)
        results = []
        for i in range(args.trials):
            res = trial(args.n, args.seed, i, script)
            results.append(res)
            print(f"trial {i:3d}: victim {res['victim']}, died in op {res['op']} "
                  f"({res['kind']}), PeerFailure within {res['detect_max_s']} s, "
                  f"shrink + all-to-all {res['recover_max_s']} s: {res['verdict']}", flush=True)
            if res["verdict"] != "ok":
                print(res.get("output", ""), flush=True)
    ok = sum(r["verdict"] == "ok" for r in results)
    detect = [r["detect_max_s"] for r in results if r["detect_max_s"] is not None]
    recover = [r["recover_max_s"] for r in results if r["recover_max_s"] is not None]
    print(f"{ok}/{len(results)} trials passed (n={args.n}, seed={args.seed}); slowest "
          f"PeerFailure {max(detect, default=0):.3f} s (median {np.median(detect or [0]):.3f}); "
          f"slowest shrink + all-to-all {max(recover, default=0):.3f} s "
          f"(median {np.median(recover or [0]):.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
