"""All-to-all-v's placed forms through the public API, on real multi-rank jobs (the packed
form is test_alltoallv.py's): alltoallv_rows (the DPA gathers table rows by index),
alltoallv with place (rows land at the indices the receiver names) and fixed slots."""
from __future__ import annotations

import numpy as np
import pytest

from offload_lib import InvalidArgument

from _mp import run_ranks

# ---------------------------------------------------------------------------------------------
# alltoallv_rows: the DPA gathers table rows by index (MoE dispatch without a send buffer)

ROWS_SCRIPT = r'''
ctx = ol.init()
R, H = 50, 7


def plan(trial, s):
    """Rank s's rows_per_rank and row list in trial `trial` (every rank can recompute it)."""
    rng = np.random.default_rng(1000 * trial + s)
    per = rng.integers(0, 30, size=size)
    per[(trial + s) % size] = 0 if trial % 4 == 1 else per[(trial + s) % size]
    rows = rng.integers(0, R, size=per.sum())
    if trial % 3 == 0:
        rows = np.sort(rows)  # runs of adjacent rows merge into one gather piece
    return per, rows


base = np.arange(R * H, dtype=np.int32).reshape(R, H)
for trial in range(12):
    per, rows = plan(trial, rank)
    table = base + 10000 * rank
    plans = [plan(trial, s) for s in range(size)]
    arriving = sum(int(p[0][rank]) for p in plans)
    dst = ctx.empty((arriving + 2) * H, np.int32) if trial % 2 else np.full((arriving + 2, H), -1, np.int32)
    dst.reshape(-1)[:] = -1
    got = ctx.world.alltoallv_rows(table, rows, per, dst).wait(timeout=20)
    want = [int(p[0][rank]) for p in plans]
    assert got.tolist() == want, (got, want)
    parts = []
    for s, (ps, rs) in enumerate(plans):
        start = int(ps[:rank].sum())
        parts.append(base[rs[start:start + ps[rank]]] + 10000 * s)
    expected = np.concatenate(parts).reshape(-1)
    flat = dst.reshape(-1)
    check_equal(flat[:expected.size], expected, f"trial {trial}")
    check_equal(flat[expected.size:], np.full(flat.size - expected.size, -1, np.int32), "guard")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 3, 4])
def test_alltoallv_rows_gathers_by_index(n):
    run_ranks(n, ROWS_SCRIPT, timeout=90)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("src, rows, per, match", [
    (np.zeros(12, np.int32), [0], [1], "2-D"),
    (np.zeros((4, 3), np.int32), [4], [1], "index"),
    (np.zeros((4, 3), np.int32), [-1], [1], "index"),
    (np.zeros((4, 3), np.int32), [0, 1], [1], "adds up"),
    (np.zeros((4, 3), np.int32), [[0]], [1], "1-D"),
    (np.zeros((4, 3), np.int32), [0.5], [1], "1-D array of integer"),
    (np.zeros((4, 3), np.int32), [0], [-1], "negative"),
    (np.zeros((4, 3), np.float32), [0], [1], "same dtype"),
    (np.zeros((4, 0), np.int32), [0], [1], "no elements"),
], ids=["flat-src", "row-past-end", "negative-row", "count-mismatch", "2-D-rows",
        "float-rows", "negative-count", "dtype", "zero-width"])
def test_alltoallv_rows_bad_input(ctx, src, rows, per, match):
    with pytest.raises(InvalidArgument, match=match):
        ctx.world.alltoallv_rows(src, rows, per, np.zeros(12, np.int32))


# ---------------------------------------------------------------------------------------------
# alltoallv_place: the DPA lands each row at the receiver's row the sender names (MoE combine)

PLACE_SCRIPT = r'''
ctx = ol.init()
D, H = 60, 5


def plan(trial, s):
    """Rank s's rows_per_rank and, for each receiver j, where its rows land on j (distinct
    rows of j's table across all senders; every rank can recompute every plan)."""
    rng = np.random.default_rng(7000 * trial + s)
    per = rng.integers(0, 12, size=size)
    if trial % 4 == 1:
        per[(trial + s) % size] = 0
    if trial % 5 == 0:
        per[:] = 0
    return per


def places(trial, j):
    """Receiver j's table rows, handed out to the senders in rank order."""
    rng = np.random.default_rng(9000 * trial + j)
    order = rng.permutation(D)
    if trial % 3 == 0:
        order = np.sort(order)  # consecutive rows: one write per run
    out, at = [], 0
    for s in range(size):
        c = int(plan(trial, s)[j])
        out.append(order[at:at + c])
        at += c
    return out


for trial in range(12):
    per = plan(trial, rank)
    place = np.concatenate([places(trial, j)[rank] for j in range(size)]).astype(np.int64)
    extra = trial % 2  # src may hold rows past the ones sent
    src = np.arange((per.sum() + extra) * H, dtype=np.int32).reshape(-1, H) + 10000 * rank
    dst = ctx.empty((D, H), np.int32) if trial % 2 else np.empty((D, H), np.int32)
    dst[...] = -1
    got = ctx.world.alltoallv_place(src, per, dst, place).wait(timeout=20)
    want = np.full((D, H), -1, np.int32)
    for s in range(size):
        ps = plan(trial, s)
        start = int(ps[:rank].sum())
        rows = np.arange(start, start + ps[rank])
        want[places(trial, rank)[s]] = (rows[:, None] * H + np.arange(H)) + 10000 * s
    assert got.tolist() == [int(plan(trial, s)[rank]) for s in range(size)], got
    check_equal(dst.reshape(-1), want.reshape(-1), f"trial {trial}")

