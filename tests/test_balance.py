"""Ranks spread over the cores (emulator/emu_spin.c, emu_balance). Where a job's ranks
outnumber its CPUs, the kernel can leave three of four ranks on one vCPU and the fourth
alone on the other for tens of milliseconds; a host thread about to give up its CPU that
has seen two more of the job's ranks there than on another CPU it may run on, for 0.3 ms,
moves itself there (one move in the job per millisecond); a move the kernel undoes soon
doubles how long the next crowd must last.

The rules, on a job table and a kernel of the test's own: tests/c/balance_test.c (built
alone under ASan + UBSan). On a live job, where the kernel moves ranks too: each rank of a
4-rank job on two CPUs first places itself as the kernel sometimes leaves such a job (rank 0
alone on the first CPU, the others on the second; pinned for a moment, both CPUs allowed
again at once, as the library moves a rank), then runs small ops: the data stays right, and
the moves stay few. With a busy loop of someone else's pinned to the first CPU the kernel
takes every rank that moves there back within a millisecond or two: each rank's moves grow
with the logarithm of the job's length, not with its length. Ranks the user pinned there
(their affinity kept at one CPU) stay where they are, and so do ranks each in a session of
its own.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest

import build_defs
from _mp import run_ranks

CC = shutil.which("gcc") or shutil.which("cc")

SPREAD = r'''
if os.environ.get("OWN_SESSION") == "1":
    own_session()
both = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, both)  # the job's CPUs: the progress threads inherit them
ctx = ol.init()
n, me = ctx.size, ctx.rank
team = ctx.world
home = both[0] if me == 0 else both[1]
os.sched_setaffinity(0, {home})
if os.environ["USER_PINNED"] == "0":
    os.sched_setaffinity(0, both)


def cpu_now():
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


src = np.arange(256 * n, dtype=np.float32) + 1000 * me
dst = np.empty_like(src)
want = np.concatenate([np.arange(256 * me, 256 * (me + 1), dtype=np.float32) + 1000 * p
                       for p in range(n)])
t0 = time.monotonic()
for _ in range(int(os.environ["ITERATIONS"])):
    team.barrier().wait(timeout=20)
    team.alltoall(src, dst).wait(timeout=20)
took_ms = int((time.monotonic() - t0) * 1e3) + 1
check_equal(dst, want, "all-to-all while the ranks move")
print(f"home={home} cpu={cpu_now()} moves={ctx.stats()['balance_moves']} ms={took_ms}")
team.barrier().wait(timeout=20)
ctx.close()
'''


def _reports(out: list[str]) -> list[dict[str, int]]:
    rows = []
    for text in out:
        line = [x for x in text.splitlines() if x.startswith("home=")][-1]
        rows.append({k: int(v) for k, v in (kv.split("=") for kv in line.split())})
    return rows


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                    reason="needs two CPUs to spread ranks over")


@pytest.mark.timeout(120)
@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_balance_rules_on_a_job_table_of_the_tests_own(tmp_path):
    exe = tmp_path / "balance_test"
    build = build_defs.targets()["balance_test"].build(CC, exe)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                         env={"ASAN_OPTIONS": "detect_leaks=1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok: balance"), run.stdout


def _most_moves(ms: int) -> int:
    """A rank's moves in a job of ms milliseconds if the kernel undid every one within
    1-2 ms: each undo doubles the hold from 0.3 ms, so log2(ms / 0.3), and some slack."""
    return int(math.log2(ms / 0.3)) + 3


def _spread(env: dict[str, str]) -> list[dict[str, int]]:
    return _reports(run_ranks(4, SPREAD, timeout=90, env=env))


@needs_two_cpus
@pytest.mark.timeout(120)
def test_ranks_left_crowded_spread_with_few_moves():
    rows = _spread({"USER_PINNED": "0", "ITERATIONS": "300"})
    ms = max(row["ms"] for row in rows)
    assert all(row["moves"] <= _most_moves(ms) for row in rows), rows
    assert sum(row["moves"] for row in rows) <= ms // 2 + 4, rows


@pytest.fixture
def busy_first_cpu():
    """A busy loop of someone else's (nice 0), pinned to the job's first CPU."""
    first = sorted(os.sched_getaffinity(0))[0]
    loop = subprocess.Popen([sys.executable, "-c",
                             f"import os\nos.sched_setaffinity(0, {{{first}}})\nwhile True:\n    pass\n"],
                            stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


@needs_two_cpus
@pytest.mark.timeout(120)
def test_ranks_stop_moving_where_the_kernel_takes_them_back(busy_first_cpu):
    rows = _spread({"USER_PINNED": "0", "ITERATIONS": "1500"})
    ms = max(row["ms"] for row in rows)
    assert all(row["moves"] <= _most_moves(ms) for row in rows), rows


@needs_two_cpus
@pytest.mark.timeout(120)
def test_ranks_in_sessions_of_their_own_stay_where_the_kernel_puts_them(busy_first_cpu):
    """As torchrun starts them: with autogroup each is a scheduling group of its own, and a
    move onto a CPU other groups keep busy can wait there for long (emu_spin.c)."""
    rows = _spread({"USER_PINNED": "0", "OWN_SESSION": "1", "ITERATIONS": "300"})
    assert all(row["moves"] == 0 for row in rows), rows


@needs_two_cpus
@pytest.mark.timeout(120)
def test_ranks_the_user_pinned_stay_where_they_are():
    rows = _spread({"USER_PINNED": "1", "ITERATIONS": "300"})
    assert all(row["moves"] == 0 for row in rows), rows
    assert all(row["cpu"] == row["home"] for row in rows), rows
