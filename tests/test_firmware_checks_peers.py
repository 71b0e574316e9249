"""The firmware re-checks what crosses the boundary between ranks too (test_firmware_checks.py
has one rank's raw posts): a forged rkey a peer published for its destination is refused,
and ranks that disagree on a command (its block size, their eager_max, one rank's copy
rejected at intake) get errors, not a hang, and stay in step for the next op."""
from __future__ import annotations

import pytest

from _mp import run_ranks

# -- across ranks -------------------------------------------------------------------------------

FORGED_REMOTE_RKEY = r'''
import errno
from offload_lib._native import ffi, lib
from offload_lib.errors import ERR_REMOTE_ACCESS, OK
ctx = ol.init()
h = ctx._handle()
SENT = 0x5A


def reg(a, access):
    key, owned = ffi.new("uint32_t *"), ffi.new("int *")
    rc = lib.host_mr_acquire(h, ffi.cast("void *", a.ctypes.data), a.nbytes, access, key, owned)
    assert rc == 0
    return int(key[0])


def run(src, dst, sk, dk, timeout_s):
    op = ffi.new("struct host_op *")
    op.opcode, op.team = lib.OFFLOAD_OP_ALLTOALL, 0
    op.src_addr, op.src_key, op.dst_addr, op.dst_key = src.ctypes.data, sk, dst.ctypes.data, dk
    op.count, op.dst_len = src.nbytes // 2, dst.nbytes
    op.src_len = src.nbytes
    tag = ffi.new("uint32_t *")
    assert lib.host_post(h, op, 10**10, tag) == 0
    comp = ffi.new("struct host_completion *")
    rc = lib.host_wait(h, tag[0], int(timeout_s * 1e9), 0, comp)
    if rc == -errno.ETIMEDOUT:
        return None
    assert rc == 0, rc
    return comp


src = np.full(128, 10 + rank, np.uint8)
dst = np.full(128, SENT, np.uint8)
sk = reg(src, lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_REMOTE_READ)
dk = reg(dst, lib.OFFLOAD_ACCESS_LOCAL_READ | lib.OFFLOAD_ACCESS_LOCAL_WRITE |
         lib.OFFLOAD_ACCESS_REMOTE_WRITE)
comp = run(src, dst, sk, dk, 20)  # control
assert comp is not None and comp.status == OK, "control op failed"
check_equal(dst, np.repeat(np.array([10, 11], np.uint8), 64), "control")
dst[:] = SENT
# rank 1 publishes a forged rkey for its destination
comp = run(src, dst, sk, dk ^ 0x80000000 if rank == 1 else dk, 3)
if rank == 1:  # whatever the completion says, nothing of rank 0's block may have arrived
    check_equal(dst[:64], np.full(64, SENT, np.uint8), "rank 1: block from rank 0")
if comp is None:
    print("NO_COMPLETION")
    sys.exit(3)
print("status", comp.status, "detail", comp.detail)
if os.environ["OFFLOAD_EAGER_MAX"] != "0":
    # Eager: the key never leaves rank 1, whose own copy out of the slot is refused; rank 0
    # delivered into the slot and is done.
    assert (comp.status, comp.detail) == ((OK, 0) if rank == 0 else (ERR_REMOTE_ACCESS, 1)), (
        comp.status, comp.detail)
elif rank == 0:
    # rank 0's write into rank 1 was refused by the check, and it names rank 1
    assert comp.status == ERR_REMOTE_ACCESS, comp.status
    assert comp.detail == 1, comp.detail
else:
    assert comp.status < 0, f"rank 1's op must fail too (rank 0 could not deliver): {comp.status}"
ctx.close()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("eager_max", ["0", "8K"], ids=["rendezvous", "eager"])
def test_forged_rkey_published_to_a_peer_is_refused(eager_max):
    """A destination key that does not cover the destination: with the rendezvous
    protocol (the receiver publishes it) the sender's write is refused and names the
    receiver; eagerly, the receiver's own copy out is refused. Nothing arrives either way."""
    run_ranks(2, FORGED_REMOTE_RKEY, timeout=45, env={"OFFLOAD_EAGER_MAX": eager_max})


BLOCK_SIZE_MISMATCH = r'''
ctx = ol.init()
# the ranks disagree on the block size (both eager, both rendezvous, or one of each)
per_peer = int(os.environ["PER_PEER_0" if rank == 0 else "PER_PEER_1"])
src = np.full(2 * per_peer, 10 + rank, np.uint8)
dst = np.full(2 * per_peer, 0x5A, np.uint8)
req = ctx.world.alltoall(src, dst)           # each rank's own call is well-formed
t0 = time.monotonic()
try:
    req.wait(timeout=20)
except ol.Timeout as e:
    raise AssertionError(f"rank {rank}: the mismatch hung until the timeout: {e}")
except ol.OffloadError as e:
    print(f"rank {rank} got {type(e).__name__}: {e}")
    took = time.monotonic() - t0
    assert took < 10, f"the error took {took:.1f} s"
    assert isinstance(e, ol.InvalidArgument) or str(1 - rank) in str(e), (
        f"expected InvalidArgument, or an error naming rank {1 - rank}: {e!r}")
else:
    raise AssertionError(f"rank {rank}: an all-to-all with mismatched block sizes succeeded")
# nothing of the peer's block arrived
peer = 1 - rank
check_equal(dst[peer * per_peer:(peer + 1) * per_peer], np.full(per_peer, 0x5A, np.uint8),
            f"rank {rank}: block from rank {peer}")
