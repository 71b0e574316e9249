"""The FlexIO hardware binding on the FlexIO model (emulator/flexio_model): the binding's
device and host sources built unchanged against the model's SDK, and run over its emulated
queues. Each defect the model found in the binding has a test here that failed before its
fix (docs/hardware.md lists them with the commits)."""
from __future__ import annotations

import pytest

from offload_lib.flexio_runtime import build_model, model_backend, model_sdk


@pytest.fixture(scope="session")
def built_model():
    return build_model()


@pytest.mark.timeout(600)
def test_binding_builds_unchanged_against_the_model(built_model):
    """scripts/build_flexio.sh with DOCA_DIR = the model's SDK: dpacc compiles the device
    binding, gcc the host backend; nothing in the binding knows it is the model."""
    assert built_model == model_backend() and built_model.exists()
    assert (model_sdk() / "lib" / "libfxm-model.so").exists()


@pytest.mark.timeout(120)
def test_dpa_process_is_created_and_answers_its_rpc(built_model):
    """Bring-up steps 1-3 on the model: the device, the DPA process (the app loads), the
    query RPC (the image's ABI matches)."""
    from offload_lib.bringup import backend_probe

    for stage in (1, 2, 3):
        rc, report = backend_probe(str(built_model), stage)
        assert rc == 0, f"stage {stage}: {report}"
    assert "ABI" in report


MODEL_ENV = {"OFFLOAD_BACKEND": "flexio", "OFFLOAD_FLEXIO_RUNTIME": "model"}


def memlock_env() -> dict[str, str]:
    """The model pins registrations against ulimit -l for non-root processes, as the kernel
    does; where that limit is lower than what these tests pin, it is told not to."""
    import os
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 1 << 30:
        return {}
    return {"FXM_IGNORE_MEMLOCK": "1"}


def model_env(threads: int = 1, **extra: str) -> dict[str, str]:
    return {**MODEL_ENV, **memlock_env(), "OFFLOAD_DPA_THREADS": str(threads), **extra}


def assert_nothing_left_in_dev_shm() -> None:
    """Job names carry the launcher's parent pid (this test process)."""
    import os

    left = [n for n in os.listdir("/dev/shm") if n.startswith("dpaoff-") and
            str(os.getpid()) in n]
    assert not left, f"left in /dev/shm: {left}"


ONE_RANK = r'''
ctx = ol.init()
assert ctx.backend == "flexio", ctx.backend
ctx.world.barrier().wait(timeout=10)
src = np.arange(4096, dtype=np.int64)
dst = np.zeros_like(src)
ctx.world.alltoall(src, dst).wait(timeout=10)
check_equal(dst, src, "one-rank all-to-all (the DPA writes to itself)")
ctx.close()
'''


@pytest.mark.timeout(120)
def test_one_rank_runs_through_the_window(built_model):
    """The first handler invocation configures the window and reaches the ring, the stats
    and the control words through it; a barrier and a loopback all-to-all complete."""
    from _mp import run_ranks

    run_ranks(1, ONE_RANK, timeout=60, env=model_env(OFFLOAD_POST_TIMEOUT="3"))


TWO_RANKS = r'''
ctx = ol.init()
ctx.world.barrier().wait(timeout=20)
n, per = size, 1000
src = np.arange(per * n, dtype=np.int64) + 1_000_000 * rank
dst = np.zeros_like(src)
ctx.world.alltoall(src, dst).wait(timeout=20)
check_equal(dst, np.concatenate([np.arange(per * rank, per * (rank + 1)) + 1_000_000 * p
                                 for p in range(n)]), "all-to-all")
ctx.close()
'''


@pytest.mark.timeout(120)
def test_two_ranks_reach_each_other_over_a_routed_fabric(built_model):
    """Two ranks, one DPA thread each: their QPs must be addressed with GIDs a router
    forwards (the model's fabric is routed, as a RoCE data centre's is)."""
    from _mp import run_ranks

    run_ranks(2, TWO_RANKS, timeout=90, env=model_env(1))


