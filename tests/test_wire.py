"""The emulated wire (config ``wire_min``, emulator/emu_wire.c).

Where every rank has a core, a large RDMA write into another rank's ordinary memory goes in
two copies through slots in the job segment, the second by the target's own threads,
instead of one process_vm_writev. The tests run two ranks (the wire needs a core per rank)
and check: exact results for blocks that fit the wire, overflow it (the rest goes
directly) or stay under wire_min, on odd sizes, with the wire on and off, and what stats()
says went which way (the wire, or directly where that measured cheaper: which later sizes
take which way depends on the machine's memory, so only the first, which always takes the
wire, and the counters' sum are fixed: tests/test_wire_choice.py checks the choice itself
with a clock of its own); a target stopped with pieces on its wire (the sender takes them
back after a stall and writes them itself: no op waits on a peer that does not run); and a
target killed with pieces on its wire (the sender's op fails naming it, no hang).
"""
from __future__ import annotations

import os

import pytest

from _mp import DONE_MARK, run_job, run_ranks

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="the wire is used where every rank has a core")

EXACT = r'''
ctx = ol.init()
w = ctx.world
wire_on = int(os.environ["OFFLOAD_WIRE_MIN"]) > 0
# Per peer: under wire_min, past the wire's 2 MiB (the rest goes directly), one piece and
# a bit, exactly 2 MiB, and a block that is many pieces with an odd tail. Which way a write
# goes is measured as it goes (emu_wire_route): writes take the wire until a copy into
# slots used before was timed, the next goes directly. With 4 MiB chunks (the test's
# chunk_size) the first op's write fills the 16 fresh slots (its rest goes directly), the
# second's is timed, the third's goes directly: every way runs, whatever this machine's
# costs.
for per in (64 * 1024 - 1, 4 * 1024 * 1024 + 12, 128 * 1024 + 3, 2 * 1024 * 1024,
            1024 * 1024 + 4097):
    src = ((np.arange(per * size, dtype=np.uint64) * 7 + 131 * rank) % 251).astype(np.uint8)
    dst = np.zeros(per * size, np.uint8)
    want = np.concatenate([((np.arange(per * rank, per * (rank + 1), dtype=np.uint64) * 7 +
                             131 * p) % 251).astype(np.uint8) for p in range(size)])
    for i in range(3):
        dst[:] = 0
        w.alltoall(src, dst).wait(timeout=30)
        check_equal(dst, want, f"{per} bytes per peer, op {i}")
st = ctx.stats()
print(f"wire {st['wire_bytes']} direct {st['wire_direct_bytes']} rescues {st['wire_rescues']} "
      f"skipped {st['wire_skipped_bytes']}", flush=True)
if wire_on:
    assert st["wire_bytes"] > 0 and st["wire_direct_bytes"] > 0, st
    assert st["wire_skipped_bytes"] > 0, st
else:
    assert st["wire_bytes"] == st["wire_direct_bytes"] == st["wire_skipped_bytes"] == 0, st
assert st["wire_rescues"] == 0, st
ctx.close()
'''


@pytest.mark.timeout(180)
@pytest.mark.parametrize("wire_min, progress", [("65536", "cooperative"), ("0", "cooperative"),
                                                ("65536", "threads")])
def test_exchanges_through_the_wire_are_exact(wire_min, progress):
    # progress: threads — the progress threads send and place, the host threads only sleep.
    out = run_ranks(2, EXACT, timeout=120,
                    env={"OFFLOAD_WIRE_MIN": wire_min, "OFFLOAD_PROGRESS": progress,
                         "OFFLOAD_CHUNK_SIZE": "4M"})
    assert all("wire " in text for text in out), out


# Both fault tests: every rank's pid, a wait for a rank to stop, a warmed 1 MiB exchange.
# (Its write and the next fill the wire's 16 fresh slots: untimed, they take the wire.)
STOP_SETUP = r'''
def pids_of_all(w):
    """Every rank's pid, by rank (an all-to-all of one int64 per peer)."""
    mine = np.full(size, os.getpid(), np.int64)
    all_pids = np.zeros(size, np.int64)
    w.alltoall(mine, all_pids).wait(timeout=30)
    return [int(p) for p in all_pids]


def wait_stopped(pid):
    """Until pid is stopped (its /proc state T): no sleep guessing how long that takes."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.001)
    raise AssertionError(f"rank process {pid} never stopped")


ctx = ol.init()
w = ctx.world
pids = pids_of_all(w)
per = 1024 * 1024
src = np.full(per * size, rank + 1, np.uint8)
dst = np.zeros_like(src)
w.alltoall(src, dst).wait(timeout=30)  # warm: registrations made
'''

# Rank 1 posts (its ready goes out), then stops itself (a helper continues it 0.4 s
# later); rank 0 posts once it is stopped, sees the ready, puts its block on the wire, and
# nobody places it. Rank 0 must take the pieces back and write them itself
# (wire_rescues), and both ranks end with exact results.
STOPPED = STOP_SETUP + r'''
import subprocess
want = np.repeat(np.arange(1, size + 1, dtype=np.uint8), per)
before = ctx.stats()["wire_rescues"]
w.barrier().wait(timeout=30)
dst[:] = 0
if rank == 1:
    req = w.alltoall(src, dst)  # the post runs the firmware: our ready goes out
    subprocess.Popen(["sh", "-c", f"sleep 0.4; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    req.wait(timeout=30)
else:
    wait_stopped(pids[1])
    w.alltoall(src, dst).wait(timeout=30)
check_equal(dst, want, "the op around the stop")
rescues = ctx.stats()["wire_rescues"] - before
print(f"rescues {rescues}", flush=True)
if rank == 0:
    assert rescues > 0, "rank 0's pieces were placed by a stopped rank?"
w.barrier().wait(timeout=30)
ctx.close()
'''


@pytest.mark.timeout(120)
def test_a_stopped_target_has_its_pieces_taken_back():
    out = run_ranks(2, STOPPED, timeout=60, env={"OFFLOAD_WIRE_MIN": "65536"})
    assert "rescues" in out[0], out


# Rank 1 posts (its ready goes out) and stops; rank 0 posts once it is stopped, puts its
# block on the wire, and kills rank 1 at once: the pieces are never placed, and taking
# them back finds a dead target. Rank 0's op must fail naming rank 1, not wait.
DYING = STOP_SETUP + r'''
w.barrier().wait(timeout=30)
if rank == 1:
    w.alltoall(src, dst)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(30)  # never reached: killed while stopped
wait_stopped(pids[1])
req = w.alltoall(src, dst)
os.kill(pids[1], signal.SIGKILL)
t0 = time.monotonic()
try:
    req.wait(timeout=30)
except ol.PeerFailure as e:
    assert e.rank == 1, e
    print(f"peer failure seen after {time.monotonic() - t0:.2f} s", flush=True)
else:
    raise AssertionError("the op with a dead peer completed")
ctx.close()
'''


@pytest.mark.timeout(120)
def test_a_target_dying_with_pieces_on_the_wire_fails_the_op():
    _, ranks, _, _ = run_job(2, DYING, timeout=60, grace=10.0,
                             env={"OFFLOAD_WIRE_MIN": "65536"})
    assert DONE_MARK in ranks[0] and "peer failure seen" in ranks[0], ranks
