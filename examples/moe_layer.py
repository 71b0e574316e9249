"""A small mixture-of-experts layer over the offloaded dispatch/combine, checked on every rank.

    dpa-offload run -n 4 -- python examples/moe_layer.py

All ranks build the same router and experts from one seed, so each rank can also compute the
layer for its own tokens alone, with every expert's weights: that is the reference. The
distributed layer routes (top-k of a softmax), dispatches each token to the ranks holding its
experts, runs the local experts there (numpy matmuls), and combines the weighted outputs back.
"""
import numpy as np

import offload_lib as ol
from offload_lib import moe

HIDDEN, FFN = 64, 128
EXPERTS_PER_RANK, TOP_K = 2, 2
MAX_TOKENS = 128
SEED = 1234


def make_weights(num_experts):
    """Router [hidden, experts] and each expert's two-layer MLP; identical on every rank."""
    rng = np.random.default_rng(SEED)
    router = rng.standard_normal((HIDDEN, num_experts), dtype=np.float32) / np.sqrt(HIDDEN)
    w1 = rng.standard_normal((num_experts, HIDDEN, FFN), dtype=np.float32) / np.sqrt(HIDDEN)
    w2 = rng.standard_normal((num_experts, FFN, HIDDEN), dtype=np.float32) / np.sqrt(FFN)
    return router, w1, w2


def route(x, router):
    """Top-k experts and their renormalised softmax weights; a weak second choice is dropped
    (-1), the way capacity-limited routers drop slots."""
    logits = x @ router
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    topk = np.argsort(-p, axis=1)[:, :TOP_K]
    weights = np.take_along_axis(p, topk, axis=1)
    weights /= weights.sum(axis=1, keepdims=True)
    topk[weights < 0.2] = -1
    return topk.astype(np.int64), weights.astype(np.float32)


def expert(x, w1, w2):
    return np.maximum(x @ w1, 0) @ w2


def run_local_experts(recv_x, recv_idx, recv_w, w1, w2, first):
    """y[row] = sum_j w[row, j] * expert[first + idx[row, j]](x[row]) over this rank's experts."""
    y = np.zeros_like(recv_x)
    for local in range(EXPERTS_PER_RANK):
        rows, slots = np.nonzero(recv_idx == local)
        if rows.size:
            e = first + local
            y[rows] += recv_w[rows, slots, None] * expert(recv_x[rows], w1[e], w2[e])
    return y


def reference_layer(x, topk, weights, w1, w2):
    """The same layer on one rank, with every expert's weights."""
    out = np.zeros_like(x)
    for e in range(w1.shape[0]):
        rows, slots = np.nonzero(topk == e)
        if rows.size:
            out[rows] += weights[rows, slots, None] * expert(x[rows], w1[e], w2[e])
    return out


with ol.init() as ctx:
    team = ctx.world
    num_experts = EXPERTS_PER_RANK * team.size
    router, w1, w2 = make_weights(num_experts)
    tokens = MAX_TOKENS - (16 * team.rank) % MAX_TOKENS  # uneven batches across ranks
    x = np.random.default_rng([SEED, team.rank]).standard_normal((tokens, HIDDEN), dtype=np.float32)

    dispatcher = moe.Dispatcher(team, num_experts, HIDDEN, MAX_TOKENS, np.float32)
    topk, weights = route(x, router)
    per_rank, _per_expert, _in_rank = dispatcher.get_layout(topk)
    recv_x, recv_idx, recv_w, handle = dispatcher.dispatch(x, topk, weights)
    y = run_local_experts(recv_x, recv_idx, recv_w, w1, w2, dispatcher.first_local_expert)
    out = dispatcher.combine(y, handle)

    ref = reference_layer(x, topk, weights, w1, w2)
    err = float(np.abs(out - ref).max()) if out.size else 0.0
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5,
                               err_msg=f"rank {team.rank}: MoE output differs from the reference")
    dropped = int((topk < 0).sum())
    print(f"rank {team.rank}/{team.size}: MoE layer on {tokens} tokens matches the one-rank "
          f"reference (max |diff| {err:.1e}); sent {per_rank.tolist()} rows per rank, received "
          f"{recv_x.shape[0]} for experts {dispatcher.first_local_expert}.."
          f"{dispatcher.first_local_expert + EXPERTS_PER_RANK - 1}; {dropped} slot(s) dropped")