@pytest.mark.timeout(120)
def test_every_dpa_thread_starts(built_model):
    """Two ranks with two DPA threads each: an all-to-all's items are striped over both
    threads, so it completes only if thread 1 ever runs."""
    from _mp import run_ranks

    run_ranks(2, TWO_RANKS, timeout=90, env=model_env(2))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_past_64_ranks_runs_on_the_model(built_model):
    """65 ranks (the FlexIO binding held at most 64 before its tables were sized by the
    world): QPs named by user_index past rail 0's 64, a barrier, an exact all-to-all, and
    every rank's close notice to 64 peers. About 20 s here (65 Python processes on 2
    cores), so marked slow; tests/test_flexio_hal_tables.py checks the tables in CI."""
    from _mp import run_ranks

    run_ranks(65, TWO_RANKS, timeout=240, env=model_env(1))


SLOW_START = r'''
if rank == 0:   # this rank's host starts its DPA threads late (a busy machine)
    os.environ["FXM_DELAY_RUN_MS"] = "400"
''' + TWO_RANKS


@pytest.mark.timeout(120)
def test_a_rank_that_starts_late_misses_no_event(built_model):
    """Rank 0 runs its handlers 0.4 s after rank 1 started sending: its threads' CQs already
    hold CQEs whose events found no running handler."""
    from _mp import run_ranks

    run_ranks(2, SLOW_START, timeout=90, env=model_env(2))


CELLS = [(2, 1), (2, 4), (3, 1), (3, 4), (4, 1), (4, 4)]
CELL_IDS = [f"n{n}-t{t}" for n, t in CELLS]

KILLED = r'''
ctx = ol.init()
w = ctx.world
victim = size - 1
src = np.arange(size * 100, dtype=np.int64)
dst = np.zeros_like(src)
w.alltoall(src, dst).wait(timeout=20)
w.barrier().wait(timeout=20)
if rank == victim:
    # Posted, then the process dies in it: nobody has posted the matching op yet, so none of
    # its blocks can have moved. (A barrier would race: the victim's arrivals can reach every
    # peer before the kill lands, and the survivors' barrier then rightly completes.)
    w.alltoall(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.2)
t0 = time.monotonic()
try:
    w.alltoall(src, dst).wait(timeout=10)
except ol.PeerFailure as e:
    took = time.monotonic() - t0
    assert e.rank == victim and f"rank {victim}" in str(e), (e.rank, str(e))
    assert took < 2.0, f"PeerFailure after {took:.2f} s"
else:
    raise AssertionError("an all-to-all with a dead member completed")
# Every survivor learns that the rank is dead, whether or not it sent it anything.
while victim not in ctx.failed_ranks():
    assert time.monotonic() - t0 < 2.0, f"failed_ranks() {ctx.failed_ranks()} after 2 s"
    time.sleep(0.01)
try:
    w.alltoall(src, dst).wait(timeout=5)
except ol.PeerFailure as e:
    assert e.rank == victim
else:
    raise AssertionError("an op on the team of a dead rank completed")
team = ctx.create_team(list(range(size - 1)))   # the survivors carry on
s2 = np.arange((size - 1) * 50, dtype=np.int64) + 1000 * rank
d2 = np.zeros_like(s2)
team.alltoall(s2, d2).wait(timeout=20)
check_equal(d2, np.concatenate([np.arange(50 * rank, 50 * rank + 50) + 1000 * p
                                for p in range(size - 1)]), "survivors' all-to-all")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, threads", CELLS, ids=CELL_IDS)
def test_killed_peer_is_named_by_every_survivor(built_model, n, threads):
    from _mp import DONE_MARK, run_job

    rc, ranks, launcher, _ = run_job(n, KILLED, timeout=60, grace=10.0, env=model_env(threads))
    report = "\n".join(f"--- rank {r} ---\n{t}" for r, t in enumerate(ranks)) + \
        "\n--- launcher ---\n" + "\n".join(launcher)
    assert rc != 0 and any(f"rank {n - 1}" in line for line in launcher), report
    for r in range(n - 1):
        assert DONE_MARK in ranks[r], f"survivor {r} did not finish\n{report}"
    assert_nothing_left_in_dev_shm()


COLLECTIVES = r'''
import re
ctx = ol.init()
n, w = size, ctx.world
w.barrier().wait(timeout=20)
for per, empty in ((1000, False), (150_000, True)):   # 150k int64: several 256K pieces
    src = ctx.empty(per * n, np.int64) if empty else np.empty(per * n, np.int64)
    src[:] = np.arange(per * n) + 1_000_000 * rank
    dst = np.zeros(per * n, np.int64)
    w.alltoall(src, dst).wait(timeout=30)
    check_equal(dst, np.concatenate([np.arange(per * rank, per * (rank + 1)) + 1_000_000 * p
                                     for p in range(n)]), f"all-to-all of {per}")
    del src