# A row outside the receiver's table: the sender's op fails naming that rank, the
# receiver's fails too, nothing lands anywhere, and the team works for the next op.
if size > 1:
    dst = np.full((4, H), -1, np.int32)
    bad = 4 if rank == 0 else 0  # rank 0 aims past rank 1's last row
    place = np.array([0 if j != 1 else bad for j in range(size)], np.int64)
    try:
        ctx.world.alltoallv_place(np.full((size, H), rank + 1, np.int32), [1] * size, dst,
                                  place).wait(timeout=20)
        outcome = "ok"
    except ol.OffloadError as e:
        outcome = f"{type(e).__name__}: {e}"
    if rank == 0:
        assert outcome.startswith("InvalidArgument") and "rank 1 is involved" in outcome, outcome
    elif rank == 1:
        assert outcome.startswith("OffloadError") and "rank 0 failed" in outcome, outcome
        assert not (dst == 1).any(), f"rank 0's row landed: {dst}"
    # placed on one side, packed on the other: refused on both, nothing written
    dst = np.full((size, H), -1, np.int32)
    src = np.ones((size, H), np.int32)
    try:
        if rank == 0:
            ctx.world.alltoallv_place(src, [1] * size, dst, np.arange(size)).wait(timeout=20)
        else:
            ctx.world.alltoallv(src.reshape(-1), [H] * size, dst.reshape(-1)).wait(timeout=20)
        outcome = "ok"
    except ol.OffloadError as e:
        outcome = type(e).__name__
    assert outcome != "ok", outcome
    dst = np.full((size, H), -1, np.int32)
    got = ctx.world.alltoallv_place(np.full((size, H), rank, np.int32), [1] * size, dst,
                                    np.full(size, rank)).wait(timeout=20)
    assert got.tolist() == [1] * size
    check_equal(dst, np.repeat(np.arange(size, dtype=np.int32), H).reshape(size, H), "after")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_alltoallv_place_lands_rows_by_index(n):
    run_ranks(n, PLACE_SCRIPT, timeout=90)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("src, per, dst, place, match", [
    (np.zeros(12, np.int32), [1], np.zeros((4, 3), np.int32), [0], "2-D"),
    (np.zeros((4, 3), np.int32), [1], np.zeros(12, np.int32), [0], "2-D"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 2), np.int32), [0], "same row size"),
    (np.zeros((4, 3), np.int32), [5], np.zeros((4, 3), np.int32), [0] * 5, "src holds 4"),
    (np.zeros((4, 3), np.int32), [2], np.zeros((4, 3), np.int32), [0], "adds up"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 3), np.int32), [-1], "index"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 3), np.int32), [2**32], "index"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 3), np.int32), [0.5], "integer"),
    (np.zeros((4, 3), np.int32), [-1], np.zeros((4, 3), np.int32), [], "negative"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 3), np.float32), [0], "same dtype"),
    (np.zeros((4, 3), np.int32), [1], np.zeros((4, 6), np.int32)[:, ::2], [0], "C-contiguous"),
    (np.zeros((4, 0), np.int32), [1], np.zeros((4, 0), np.int32), [0], "no elements"),
], ids=["flat-src", "flat-dst", "row-size", "more-than-src", "count-mismatch", "negative",
        "too-large", "float-index", "negative-count", "dtype", "strided-dst", "zero-width"])
def test_alltoallv_place_bad_input(ctx, src, per, dst, place, match):
    with pytest.raises(InvalidArgument, match=match):
        ctx.world.alltoallv_place(src, per, dst, place)


# ---------------------------------------------------------------------------------------------
# slot mode: fixed per-source slots, no count round (DeepEP's low-latency layout)

