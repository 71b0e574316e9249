"""MoE dispatch/combine (offload_lib.moe) against a single-process reference.

Three layers, cheapest first:
1. argument checks and get_layout in this process, on a team stub that fails the test if
   anything is posted (every bad input must be refused before the first all-to-all-v);
2. the Dispatcher's logic on simulated ranks: FakeTeam implements Team.alltoallv's contract
   (counts in elements, exchanged by the transport, arrivals packed by source rank, recv counts
   returned by wait()) with one thread per rank, so team sizes up to 8 cost milliseconds;
3. real multi-rank jobs on the emulator (team sizes 1, 2, 3, 4, 8, each one batched job), the
   example, and torch tensors (skipped when torch is missing).

Every case is checked exactly: token values are multiples of 1/2, weights multiples of 1/4 and
the "experts" multiply by (global expert id + 1), so the reference, computed from all ranks'
inputs drawn from one seed, predicts every bit of recv_x, recv_topk_idx, recv_topk_weights and
combine's output (which adds in float32 and rounds once to the payload type).
"""
from __future__ import annotations

import os
import re
import threading

import numpy as np
import pytest

from offload_lib import moe
from offload_lib.errors import InvalidArgument

from _mp import run_ranks

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "moe_layer.py")

# The reference and the case matrix, shared by the in-process tests and the rank scripts.
REF = r'''
import numpy as np
from offload_lib import moe

PAYLOADS = ("float32", "float16", "bfloat16")
ROUTINGS = ("random", "skew", "packed", "none")
HIDDEN = 24
MAX_TOKENS = 40


def num_experts_for(n):
    return n * max(2, -(-8 // n))  # >= 8 experts (k = 8), >= 2 per rank


def bf16_bits(f):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(f, np.float32).view(np.uint32).astype(np.uint64)
    upper, lower = u >> 16, u & 0xFFFF
    up = (lower > 0x8000) | ((lower == 0x8000) & ((upper & 1) == 1))
    return (upper + up).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_f64(a, payload):
    return bf16_value(a).astype(np.float64) if payload == "bfloat16" else a.astype(np.float64)


def from_f64(v, payload):
    return bf16_bits(v.astype(np.float32)) if payload == "bfloat16" else v.astype(payload)


def dispatcher_dtype(payload):
    return "bfloat16" if payload == "bfloat16" else np.dtype(payload)


def make_inputs(seed, n, src, num_experts, k, payload, routing, weights=True, salt=0):
    """Rank src's (x, topk_idx, topk_weights), the same in every process."""
    rng = np.random.default_rng([seed, n, src, num_experts, k, ROUTINGS.index(routing), salt])
    tokens = (MAX_TOKENS, 0, int(rng.integers(1, MAX_TOKENS)))[(src + salt) % 3]
    x = from_f64(rng.integers(-8, 9, (tokens, HIDDEN)) * 0.5, payload)
    idx = np.full((tokens, k), -1, np.int64)
    if routing == "random":  # k distinct experts, some slots dropped, every 5th token none
        idx[:] = np.argsort(rng.random((tokens, num_experts)), axis=1)[:, :k]
        idx[rng.random((tokens, k)) < 0.2] = -1
        idx[::5] = -1
    elif routing == "skew":  # every token to expert 0
        idx[:, 0] = 0
    elif routing == "packed":  # experts 0..k-1: several on one rank, sent once
        idx[:] = np.arange(k)
    w = (rng.integers(1, 5, (tokens, k)) * 0.25).astype(np.float32) if weights else None
    return x, idx, w


def expert_rows(xf, gids, w):
    """sum_j w_j * (gids_j + 1) * x over the slots with gids >= 0, in float64 (exact here)."""
    w = np.ones(gids.shape) if w is None else w.astype(np.float64)
    return xf * np.where(gids >= 0, w * (gids + 1), 0.0).sum(axis=1)[:, None]


def expert_output(recv_x, recv_idx, recv_w, first, payload):
    """What this rank's experts return for the rows it received (already weighted)."""
    gids = np.where(recv_idx >= 0, recv_idx + first, -1)
    return from_f64(expert_rows(to_f64(recv_x, payload), gids, recv_w), payload)


def reference(inputs, me, n, num_experts, payload):
    """(recv_x, recv_topk_idx, recv_topk_weights) rank `me` receives, and the `out` it gets back."""
    epr = num_experts // n
    rx, ri, rw = [], [], []
    for x, idx, w in inputs:
        own = (idx >= 0) & (idx // epr == me)
        keep = own.any(axis=1)
        rx.append(x[keep])
        ri.append(np.where(own, idx - me * epr, -1)[keep])
        if w is not None:
            rw.append(np.where(own, w, 0).astype(w.dtype)[keep])
    recv_w = np.concatenate(rw) if rw else None
    x, idx, w = inputs[me]
    total = np.zeros(x.shape, np.float64)
    for d in range(n):
        own = (idx >= 0) & (idx // epr == d)
        y = from_f64(expert_rows(to_f64(x, payload), np.where(own, idx, -1), w), payload)
        total += np.where(own.any(axis=1)[:, None], to_f64(y, payload), 0.0)
    return np.concatenate(rx), np.concatenate(ri), recv_w, from_f64(total, payload)


def check_same(got, want, what):
    assert type(got) is np.ndarray, f"{what}: got {type(got).__name__}, want a numpy array"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    bad = np.argwhere(got != want)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {got.size} elements differ; first at {i}: "
                             f"got {got[i]!r}, want {want[i]!r}")


def one_case(disp, inputs, me, n, payload, what, in_place=False):
    x, idx, w = inputs[me]
    recv_x, recv_idx, recv_w, handle = disp.dispatch(x, idx, w)
    want_x, want_idx, want_w, want_out = reference(inputs, me, n, disp.num_experts, payload)
    check_same(recv_x, want_x, f"{what}: recv_x")
    check_same(recv_idx, want_idx, f"{what}: recv_topk_idx")
    if w is None:
        assert recv_w is None, f"{what}: topk_weights=None must give recv_topk_weights=None"
    else:
        check_same(recv_w, want_w, f"{what}: recv_topk_weights")
    per_rank, _, in_rank = disp.get_layout(idx)
    assert handle.send_rows.tolist() == per_rank.tolist(), (what, handle, per_rank)
    y = expert_output(recv_x, recv_idx, recv_w, disp.first_local_expert, payload)
    if in_place:  # experts writing over their input, as DeepEP users do
        recv_x[...] = y
        y = recv_x
    check_same(disp.combine(y, handle), want_out, f"{what}: combine")


def run_cases(team, seed, payloads=PAYLOADS):
    """k in {1, 2, 8} x four routings per payload, all through one Dispatcher per payload
    (buffers reused, metadata regrown as k grows), then two handles outstanding at once."""
    n, me = team.size, team.rank
    num_experts = num_experts_for(n)
    done = 0
    for payload in payloads:
        disp = moe.Dispatcher(team, num_experts, HIDDEN, MAX_TOKENS, dispatcher_dtype(payload))
        for k in (1, 2, 8):
            for routing in ROUTINGS:
                weights = routing != "packed"
                done += 1
                inputs = [make_inputs(seed, n, s, num_experts, k, payload, routing, weights, done)
                          for s in range(n)]
                what = f"n={n} rank={me} {payload} k={k} {routing} weights={weights}"
                one_case(disp, inputs, me, n, payload, what, in_place=routing == "skew")
        # two dispatches before their combines, combined in reverse order
        ins = [[make_inputs(seed, n, s, num_experts, 2, payload, "random", True, 100 + i)
                for s in range(n)] for i in (0, 1)]
        got = []
        for inputs in ins:
            rx, ri, rw, h = disp.dispatch(*inputs[me])
            got.append((expert_output(rx, ri, rw, disp.first_local_expert, payload), h))
        for i in (1, 0):
            want = reference(ins[i], me, n, num_experts, payload)[3]
            check_same(disp.combine(*got[i]), want, f"n={n} rank={me} {payload}: handle {i}")
    return done
'''
_REF: dict = {}
exec(compile(REF, "moe_reference", "exec"), _REF)  # noqa: S102 - the same text runs in the ranks
ROUTINGS, bf16_bits, bf16_value, check_same, dispatcher_dtype, run_cases = (
    _REF[name] for name in ("ROUTINGS", "bf16_bits", "bf16_value", "check_same",
                            "dispatcher_dtype", "run_cases"))