# all-to-all-v, counted (and checked against recv_counts), then in fixed slots
C = np.random.default_rng(7).integers(0, 500, size=(n, n))
C[0, n - 1] = 0
send = C[rank]
src = np.concatenate([np.arange(send[d]) + 1_000_000 * rank + 1000 * d for d in range(n)])
src = src.astype(np.int64)
dst = np.full(int(C[:, rank].sum()) + 5, -7, np.int64)
check_equal(w.alltoallv(src, send, dst, recv_counts=C[:, rank]).wait(timeout=30), C[:, rank],
            "recv_counts")
want = np.concatenate([np.arange(C[p, rank]) + 1_000_000 * p + 1000 * rank for p in range(n)])
check_equal(dst[:len(want)], want.astype(np.int64), "all-to-all-v")
assert (dst[len(want):] == -7).all(), "written past the data"
slot = 500
dst = np.full(n * slot, -7, np.int64)
w.alltoallv(src, send, dst, slot=slot).wait(timeout=30)
for p in range(n):
    check_equal(dst[p * slot:p * slot + C[p, rank]],
                np.arange(C[p, rank]) + 1_000_000 * p + 1000 * rank, f"slot of rank {p}")

# rows gathered by index (MoE dispatch), rows placed by index (MoE combine)
base = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
def plan(r):
    per = np.array([(r + j) % 3 + 1 for j in range(n)])
    return per, np.array([(7 * k + r) % 40 for k in range(per.sum())])
per_rank, rows = plan(rank)
out = np.zeros((sum(plan(p)[0][rank] for p in range(n)), 8), np.float32)
got = w.alltoallv_rows(base + 1000 * rank, rows, per_rank, out).wait(timeout=30)
off = 0
for p in range(n):
    pper, prows = plan(p)
    mine = prows[pper[:rank].sum():pper[:rank + 1].sum()]
    assert got[p] == len(mine), (p, got)
    check_equal(out[off:off + len(mine)], base[mine] + 1000 * p, f"rows from rank {p}")
    off += len(mine)
land = np.zeros((2 * n, 4), np.float32)
mine = (np.full((n, 4), rank) + 100 * np.arange(n)[:, None]).astype(np.float32)
w.alltoallv_place(mine, np.ones(n, np.int64), land, np.full(n, 2 * rank)).wait(timeout=30)
for p in range(n):
    check_equal(land[2 * p], np.full(4, p + 100 * rank, np.float32), f"row placed by rank {p}")

# persistent all-to-all, posted three times
per = 333
src = np.zeros(per * n, np.int64)
dst = np.zeros(per * n, np.int64)
pr = w.alltoall_init(src, dst)
for it in range(3):
    src[:] = np.arange(per * n) + 7 * rank + it
    pr.post()
    pr.wait(timeout=30)
    check_equal(dst, np.concatenate([np.arange(per * rank, per * (rank + 1)) + 7 * p + it
                                     for p in range(n)]), f"persistent post {it}")
pr.free()

# multicast is not bound on FlexIO: it says so
try:
    w.broadcast(np.arange(64, dtype=np.int64), root=0).wait(timeout=10)
except ol.Unsupported as e:
    assert "not supported by this backend" in str(e), str(e)
else:
    raise AssertionError("a broadcast completed on FlexIO, which has no multicast binding")

# cancel, then op_timeout (1 s here): rank 0 alone posts on fresh teams while the others
# wait for its flag files (an op, create_team included, must not start its op_timeout on one
# rank long before another joins it)
t2 = ctx.create_team(list(range(n)))
t3 = ctx.create_team(list(range(n)))
def flag(name):
    return os.path.join(os.environ["FLAG_DIR"], name)
def wait_flag(name):
    deadline = time.monotonic() + 20
    while not os.path.exists(flag(name)):
        assert time.monotonic() < deadline, f"no {name} flag"
        time.sleep(0.01)
