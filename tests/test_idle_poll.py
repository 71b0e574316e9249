"""The progress threads' idle poll (config ``idle_poll_us``, emulator/emu_progress.c).

Where the ranks outnumber the cores, bulk ops are the progress threads' work. For
idle_poll_us after one, a progress thread naps instead of sleeping until woken, and the
host's doorbell leaves it be (it sees the command within a nap). The ranks here are held to
two CPUs, so that they outnumber the cores on any machine. Exact results with the idle poll
on and off, the doorbells it spared counted in stats(), a peer dying while the others nap,
and close() from another thread while a progress thread naps: none may hang.
"""
from __future__ import annotations

import pytest

from _mp import DONE_MARK, run_job, run_ranks

TWO_CPUS = r'''
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, cpus[:2])  # before init: the progress threads inherit it
'''

PERSISTENT = TWO_CPUS + r'''
import threading
ctx = ol.init()
w = ctx.world
per = 128 * 1024  # float32 per peer: 512 KiB, 2 MiB per rank (bulk: the threads copy)
src = np.arange(per * size, dtype=np.float32) + 1e6 * rank
dst = np.zeros_like(src)
want = np.concatenate([np.arange(per * rank, per * (rank + 1), dtype=np.float32) + 1e6 * p
                       for p in range(size)])
p = w.alltoall_init(src, dst)
ops = 20
for i in range(ops):
    w.barrier().wait(timeout=20)
    time.sleep(0.005)  # the progress threads go idle: napping, or asleep without the poll
    dst[:] = -1
    p.post()
    while not p.test():
        time.sleep(0.0005)
    check_equal(dst, want, f"op {i}")
st = ctx.stats()
print(f"doorbells {st['doorbells']} wakes {st['doorbell_wakes']}", flush=True)
assert st["doorbells"] >= ops, st
if int(os.environ["OFFLOAD_IDLE_POLL_US"]):
    # the posts after the first find the thread in its idle poll (gaps of 5 ms: napping,
    # the poll lasts 1 s), or still awake: at most a few (a late last pass) need a wake-up
    assert st["doorbell_wakes"] <= ops // 4, st
else:
    assert st["doorbell_wakes"] >= ops // 2, st
p.free()
w.barrier().wait(timeout=20)
# close() from another thread while this rank's progress thread naps (it just copied)
w.alltoall(src, dst).wait(timeout=20)
check_equal(dst, want, "last op")
closer = threading.Thread(target=ctx.close)
closer.start()
closer.join(timeout=20)
assert not closer.is_alive(), "close() from another thread hung with a napping progress thread"
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("idle_poll_us", [1_000_000, 0])
def test_bulk_posts_with_and_without_the_idle_poll(idle_poll_us):
    out = run_ranks(4, PERSISTENT, timeout=90,
                    env={"OFFLOAD_IDLE_POLL_US": str(idle_poll_us)})
    assert all("doorbells" in text for text in out), out


# Rank 3 dies between two ops while the others' progress threads nap; the survivors' next
# op (posted without waking anyone) must fail naming it, not wait for a nap that never
# ends or an op timeout.
DEATH = TWO_CPUS + r'''
import signal
ctx = ol.init()
w = ctx.world
per = 512 * 1024
src = np.zeros(per * size, np.uint8)
dst = np.zeros_like(src)
for i in range(3):
    w.alltoall(src, dst).wait(timeout=20)
w.barrier().wait(timeout=20)
if rank == 3:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.005)
try:
    w.alltoall(src, dst).wait(timeout=20)
except ol.PeerFailure as e:
    assert e.rank == 3, e
    print("peer failure seen", flush=True)
else:
    raise AssertionError("the op with a dead peer completed")
ctx.close()
'''


@pytest.mark.timeout(120)
def test_a_peer_dying_while_the_others_nap_fails_their_next_op():
    rc, ranks, _, _ = run_job(4, DEATH, timeout=60, grace=10.0,
                              env={"OFFLOAD_IDLE_POLL_US": "1000000"})
    report = "\n".join(f"--- rank {r} ---\n{t}" for r, t in enumerate(ranks))
    for r in (0, 1, 2):
        assert DONE_MARK in ranks[r] and "peer failure seen" in ranks[r], report


# Where the ranks outnumber the cores, a bulk op's post() and test() leave the copies to the
# progress threads (offload for a caller that overlaps), and its wait() takes over what is
# left: a waiter that slept was woken only once the scheduler gave it a core, a slice late
# while the other ranks computed (emu_drive.c, may_drive). host_passes counts the passes
# host threads ran. The waits run in most ops (a progress thread may have finished first).
BULK_WAIT = TWO_CPUS + r'''
ctx = ol.init()
w = ctx.world
per = 128 * 1024  # float32 per peer: 2 MiB per rank (bulk)
src = np.arange(per * size, dtype=np.float32) + 1e6 * rank
dst = np.zeros_like(src)
want = np.concatenate([np.arange(per * rank, per * (rank + 1), dtype=np.float32) + 1e6 * p
                       for p in range(size)])
w.alltoall(src, dst).wait(timeout=20)
waits = []
for i in range(8):
    w.barrier().wait(timeout=20)
    time.sleep(0.005)  # the progress thread naps (its idle poll after the bulk op)
    dst[:] = -1
    before = ctx.stats()["host_passes"]
    w.alltoall(src, dst).wait(timeout=20)
    waits.append(ctx.stats()["host_passes"] - before)
    check_equal(dst, want, f"op {i}")
assert sum(1 for n in waits if n) >= len(waits) // 2, f"host passes in bulk waits: {waits}"
p = w.alltoall_init(src, dst)
tests = []
for i in range(8):
    w.barrier().wait(timeout=20)
    dst[:] = -1
    before = ctx.stats()["host_passes"]
    p.post()
    while not p.test():
        time.sleep(0.0005)
    tests.append(ctx.stats()["host_passes"] - before)
    check_equal(dst, want, f"persistent op {i}")
assert tests == [0] * len(tests), f"host passes in bulk post() + test(): {tests}"
p.free()
w.barrier().wait(timeout=20)
ctx.close()
'''


@pytest.mark.timeout(120)
def test_a_bulk_wait_takes_over_the_copies():
    run_ranks(4, BULK_WAIT, timeout=90, env={"OFFLOAD_IDLE_POLL_US": "1000000"})
