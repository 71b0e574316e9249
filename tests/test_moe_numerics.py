"""combine's host-side sums (offload_lib/moe.py's sum_slots, bench/moe.py's sum_rows)
against loops: every contribution in order, half precision added in float32, stale rows
never leaking in."""
from __future__ import annotations

import numpy as np
import pytest

from offload_lib import moe
from offload_lib.bench import moe as bench_moe

@pytest.mark.parametrize("payload", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", ["top2", "sparse-tail", "sparse-first", "none"])
def test_sum_slots_matches_a_loop(payload, shape):
    """combine's sum over the placed table: slot c of token t holds its c-th contribution;
    stale rows (from an earlier combine) past a token's count never leak into its sum, in
    the dense (zeroed, then one add) and the sparse (added where present) cases."""
    rng = np.random.default_rng(12)
    num_tokens, hidden, stride, depth = 41, 6, 50, 4
    counts = {"top2": rng.choice([1, 2, 2, 2], num_tokens),
              "sparse-tail": rng.choice([1, 1, 1, 2, 3, 4], num_tokens),
              "sparse-first": rng.choice([0, 0, 0, 1], num_tokens),
              "none": np.zeros(num_tokens, np.int64)}[shape]
    wire = np.int16 if payload == "bfloat16" else np.dtype(payload)
    vals = rng.integers(-60, 60, (depth * stride, hidden)).astype(np.float32)
    table = (moe._f32_to_bf16_bits(vals) if payload == "bfloat16" else vals.astype(wire))
    table = np.ascontiguousarray(table)
    want = np.zeros((num_tokens, hidden), np.float64 if payload == "float64" else np.float32)
    for t in range(num_tokens):
        for c in range(int(counts[t])):
            want[t] += vals[c * stride + t]
    got = moe.sum_slots(table, counts, stride, payload)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("payload", ["float16", "bfloat16"])
def test_sum_slots_accumulates_in_float32(payload):
    """Half-precision contributions are added in float32 and rounded once (at the end, by
    combine): three of 30000 make 90000, past float16's range, and 1 + 2**-11 + 2**-11 keeps
    the bits each addend alone would round away."""
    stride, hidden = 2, 2
    vals = np.array([[30000, 1], [0, 0], [30000, 2**-11], [0, 0], [30000, 2**-11], [0, 0]],
                    np.float32)
    table = moe._f32_to_bf16_bits(vals) if payload == "bfloat16" else vals.astype(np.float16)
    got = moe.sum_slots(table, np.array([3, 0]), stride, payload)
    widened = (moe._bf16_bits_to_f32(table) if payload == "bfloat16"
               else table.astype(np.float32)).reshape(3, stride, hidden)[:, 0]
    np.testing.assert_array_equal(got[0], widened.sum(axis=0, dtype=np.float32))
    assert got[0, 0] > 65504 and (got[1] == 0).all(), got


@pytest.mark.parametrize("payload", ["float32", "float16", "bfloat16", "float64"])
def test_sum_rows_matches_a_loop(payload):
    """combine's sum: every token's rows added in row order; tokens with no row are zero."""
    rng = np.random.default_rng(11)
    num_tokens, hidden = 37, 5
    # rows grouped by source rank, each group in token order, as combine receives them
    groups = [np.sort(rng.choice(num_tokens, size, replace=False)) for size in (0, 20, 37, 9)]
    tokens = np.concatenate(groups).astype(np.int64)
    wire = np.int16 if payload == "bfloat16" else np.dtype(payload)
    back = np.zeros((tokens.size + 1, hidden), wire)
    vals = rng.integers(-60, 60, (tokens.size, hidden)).astype(np.float32)
    if payload == "bfloat16":
        back[:-1] = moe._f32_to_bf16_bits(vals)
    else:
        back[:-1] = vals
    want = np.zeros((num_tokens, hidden), np.float64 if payload == "float64" else np.float32)
    for i, t in enumerate(tokens.tolist()):
        want[t] += vals[i]
    scratch = np.full((num_tokens, hidden), 99, wire)  # stale contents must not leak in
    got = bench_moe.sum_rows(back, tokens, num_tokens, payload, scratch)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    empty = bench_moe.sum_rows(back[:1] * 0, tokens[:0], num_tokens, payload, scratch)
    np.testing.assert_array_equal(empty, np.zeros_like(want))