if rank == 0:
    req = t2.alltoall(np.arange(n * 16, dtype=np.int64), np.zeros(n * 16, np.int64))
    try:
        req.wait(timeout=0.2)
    except ol.Timeout:
        pass
    assert req.cancel() is True
    try:
        req.wait(timeout=5)
    except ol.Canceled:
        pass
    else:
        raise AssertionError("a cancelled op completed")
    t0 = time.monotonic()
    try:
        t3.barrier().wait(timeout=20)
    except ol.Timeout as e:
        assert "op_timeout" in str(e), str(e)
        assert time.monotonic() - t0 < 3, f"op_timeout 1 s took {time.monotonic() - t0:.1f} s"
    else:
        raise AssertionError("a barrier nobody else joined completed")
    open(flag("rank0_done"), "w").close()
else:
    wait_flag("rank0_done")
w.barrier().wait(timeout=20)

# every DPA thread took its share of the items
busy = [t["writes"] for t in ctx.stats()["threads"]]
assert len(busy) == ctx.dpa_threads, busy
assert sum(1 for b in busy if b) >= min(n, len(busy)), f"idle DPA threads: {busy}"

# last, a forged key: the last rank publishes a key nobody issued for its destination.
# Blocks of 16 KiB, above eager_max: the peers write into the destination with that key
# (an eager block goes into the victim's slot, and only its own copy out is refused).
victim, SENT, PER = n - 1, -7, 2048
s4 = np.arange(n * PER, dtype=np.int64) + 1_000_000 * rank
d4 = np.full(n * PER, SENT, np.int64)
plain = ctx._post
if rank == victim:
    def forged(op, *a, **k):
        op.dst_key = 0x5EED1234
        return plain(op, *a, **k)
    ctx._post = forged
req = w.alltoall(s4, d4)
ctx._post = plain
t0 = time.monotonic()
try:
    req.wait(timeout=20)
except ol.OffloadError as e:
    # Writers into the victim are refused and name it; a rank whose op already failed
    # revokes its own one-shot key, so a slower writer into it may name that rank instead.
    named = re.search(r"rank (\d+)", str(e))
    print("FORGED", type(e).__name__, named.group(1) if named else "-", flush=True)
else:
    raise AssertionError("an all-to-all into a forged key completed")
assert time.monotonic() - t0 < 5, f"the error took {time.monotonic() - t0:.1f} s"
if rank == victim:
    check_equal(d4, np.full(n * PER, SENT, np.int64), "the forged destination")
ctx.close()
left = threads_left()
assert not left, f"threads left after close: {left}"
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n, threads", CELLS, ids=CELL_IDS)
def test_collectives_on_the_model(built_model, n, threads, tmp_path):
    """One job per (ranks, DPA threads): barrier, all-to-all (numpy and ctx.empty buffers,
    several RDMA pieces), all-to-all-v counted, in slots, by rows and placed, a persistent
    all-to-all, multicast answered as unsupported, a cancelled op, an op_timeout, and last a
    forged key (the QPs it breaks stay broken on a card). Exact results throughout."""
    from _mp import run_ranks

    out = run_ranks(n, COLLECTIVES, timeout=150,
                    env=model_env(threads, OFFLOAD_OP_TIMEOUT="1", OFFLOAD_CHUNK_SIZE="256K",
                                  FLAG_DIR=str(tmp_path)))
    forged = [line.split() for o in out for line in o.splitlines() if line.startswith("FORGED")]
    assert len(forged) == n, out
    # Writers into the victim are refused, and they name it.
    assert any(f[1] == "RemoteAccessError" and f[2] == str(n - 1) for f in forged), forged
    assert_nothing_left_in_dev_shm()


@pytest.mark.timeout(180)
def test_bringup_runs_its_steps_in_order_on_the_model(built_model):
    """dpa-offload bringup: one line a step, in order, all ok on the model; a broken step
    stops the run with what to check next, the later steps listed as not run."""
    import subprocess
    import sys

    from offload_lib.bringup import STEPS

    def bringup(**env: str) -> tuple[int, list[str]]:
        import os

        r = subprocess.run([sys.executable, "-m", "offload_lib.cli", "bringup"],
                           capture_output=True, text=True, timeout=150,
                           env={**os.environ, **model_env(), **env})
        return r.returncode, r.stdout.splitlines()

    rc, lines = bringup()
    assert rc == 0, "\n".join(lines)
    assert [line.split("  ")[0] for line in lines] == \
        [f"{i} {name}".rstrip() for i, (name, _) in enumerate(STEPS, 1)], lines
    assert all(" ok " in line or " n/a " in line for line in lines), lines
    assert "GID index" in lines[2] and "::ffff:" in lines[2], lines[2]   # IPv4-mapped RoCE v2

    rc, lines = bringup(OFFLOAD_FLEXIO_DEVICE="mlx5_9")
    assert rc == 1
    assert " FAIL " in lines[2] and "mlx5_9" in lines[2] and "next:" in lines[3], lines
    assert all("not run" in line for line in lines[4:]) and len(lines) == len(STEPS) + 1, lines