# the error left the team usable: a matching all-to-all right after works
src = np.arange(8, dtype=np.int64) + 100 * rank
dst = np.full(8, -1, np.int64)
ctx.world.alltoall(src, dst).wait(timeout=20)
check_equal(dst, np.concatenate([np.arange(4 * rank, 4 * rank + 4) + 100 * p for p in range(2)]),
            "all-to-all after the mismatch")
ctx.close()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sizes", [(16, 32), (8192, 16384), (16384, 8192), (65536, 131072)],
                         ids=["eager", "eager-vs-rendezvous", "rendezvous-vs-eager",
                              "rendezvous"])
def test_ranks_disagreeing_on_block_size_get_errors_not_a_hang(sizes):
    """Blocks of up to eager_max (8 KiB) go eagerly, larger ones with a ready: a rank of each
    kind must see the other's ready or slot word and fail at once, like two of a kind."""
    run_ranks(2, BLOCK_SIZE_MISMATCH, timeout=45,
              env={"PER_PEER_0": str(sizes[0]), "PER_PEER_1": str(sizes[1])})


@pytest.mark.timeout(60)
def test_ranks_disagreeing_on_eager_max_get_errors_not_a_hang():
    """Same block size, but rank 1 sends everything with a ready (eager_max 0): the eager
    rank sees its ready and both fail at once; the next all-to-all works again."""
    run_ranks(2, EAGER_MAX_MISMATCH, timeout=45)


EAGER_MAX_MISMATCH = r'''
ctx = ol.init({"eager_max": 8192 if rank == 0 else 0})
src = np.full(2 * 64, 10 + rank, np.uint8)
dst = np.full(2 * 64, 0x5A, np.uint8)
t0 = time.monotonic()
try:
    ctx.world.alltoall(src, dst).wait(timeout=20)
except ol.Timeout as e:
    raise AssertionError(f"rank {rank}: the mismatch hung until the timeout: {e}")
except ol.OffloadError as e:
    print(f"rank {rank} got {type(e).__name__}: {e}")
    assert time.monotonic() - t0 < 10, "the error took too long"
    # the signatures differ in the protocol alone (OFFLOAD_ERR_MISMATCH, as the gate says)
    assert isinstance(e, ol.InvalidArgument), repr(e)
    assert f"rank {1 - rank} " in str(e) and "eager_max" in str(e), e
else:
    raise AssertionError(f"rank {rank}: an all-to-all across protocols succeeded")
peer = 1 - rank
check_equal(dst[peer * 64:(peer + 1) * 64], np.full(64, 0x5A, np.uint8), "nothing arrived")
# the counters stayed in step: larger blocks (rendezvous on both) and barriers still pair
src = np.arange(2 * 4096, dtype=np.int64) + 100000 * rank
dst = np.full(2 * 4096, -1, np.int64)
ctx.world.alltoall(src, dst).wait(timeout=20)
check_equal(dst, np.concatenate([np.arange(4096 * rank, 4096 * (rank + 1)) + 100000 * p
                                 for p in range(2)]), "all-to-all after the mismatch")
ctx.world.barrier().wait(timeout=20)
ctx.close()
'''


REJECTED_ON_ONE_RANK = r'''
from offload_lib._native import ffi, lib
ctx = ol.init()
h = ctx._handle()
n = size
src = np.arange(4 * n, dtype=np.int32) + 100 * rank
dst = np.full(4 * n, -1, np.int32)


def raw(opcode, **fields):
    """Post a command straight into the ring, bypassing the Python checks."""
    op = ffi.new("struct host_op *")
    op.opcode, op.team = opcode, 0
    for name, value in fields.items():
        setattr(op, name, value)
    tag = ffi.new("uint32_t *")
    assert lib.host_post(h, op, 10**10, tag) == 0
    comp = ffi.new("struct host_completion *")
    assert lib.host_wait(h, tag[0], 20 * 10**9, 0, comp) == 0, "no completion: hang"
    return comp.status


good = dict(src_addr=src.ctypes.data, src_len=src.nbytes, dst_addr=dst.ctypes.data,
            dst_len=dst.nbytes, count=16)
for case, bad in (("all-to-all, dst_len too small", dict(good, dst_len=8)),
                  ("all-to-all, unknown flags", dict(good, flags=0x80)),  # beyond every F_
                  ("barrier with a count", None)):
    if bad is None:
        status = raw(lib.OFFLOAD_OP_BARRIER, count=7 if rank == 0 else 0)
    else:
        status = raw(lib.OFFLOAD_OP_ALLTOALL, **(bad if rank == 0 else good))
    # The malformed command fails where it was posted, and its peers' ops fail cleanly.
    assert status != 0 or (case.startswith("barrier") and rank != 0), (case, rank, status)
    if rank == 0:
        assert status == lib.OFFLOAD_ERR_INVALID, (case, status)
    # The team's sequence did not shift: the next op pairs up and delivers.
    dst[:] = -1
    ctx.world.alltoall(src, dst).wait(timeout=20)
    want = np.concatenate([np.arange(4 * rank, 4 * rank + 4, dtype=np.int32) + 100 * s
                           for s in range(n)])
    check_equal(dst, want, f"after: {case}")
ctx.close()
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_a_command_rejected_on_one_rank_keeps_the_team_in_step(n):
    run_ranks(n, REJECTED_ON_ONE_RANK, timeout=60)
