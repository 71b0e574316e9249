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


def model_env(threads: int = 1, **extra: str) -> dict[str, str]:
    return {**MODEL_ENV, "OFFLOAD_DPA_THREADS": str(threads), **extra}


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
    w.barrier()                      # posted, then the process dies in it
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.2)
t0 = time.monotonic()
try:
    w.barrier().wait(timeout=10)
except ol.PeerFailure as e:
    took = time.monotonic() - t0
    assert e.rank == victim and f"rank {victim}" in str(e), (e.rank, str(e))
    assert took < 2.0, f"PeerFailure after {took:.2f} s"
else:
    raise AssertionError("a barrier with a dead member completed")
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