RAIL_DOWN = r'''
ctx = ol.init()
w, n = ctx.world, size
for it in range(4):   # rank 1's rail 0 goes down during one of these
    per = 20_000
    src = np.arange(per * n, dtype=np.int64) + 1_000_000 * rank + it
    dst = np.zeros_like(src)
    w.alltoall(src, dst).wait(timeout=30)
    check_equal(dst, np.concatenate([np.arange(per * rank, per * (rank + 1)) + 1_000_000 * p + it
                                     for p in range(n)]), f"all-to-all {it} beside a dead rail")
w.barrier().wait(timeout=30)
st = ctx.stats()
print("failovers", st["failovers"], "resent", st["resent_bytes"], flush=True)
ctx.close()
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("threads", [1, 4])
def test_a_rail_that_goes_down_fails_over(built_model, threads):
    """Two rails; rank 1's port 1 goes down after 300 KB (the model's NIC flushes what is
    queued on it with retry-exceeded errors and its peers' requests time out): every op
    still completes exact, over rail 1."""
    from _mp import run_ranks

    out = run_ranks(3, RAIL_DOWN, timeout=120,
                    env=model_env(threads, OFFLOAD_RAILS="2", OFFLOAD_RAIL_FAULTS="1:0@300000",
                                  OFFLOAD_CHUNK_SIZE="64K"))
    assert sum(int(o.split()[1]) for o in out if o.startswith("failovers")) >= 1, out


PEER_CLOSED = r'''
def flag(name):
    return os.path.join(os.environ["FLAG_DIR"], name)
def wait_flag(name):
    deadline = time.monotonic() + 20
    while not os.path.exists(flag(name)):
        assert time.monotonic() < deadline, f"no {name} flag"
        time.sleep(0.005)
ctx = ol.init()
w = ctx.world
w.barrier().wait(timeout=20)
if rank == 2:
    wait_flag("posted0")
    wait_flag("posted1")
    ctx.close()
    open(flag("closed"), "w").close()
else:
    src = np.arange(3 * 100, dtype=np.int64)
    req = w.alltoall(src, np.zeros_like(src))
    open(flag(f"posted{rank}"), "w").close()
    wait_flag("closed")
    t0 = time.monotonic()
    try:
        req.wait(timeout=10)
    except ol.PeerClosed as e:
        assert e.rank == 2 and "closed its context" in str(e), str(e)
        assert time.monotonic() - t0 < 1.0, f"PeerClosed after {time.monotonic() - t0:.2f} s"
    else:
        raise AssertionError("an all-to-all with a closed member completed")
    assert ctx.failed_ranks() == [], ctx.failed_ranks()
    assert ctx.closed_ranks() == [2], ctx.closed_ranks()
    t0 = time.monotonic()
    try:
        w.barrier().wait(timeout=10)
    except ol.PeerClosed as e:
        assert e.rank == 2 and time.monotonic() - t0 < 0.5
    else:
        raise AssertionError("a barrier with a closed member completed")
    team = ctx.create_team([0, 1])
    s2 = np.arange(2 * 10, dtype=np.int64) + 100 * rank
    d2 = np.zeros_like(s2)
    team.alltoall(s2, d2).wait(timeout=10)
    check_equal(d2, np.concatenate([np.arange(10 * rank, 10 * rank + 10) + 100 * p
                                    for p in range(2)]), "the others' all-to-all")
    ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 4])
def test_a_peer_that_closes_is_closed_not_failed(built_model, threads, tmp_path):
    """Rank 2 closes its context (and leaves) while ranks 0 and 1 wait for it in an
    all-to-all: they get PeerClosed naming it within 1 s, closed_ranks() lists it and
    failed_ranks() does not (it did not fail), and the two go on without it."""
    from _mp import run_ranks

    run_ranks(3, PEER_CLOSED, timeout=60, env=model_env(threads, FLAG_DIR=str(tmp_path)))
