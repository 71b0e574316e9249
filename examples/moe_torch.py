"""A torch mixture-of-experts layer over the offloaded dispatch/combine, checked on every rank.

    dpa-offload run -n 4 -- python examples/moe_torch.py

Tensors live on the GPU where torch sees one (the Dispatcher then stages them, or registers
them for GPUDirect on a card) and on the CPU otherwise. All ranks build the same router and
experts from one seed, so each rank also computes the layer for its own tokens alone, with
every expert: that is the reference the distributed output must match.
"""
import torch

import offload_lib as ol
from offload_lib import moe

HIDDEN, FFN = 64, 128
EXPERTS_PER_RANK, TOP_K = 2, 2
MAX_TOKENS = 128
SEED = 1234


class Experts(torch.nn.Module):
    """Every expert's two-layer MLP; identical on every rank (same seed)."""

    def __init__(self, num_experts: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(SEED)
        self.router = torch.nn.Parameter(torch.randn(HIDDEN, num_experts, generator=g) / HIDDEN ** 0.5)
        self.w1 = torch.nn.Parameter(torch.randn(num_experts, HIDDEN, FFN, generator=g) / HIDDEN ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(num_experts, FFN, HIDDEN, generator=g) / FFN ** 0.5)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k of a softmax, renormalised; a weak second choice is dropped (-1)."""
        p = torch.softmax(x @ self.router, dim=1)
        weights, topk = torch.topk(p, TOP_K, dim=1)
        weights = weights / weights.sum(dim=1, keepdim=True)
        topk = torch.where(weights < 0.2, torch.full_like(topk, -1), topk)
        return topk, weights

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1[e]) @ self.w2[e]

    def run_local(self, recv_x, recv_idx, recv_w, first: int) -> torch.Tensor:
        """y[row] = sum_j w[row, j] * expert[first + idx[row, j]](x[row]) over local experts."""
        y = torch.zeros_like(recv_x)
        for local in range(EXPERTS_PER_RANK):
            rows, slots = torch.nonzero(recv_idx == local, as_tuple=True)
            if rows.numel():
                y[rows] += recv_w[rows, slots, None] * self.expert(first + local, recv_x[rows])
        return y

    def reference(self, x, topk, weights) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in range(self.w1.shape[0]):
            rows, slots = torch.nonzero(topk == e, as_tuple=True)
            if rows.numel():
                out[rows] += weights[rows, slots, None] * self.expert(e, x[rows])
        return out


with ol.init() as ctx, torch.no_grad():
    team = ctx.world
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    num_experts = EXPERTS_PER_RANK * team.size
    layer = Experts(num_experts).to(device)
    tokens = MAX_TOKENS - (16 * team.rank) % MAX_TOKENS  # uneven batches across ranks
    g = torch.Generator().manual_seed(SEED + team.rank)
    x = torch.randn(tokens, HIDDEN, generator=g).to(device)

    dispatcher = moe.Dispatcher(team, num_experts, HIDDEN, MAX_TOKENS, torch.float32)
    topk, weights = layer.route(x)
    recv_x, recv_idx, recv_w, handle = dispatcher.dispatch(x, topk, weights)
    y = layer.run_local(recv_x, recv_idx, recv_w, dispatcher.first_local_expert)
    out = dispatcher.combine(y, handle)

    ref = layer.reference(x, topk, weights)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"rank {team.rank}: MoE output differs: {m}")
    err = float((out - ref).abs().max()) if out.numel() else 0.0
    print(f"rank {team.rank}/{team.size}: torch MoE layer on {tokens} tokens ({device}) matches "
          f"the one-rank reference (max |diff| {err:.1e}); received {recv_x.shape[0]} rows; "
          f"gpu path: {ctx.stats()['gpu']['path']}")