SLOTS_SCRIPT = r'''
ctx = ol.init()
SLOT = 40


def counts_of(trial, s):
    rng = np.random.default_rng(100 * trial + s)
    c = rng.integers(0, SLOT + 1, size=size)
    if trial % 5 == 0:
        c[:] = 0
    if trial % 5 == 1:
        c[:] = SLOT  # every slot full
    return c


for trial in range(15):
    sc = counts_of(trial, rank)
    parts = [np.full(sc[j], 1000 * rank + j, np.int32) for j in range(size)]
    src = np.concatenate(parts) if sc.sum() else np.zeros(0, np.int32)
    dst = ctx.empty(size * SLOT + 3, np.int32) if trial % 2 else np.empty(size * SLOT + 3, np.int32)
    dst[:] = -1
    got = ctx.world.alltoallv(src, sc, dst, slot=SLOT).wait(timeout=20)
    want = [int(counts_of(trial, s)[rank]) for s in range(size)]
    assert got.tolist() == want, (trial, got, want)
    for s in range(size):
        check_equal(dst[s * SLOT:s * SLOT + want[s]], np.full(want[s], 1000 * s + rank, np.int32),
                    f"trial {trial}: slot of rank {s}")
        check_equal(dst[s * SLOT + want[s]:(s + 1) * SLOT],
                    np.full(SLOT - want[s], -1, np.int32), f"trial {trial}: rest of slot {s}")
    check_equal(dst[size * SLOT:], np.full(3, -1, np.int32), "guard")
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 3, 4])
def test_alltoallv_slots(n):
    run_ranks(n, SLOTS_SCRIPT, timeout=90)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("counts, slot, dst_len, recv, match", [
    ([5], 4, 8, None, "fit a slot"),
    ([2], 9, 8, None, "needs dst to hold"),
    ([2], -1, 8, None, "needs dst to hold"),
    ([2], 4, 8, [2], "recv_counts cannot"),
], ids=["count-over-slot", "dst-too-small", "negative-slot", "with-recv-counts"])
def test_alltoallv_slots_bad_input(ctx, counts, slot, dst_len, recv, match):
    with pytest.raises(InvalidArgument, match=match):
        ctx.world.alltoallv(np.zeros(8, np.int32), counts, np.zeros(dst_len, np.int32),
                            recv_counts=recv, slot=slot)


SLOT_DISAGREEMENT = r'''
ctx = ol.init()
slot = 4 if rank == 0 else 8
sends = [6 if (rank == 1 and j == 0) else 1 for j in range(size)]
src = np.arange(sum(sends), dtype=np.int32)
dst = np.full(size * slot, -1, np.int32)
try:
    ctx.world.alltoallv(src, sends, dst, slot=slot).wait(timeout=20)
    outcome = "ok"
except ol.OffloadError as e:
    outcome = type(e).__name__
if rank == 0:
    # rank 1's 6 elements do not fit rank 0's 4-element slot: nothing of it lands there
    check_equal(dst[4:8], np.full(4, -1, np.int32), "slot of rank 1")
    assert outcome == "OffloadError", outcome
if rank == 1:
    assert outcome == "InvalidArgument", outcome
dst = np.full(size * 8, -1, np.int32)
got = ctx.world.alltoallv(np.arange(size, dtype=np.int32), [1] * size, dst, slot=8).wait(timeout=20)
assert got.tolist() == [1] * size
ctx.close()
'''


@pytest.mark.timeout(60)
def test_alltoallv_slot_overflow_is_refused_not_written():
    run_ranks(2, SLOT_DISAGREEMENT, timeout=45)


MODE_DISAGREEMENT = r'''
ctx = ol.init()
H = 4
src = np.full((size, H), rank + 1, np.int32)
# rank 0 counts (plain, placed, rows); the others send no count first (slot mode, or a
# plain all-to-all): every rank sees the others' signatures differ and fails, instead of
# waiting for its op_timeout, naming the op each one runs
for mine, theirs in (("plain", "slot"), ("placed", "slot"), ("plain", "alltoall"),
                     ("rows", "alltoall"), ("placed", "alltoall")):
    dst = np.full((2 * size, H), -1, np.int32)
    start = time.monotonic()
    try:
        if rank == 0 and mine == "plain":
            ctx.world.alltoallv(src.reshape(-1), [H] * size, dst.reshape(-1)).wait(timeout=20)
        elif rank == 0 and mine == "placed":
            ctx.world.alltoallv_place(src, [1] * size, dst, np.arange(size)).wait(timeout=20)
        elif rank == 0:
            ctx.world.alltoallv_rows(src, np.arange(size), [1] * size, dst).wait(timeout=20)
        elif theirs == "slot":
            ctx.world.alltoallv(src.reshape(-1), [H] * size, dst.reshape(-1),
                                slot=2 * H).wait(timeout=20)
        else:
            ctx.world.alltoall(src.reshape(-1), dst[:size].reshape(-1)).wait(timeout=20)
        outcome = "ok"
    except ol.OffloadError as e:
        outcome = f"{type(e).__name__}: {e}"
    what = f"{mine} against {theirs}"
    assert time.monotonic() - start < 10, f"{what}: the mode mismatch took until a timeout"
    # every rank names what differs: the op's signatures disagree (the gate)
    assert outcome.startswith("InvalidArgument") and " runs " in outcome, (what, outcome)
    if rank == 0:
        check_equal(dst.reshape(-1), np.full(dst.size, -1, np.int32), f"{what}: rank 0's dst")
dst = np.full(size * 8, -1, np.int32)
got = ctx.world.alltoallv(np.arange(size, dtype=np.int32), [1] * size, dst, slot=8).wait(timeout=20)
assert got.tolist() == [1] * size
ctx.close()
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3])
def test_modes_that_send_no_count_against_counting_ranks_fail_fast(n):
    """Ranks that disagree on the op (slot mode or all-to-all against counted, rows or
    placed all-to-all-v) fail at once on every rank, nothing lands in the counting rank's
    destination, and the team goes on."""
    run_ranks(n, MODE_DISAGREEMENT, timeout=45)