# -- a stand-in team: the alltoallv contract across threads of one process -----------------------
class _FakeRequest:
    def __init__(self, counts, error=None):
        self._counts, self._error = counts, error

    def test(self):
        return True

    def wait(self, timeout=None):
        if self._error is not None:
            raise self._error
        return self._counts


class _FakeWorld:
    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots = {}


class FakeTeam:
    """Team.alltoallv on simulated ranks (one thread each): completes at post, like a fast DPA."""

    def __init__(self, world, rank):
        self.world, self.rank, self.size = world, rank, world.n
        self.posts = 0

    def alltoallv(self, src, send_counts, dst, recv_counts=None):
        n, w = self.size, self.world
        assert isinstance(src, np.ndarray) and isinstance(dst, np.ndarray), (type(src), type(dst))
        assert src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable
        if src.dtype != dst.dtype:
            raise InvalidArgument(f"src is {src.dtype} but dst is {dst.dtype}")
        counts = np.asarray(send_counts)
        assert counts.shape == (n,) and counts.dtype.kind in "iu" and (counts >= 0).all(), counts
        if counts.sum() > src.size:
            raise InvalidArgument(f"send_counts add up to {counts.sum()} but src holds {src.size}")
        flat, ends = src.reshape(-1), np.cumsum(counts)
        self.posts += 1
        key = (self.posts, self.rank)
        w.slots[key] = [flat[e - c:e].copy() for c, e in zip(counts, ends)]
        w.barrier.wait()
        parts = [w.slots[(self.posts, i)][self.rank] for i in range(n)]
        w.barrier.wait()
        del w.slots[key]
        recv = np.array([p.size for p in parts], np.int64)
        if recv.sum() > dst.size:
            return _FakeRequest(None, InvalidArgument(
                f"dst too small: {recv.sum()} elements arrive but it holds {dst.size}"))
        dst.reshape(-1)[:recv.sum()] = np.concatenate(parts)
        return _FakeRequest(recv)

    def alltoallv_place(self, src, rows_per_rank, dst, place):
        n, w = self.size, self.world
        assert src.ndim == 2 and dst.ndim == 2 and src.shape[1] == dst.shape[1]
        assert dst.flags.c_contiguous and dst.flags.writeable and src.dtype == dst.dtype
        per, place = np.asarray(rows_per_rank), np.asarray(place)
        assert place.ndim == 1 and place.size == per.sum() <= src.shape[0]
        ends = np.cumsum(per)
        self.posts += 1
        key = (self.posts, self.rank)
        w.slots[key] = [(src[e - c:e].copy(), place[e - c:e].copy()) for c, e in zip(per, ends)]
        w.barrier.wait()
        parts = [w.slots[(self.posts, i)][self.rank] for i in range(n)]
        w.barrier.wait()
        del w.slots[key]
        for rows, where in parts:
            assert not where.size or where.max() < dst.shape[0], "a row placed outside dst"
            dst[where] = rows
        return _FakeRequest(np.array([rows.shape[0] for rows, _ in parts], np.int64))

    def alltoallv_rows(self, src, rows, rows_per_rank, dst):
        assert isinstance(src, np.ndarray) and src.ndim == 2 and src.flags.c_contiguous
        rows = np.asarray(rows)
        assert rows.ndim == 1 and rows.size == np.asarray(rows_per_rank).sum()
        width = src.shape[1]
        req = self.alltoallv(np.ascontiguousarray(src[rows]), np.asarray(rows_per_rank) * width,
                             dst)
        try:
            return _FakeRequest(req.wait() // width)
        except InvalidArgument as exc:
            return _FakeRequest(None, exc)


def run_fake(n, fn, timeout=60):
    """fn(team) on n simulated ranks; returns the results; re-raises a rank's error."""
    world = _FakeWorld(n)
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(FakeTeam(world, r))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[r] = exc
            world.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"{n} simulated ranks hung"
    real = [(r, e) for r, e in enumerate(errors)
            if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    if real:
        rank, exc = real[0]
        raise AssertionError(f"simulated rank {rank} of {n} failed: {exc!r}") from exc
    assert not any(errors), errors
    return results


class _NoPostTeam:
    """A team whose every post fails the test: checks must come before anything is posted."""

    def __init__(self, size, rank=0):
        self.size, self.rank = size, rank

    def alltoallv(self, *args, **kwargs):
        raise AssertionError("something was posted before the arguments were checked")

    alltoallv_rows = alltoallv_place = alltoallv


# -- 1. argument checks and layout, in this process ----------------------------------------------
def _dispatcher(**over):
    args = {"team": _NoPostTeam(4), "num_experts": 8, "hidden": 4, "max_tokens_per_rank": 5,
            "dtype": np.float32}
    args.update(over)
    return moe.Dispatcher(**args)


@pytest.mark.parametrize("over, pattern", [
    ({"num_experts": 6}, r"num_experts=6 does not split evenly over 4 ranks: use a multiple of 4"),
    ({"num_experts": 0}, r"num_experts must be a positive integer"),
    ({"hidden": 0}, r"hidden must be a positive integer"),
    ({"max_tokens_per_rank": -1}, r"max_tokens_per_rank must be a positive integer"),
    ({"hidden": 2.5}, r"hidden must be a positive integer"),
    ({"dtype": np.int32}, r"dtype .* not a supported payload: use float32, float16, bfloat16"),
])
def test_bad_dispatcher_arguments(over, pattern):
    with pytest.raises(InvalidArgument, match=pattern):
        _dispatcher(**over)


X = np.zeros((3, 4), np.float32)
IDX = np.array([[0, 7], [3, -1], [-1, -1]])
W = np.ones((3, 2), np.float32)


@pytest.mark.parametrize("x, idx, w, pattern", [
    (X, np.array([[0, 8], [1, 2], [3, 4]]), None,
     r"expert id\(s\) outside \[0, 8\); first at \[0, 1\] = 8"),
    (X, np.array([[0, 1], [-2, 2], [3, 4]]), None,
     r"outside \[0, 8\); first at \[1, 0\] = -2 .*-1"),
    (X, np.zeros((3, 9), np.int64), None, r"k=9 experts but there are only 8: use k <= 8"),
    (X, np.zeros((3, 0), np.int64), None, r"k >= 1"),
    (X, np.zeros(3, np.int64), None, r"topk_idx must be 2-D \[num_tokens, k\], got shape \(3,\)"),
    (X, np.zeros((2, 2), np.int64), None, r"topk_idx has 2 rows but x has 3 tokens"),
    (X, IDX.astype(np.float32), None, r"topk_idx must hold integer expert ids, not float32"),
    (np.zeros((3, 5), np.float32), IDX, None, r"x must be \[rows, hidden=4\], got shape \(3, 5\)"),
    (np.zeros(12, np.float32), IDX, None, r"x must be \[rows, hidden=4\]"),
    (np.zeros((6, 4), np.float32), np.zeros((6, 1), np.int64), None,
     r"x has 6 tokens but the Dispatcher was built for max_tokens_per_rank=5"),
    (X.astype(np.float64), IDX, None, r"x is float64 but the Dispatcher moves float32"),
    (X, IDX, np.ones((3, 1), np.float32),
     r"topk_weights has shape \(3, 1\) but topk_idx has \(3, 2\)"),
    (X, IDX, np.ones((3, 2), np.int32), r"topk_weights must be floating point, not int32"),
])
def test_bad_routing_is_refused_before_posting(x, idx, w, pattern):
    disp = _dispatcher()
    with pytest.raises(InvalidArgument, match=pattern):
        disp.dispatch(x, idx, w)


def test_bad_combine_arguments():
    world = _FakeWorld(1)
    disp = moe.Dispatcher(FakeTeam(world, 0), 4, 4, 5, np.float16)
    other = moe.Dispatcher(FakeTeam(world, 0), 4, 4, 5, np.float16)
    idx = np.where(IDX >= 0, IDX % 4, -1)  # experts 0 and 3; 3; none
    recv_x, _, _, handle = disp.dispatch(np.ones((3, 4), np.float16), idx)
    disp.team = _NoPostTeam(1)  # from here on nothing may be posted
    assert recv_x.shape == (2, 4), recv_x.shape
    with pytest.raises(InvalidArgument, match=r"y has 3 rows but dispatch delivered 2"):
        disp.combine(np.zeros((3, 4), np.float16), handle)
    with pytest.raises(InvalidArgument, match=r"y is float32 but the Dispatcher moves float16"):
        disp.combine(np.zeros((2, 4), np.float32), handle)
    with pytest.raises(InvalidArgument, match=r"handle must come from dispatch\(\) on this"):
        other.combine(np.zeros((2, 4), np.float16), handle)
    with pytest.raises(InvalidArgument, match=r"handle must come from"):
        disp.combine(recv_x, None)


def test_get_layout_matches_a_loop():
    rng = np.random.default_rng(7)
    num_experts, ranks, tokens = 12, 3, 50
    idx = rng.integers(-1, num_experts, (tokens, 4))
    idx[3] = [5, 5, 4, -1]  # one expert named twice: counted once
    idx[4] = -1  # no expert
    per_rank, per_expert, in_rank = moe.get_layout(idx, num_experts, ranks)
    want_rank, want_expert = np.zeros(ranks, np.int64), np.zeros(num_experts, np.int64)
    want_in = np.zeros((tokens, ranks), bool)
    for t in range(tokens):
        for e in set(idx[t].tolist()) - {-1}:
            want_expert[e] += 1
            want_in[t, e // (num_experts // ranks)] = True
    want_rank[:] = want_in.sum(axis=0)
    check_same(per_rank, want_rank, "num_tokens_per_rank")
    check_same(per_expert, want_expert, "num_tokens_per_expert")
    check_same(in_rank, want_in, "is_token_in_rank")
    disp = moe.Dispatcher(_NoPostTeam(ranks, 1), num_experts, 8, tokens, np.float32)
    for got, want in zip(disp.get_layout(idx), (want_rank, want_expert, want_in)):
        check_same(got, want, "Dispatcher.get_layout")
    with pytest.raises(InvalidArgument, match=r"outside \[0, 12\)"):
        disp.get_layout(idx + 1)


def test_bf16_rounding_is_nearest_even():
    rng = np.random.default_rng(3)
    f = rng.standard_normal(20000).astype(np.float32) * np.float32(1e3)
    ties = (rng.integers(0, 1 << 16, 64, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    ties = ties[np.isfinite(ties)]  # NaNs are checked apart: any quiet NaN will do
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, -3.3895314e38], np.float32)
    f = np.concatenate([f, ties, edges])
    got = moe._f32_to_bf16_bits(f).view(np.uint16)
    check_same(got, bf16_bits(f), "float32 -> bfloat16")
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001], np.uint32)
    nan = moe._f32_to_bf16_bits(nans.view(np.float32))  # rounding up must not carry out
    assert np.isnan(bf16_value(nan)).all(), nan


# -- 2. the Dispatcher on simulated ranks --------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_dispatch_combine_simulated_ranks(n, test_seed):
    done = run_fake(n, lambda team: run_cases(team, test_seed))
    assert done == [3 * 3 * len(ROUTINGS)] * n, done


@pytest.mark.timeout(30)
@pytest.mark.parametrize("payload", ["float16", "bfloat16"])
def test_two_byte_payloads_travel_as_raw_units(payload):
    """fp16 and bf16 rows cross as int16 units: NaN payloads, -0, infinities and subnormals
    arrive bit for bit (no float conversion on the way), in the caller's numpy dtype."""
    bits = np.array([0x7E01, 0xFE77, 0x8000, 0x0000, 0x7C00, 0xFC00, 0x0001, 0x83FF,
                     0x7F80, 0x3C00, 0xC000, 0x7FFF], np.uint16)
    user = np.dtype(np.uint16) if payload == "bfloat16" else np.dtype(np.float16)

    def rank(team):
        x = np.roll(bits, team.rank).reshape(3, 4).view(user)
        dest = (0, team.size // 2)  # ranks of tokens 0 and 1; token 2 has no expert
        idx = np.array([[0], [team.size], [-1]])
        disp = moe.Dispatcher(team, 2 * team.size, 4, 3, dispatcher_dtype(payload))
        recv_x, _, _, handle = disp.dispatch(x, idx)
        assert recv_x.dtype == user, recv_x.dtype
        mine = [t for t in (0, 1) if dest[t] == team.rank]
        want = np.concatenate([np.roll(bits, s).reshape(3, 4)[mine] for s in range(team.size)])
        check_same(recv_x.view(np.uint16), want, f"{payload} rank {team.rank}: raw rows")
        out = disp.combine(np.zeros_like(recv_x), handle)
        assert out.dtype == user and out.shape == (3, 4) and not out.view(np.uint16).any(), out
        return True

    for n in (1, 2):
        assert run_fake(n, rank) == [True] * n


@pytest.mark.timeout(30)
def test_recv_x_is_a_view_valid_until_the_next_dispatch():
    def rank(team):
        disp = moe.Dispatcher(team, 2, 3, 4, np.float32)
        first = disp.dispatch(np.full((2, 3), 1.0, np.float32), np.array([[0], [1]]))[0]
        kept = first.copy()
        disp.dispatch(np.full((2, 3), 2.0, np.float32), np.array([[0], [1]]))
        assert np.shares_memory(first, disp._recv), "recv_x must be a view of the buffer"
        assert (first == 2.0).all() and (kept == 1.0).all(), (first, kept)
        return True

    assert run_fake(2, rank) == [True, True]


def test_real_team_refuses_bad_routing_before_posting(ctx):
    def tag():
        req = ctx.world.barrier()
        req.wait(timeout=10)
        m = re.search(r"tag=(\d+)", repr(req))
        return int(m.group(1)) if m else None

    disp = moe.Dispatcher(ctx.world, 4, 8, 4, np.float32)
    before = tag()
    with pytest.raises(InvalidArgument, match="outside"):
        disp.dispatch(np.zeros((2, 8), np.float32), np.array([[0], [4]]))
    after = tag()
    if before is not None and after is not None:
        assert after == before + 1, f"a refused dispatch posted something: {before} -> {after}"
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    recv_x, recv_idx, recv_w, handle = disp.dispatch(x, np.array([[3, 1], [-1, -1]]),
                                                     np.array([[0.5, 0.25], [1, 1]], np.float32))
    check_same(recv_x, x[:1], "1-rank recv_x")
    check_same(recv_idx, np.array([[3, 1]]), "1-rank recv_topk_idx")
    check_same(recv_w, np.array([[0.5, 0.25]], np.float32), "1-rank recv_topk_weights")
    out = disp.combine(recv_x * 2, handle)
    check_same(out, np.concatenate([x[:1] * 2, np.zeros((1, 8), np.float32)]), "1-rank out")


# -- 3. real multi-rank jobs ---------------------------------------------------------------------
RANKS = REF + r'''
seed = int(os.environ["MOE_SEED"])
ctx = ol.init()
done = run_cases(ctx.world, seed)
if size >= 3:  # a sub-team (members in non-sorted order) next to idle ranks
    members = list(range(size - 1, -1, -2))
    sub = ctx.create_team(members)
    if sub is not None:
        run_cases(sub, seed + 1, payloads=("float32",))
    ctx.world.barrier().wait(timeout=60)
ctx.close()
print(f"ok {done}")
'''


@pytest.mark.parametrize("n", [
    pytest.param(1, marks=pytest.mark.timeout(60)),
    pytest.param(2, marks=pytest.mark.timeout(60)),
    pytest.param(3, marks=pytest.mark.timeout(60)),
    pytest.param(4, marks=pytest.mark.timeout(90)),
    pytest.param(8, marks=pytest.mark.timeout(120)),
])
def test_dispatch_combine_team_size(n, test_seed):
    """fp32/fp16/bf16 x k in {1, 2, 8} x random/skewed/packed/no-expert routing through one
    Dispatcher per payload, two handles outstanding, and a sub-team: one job of n ranks."""
    out = run_ranks(n, RANKS, timeout={8: 100, 4: 75}.get(n, 50),
                    env={"MOE_SEED": str(test_seed)})
    for r in range(n):
        assert out[r].splitlines()[-1] == f"ok {3 * 3 * len(ROUTINGS)}", out[r]


@pytest.mark.timeout(60)
def test_example_moe_layer_4_ranks():
    with open(EXAMPLE, encoding="utf-8") as f:
        out = run_ranks(4, f.read(), timeout=50)
    for r in range(4):
        assert re.search(rf"rank {r}/4: MoE layer on \d+ tokens matches", out[r]), out[r]


TORCH = REF + r'''
import torch
seed = int(os.environ["MOE_SEED"])
ctx = ol.init()
team = ctx.world
n, me = team.size, team.rank
E = num_experts_for(n)
for payload, tdt in (("float32", torch.float32), ("float16", torch.float16),
                     ("bfloat16", torch.bfloat16)):
    disp = moe.Dispatcher(team, E, HIDDEN, MAX_TOKENS, tdt)
    for k, routing in ((2, "random"), (8, "packed"), (1, "none")):
        inputs = [make_inputs(seed, n, s, E, k, payload, routing, True, k) for s in range(n)]
        x, idx, w = inputs[me]
        tx = torch.from_numpy(x.view(np.int16) if payload == "bfloat16" else x)
        if payload == "bfloat16":
            tx = tx.view(torch.bfloat16)
            tw = torch.from_numpy(w).to(torch.bfloat16)
        else:
            tw = torch.from_numpy(w)
        recv_x, recv_idx, recv_w, handle = disp.dispatch(tx, torch.from_numpy(idx), tw)
        assert recv_x.dtype == tdt and recv_idx.dtype == torch.int64 and recv_w.dtype == tw.dtype
        want_x, want_idx, want_w, want_out = reference(inputs, me, n, E, payload)
        raw = recv_x.view(torch.int16).numpy().view(want_x.dtype) if payload == "bfloat16" \
            else recv_x.numpy()
        check_same(raw, want_x, f"torch {payload} k={k}: recv_x")
        check_same(recv_idx.numpy(), want_idx, f"torch {payload} k={k}: recv_topk_idx")
        check_same(recv_w.float().numpy(), want_w, f"torch {payload} k={k}: recv_topk_weights")
        y = expert_output(raw, recv_idx.numpy(), recv_w.float().numpy(), disp.first_local_expert,
                          payload)
        ty = torch.from_numpy(y.view(np.int16)).view(tdt) if payload == "bfloat16" \
            else torch.from_numpy(y)
        out = disp.combine(ty, handle)
        assert isinstance(out, torch.Tensor) and out.dtype == tdt, out
        got = out.numpy() if payload != "bfloat16" else \
            out.view(torch.int16).numpy().view(np.uint16)
        check_same(got, want_out, f"torch {payload} k={k}: combine")
    r_, e_, i_ = disp.get_layout(torch.from_numpy(idx))
    assert isinstance(i_, torch.Tensor) and i_.dtype == torch.bool
assert disp.dispatch(tx, torch.from_numpy(idx))[2] is None
# combine's float32 -> bfloat16 rounding agrees with torch's
f = torch.randn(50000, generator=torch.Generator().manual_seed(seed)) * 1e3
theirs = f.to(torch.bfloat16).view(torch.int16).numpy()
check_same(moe._f32_to_bf16_bits(f.numpy()), theirs, "float32 -> bfloat16 against torch")
# a tensor that requires grad is read through a detached view
disp = moe.Dispatcher(team, E, HIDDEN, MAX_TOKENS, torch.float32)
x, idx, w = make_inputs(seed, n, me, E, 2, "float32", "random")
tx = torch.from_numpy(x).requires_grad_()
recv_x = disp.dispatch(tx, torch.from_numpy(idx), torch.from_numpy(w))[0]
check_same(recv_x.numpy(), reference([make_inputs(seed, n, s, E, 2, "float32", "random")
                                      for s in range(n)], me, n, E, "float32")[0], "grad tensor")
ctx.close()
print("ok")
'''


@pytest.mark.timeout(60)
def test_torch_cpu_tensors(test_seed):
    pytest.importorskip("torch")
    out = run_ranks(3, TORCH, timeout=50, env={"MOE_SEED": str(test_seed)})
    assert all(o.splitlines()[-1] == "ok" for o in out), out


