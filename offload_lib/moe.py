"""MoE token dispatch and combine over a team's all-to-all-v (DeepEP-like semantics).

    from offload_lib import moe
    d = moe.Dispatcher(ctx.world, num_experts=64, hidden=1024, max_tokens_per_rank=512,
                       dtype=np.float32)
    recv_x, recv_idx, recv_w, handle = d.dispatch(x, topk_idx, topk_weights)
    y = ...  # y[row] = sum_j recv_w[row, j] * expert[recv_idx[row, j]](recv_x[row]), idx >= 0
    out = d.combine(y, handle)   # out[t] = sum_k w_k * expert_k(x[t])

Experts are split evenly: expert e lives on rank e // (num_experts // size). A token goes once
to each rank that holds at least one of its top-k experts.

The host's share is the routing arithmetic: which rows go where (a few numpy passes over
``topk_idx``, no Python loop over tokens) and one gather of the token rows into the send buffer.
The bytes then move by two all-to-all-v in dispatch (token rows; per-row routing metadata) and
one in combine, each with its counts exchanged by the DPA, never by the host.

Payloads travel as raw integer units of the payload's size (int16 for float16 and bfloat16), so
bfloat16, which numpy lacks, takes the same path as float16. numpy callers pass bfloat16 as
uint16/int16 arrays of bit patterns (or an ``ml_dtypes`` bfloat16 array); torch callers pass
``torch.bfloat16`` tensors. Combine adds in float32 (float64 for float64 payloads), in rank order,
then rounds once to the payload type (round to nearest even for bfloat16).
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from offload_lib.errors import InvalidArgument, OffloadError, brief

__all__ = ["Dispatcher", "Handle", "get_layout"]


class _Payload(NamedTuple):
    name: str  # numpy / torch dtype name
    wire: np.dtype  # the raw unit that all-to-all-v moves
    acc: np.dtype  # combine accumulates in this


_PAYLOADS = {
    "float16": _Payload("float16", np.dtype(np.int16), np.dtype(np.float32)),
    "bfloat16": _Payload("bfloat16", np.dtype(np.int16), np.dtype(np.float32)),
    "float32": _Payload("float32", np.dtype(np.int32), np.dtype(np.float32)),
    "float64": _Payload("float64", np.dtype(np.int64), np.dtype(np.float64)),
}


def _payload(dtype: Any) -> _Payload:
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        name = "bfloat16"
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    if name not in _PAYLOADS:
        raise InvalidArgument(
            f"dtype {brief(dtype)} is not a supported payload: use float32, float16, bfloat16 "
            "(torch.bfloat16, or the string 'bfloat16' for uint16 bit patterns) or float64"
        )
    return _PAYLOADS[name]


def _is_torch(obj: Any) -> bool:
    return hasattr(obj, "data_ptr") and not isinstance(obj, np.ndarray)


def _torch() -> Any:
    import torch  # only reached when the caller passed a tensor

    return torch


def _torch_cpu(t: Any, name: str) -> Any:
    if t.device.type != "cpu":
        raise InvalidArgument(f"{name} is on {t.device}: pass a CPU tensor ({name}.cpu())")
    return t.detach()


def _as_array(obj: Any, name: str) -> np.ndarray:
    """A numpy view of ``obj`` (no copy for numpy arrays and torch CPU tensors)."""
    if isinstance(obj, np.ndarray):
        return obj
    if _is_torch(obj):
        t = _torch_cpu(obj, name)
        if str(t.dtype) == "torch.bfloat16":
            t = t.view(_torch().int16)
        return t.numpy()
    try:
        return np.asarray(obj)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"{name} ({type(obj).__name__}) is not an array: pass a numpy array or a torch "
            "CPU tensor"
        ) from None


# -- GPU arrays ------------------------------------------------------------------------------
# A Dispatcher given torch CUDA tensors or cupy arrays moves the token rows through the
# staged GPU path (offload_lib._staging) and returns them on the device. The routing, small,
# is worked out on the host; results go back to the device through the caller's library,
# which is imported already since the caller passed its arrays.
def _gpu_kind(obj: Any) -> str | None:
    if getattr(obj, "is_cuda", False) and hasattr(obj, "data_ptr"):
        return "torch"
    try:
        cai = hasattr(obj, "__cuda_array_interface__")
    except Exception:
        cai = False
    if not cai:
        return None
    return "cupy" if type(obj).__module__.split(".")[0] == "cupy" else "other"


def _gpu_lib(obj: Any) -> Any:
    return sys.modules[type(obj).__module__.split(".")[0]]


def _to_host(obj: Any, name: str) -> Any:
    kind = _gpu_kind(obj)
    if kind == "torch":
        return obj.detach().cpu()
    if kind == "cupy":
        return obj.get()
    if kind:
        raise InvalidArgument(f"{name} is GPU memory of {type(obj).__name__}: pass a torch "
                              "tensor, a cupy array or host memory")
    return obj


def _to_device(arr: np.ndarray, like: Any) -> Any:
    if _gpu_kind(like) == "torch":
        return _torch().from_numpy(arr).to(like.device)
    with like.device:  # cupy: allocate on like's device, not the current one
        return _gpu_lib(like).asarray(arr)


def _gpu_view(obj: Any, dtype: np.dtype) -> Any:
    """The same GPU memory reinterpreted as ``dtype`` elements."""
    if _gpu_kind(obj) == "torch":
        return obj.view(getattr(_torch(), dtype.name))
    return obj.view(dtype)


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    wide = bits.view(np.uint16).astype(np.uint32)
    wide <<= 16  # in place: a third of the time of a shift into a new array
    return wide.view(np.float32)


def _f32_to_bf16_bits(f: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16, ties to even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    rounded = np.where(np.isnan(f), np.uint32(0x7FC0), rounded)
    return rounded.astype(np.uint16).view(np.int16)


# -- routing -----------------------------------------------------------------------------------
def _check_routing(topk_idx: Any, num_experts: int, num_tokens: int | None = None) -> np.ndarray:
    """``topk_idx`` as int64 [num_tokens, k], checked; raises InvalidArgument saying what to fix."""
    idx = _as_array(topk_idx, "topk_idx")
    if idx.ndim != 2:
        raise InvalidArgument(
            f"topk_idx must be 2-D [num_tokens, k], got shape {idx.shape}")
    if idx.dtype.kind not in "iu":
        raise InvalidArgument(f"topk_idx must hold integer expert ids, not {idx.dtype}")
    tokens, k = idx.shape
    if num_tokens is not None and tokens != num_tokens:
        raise InvalidArgument(
            f"topk_idx has {tokens} rows but x has {num_tokens} tokens: one row of expert ids "
            "per token")
    if k < 1:
        raise InvalidArgument(
            "topk_idx has no columns: route each token to k >= 1 experts (-1 drops one)")
    if k > num_experts:
        raise InvalidArgument(
            f"topk_idx routes each token to k={k} experts but there are only {num_experts}: "
            f"use k <= {num_experts}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size:
        bad = np.flatnonzero((idx < -1) | (idx >= num_experts))
        if bad.size:
            t, j = divmod(int(bad[0]), k)
            raise InvalidArgument(
                f"topk_idx has {bad.size} expert id(s) outside [0, {num_experts}); first at "
                f"[{t}, {j}] = {int(idx[t, j])} (use -1 to drop an expert slot)")
    return idx


def _owners(idx: np.ndarray, per_rank: int, size: int) -> np.ndarray:
    """Rank holding each routed expert; ``size`` (one past the last rank) for dropped slots."""
    return np.where(idx >= 0, idx // per_rank, size)


def _token_in_rank(owners: np.ndarray, size: int) -> np.ndarray:
    """[num_tokens, size + 1] bool: column r says the token has an expert on rank r."""
    hit = np.zeros((owners.shape[0], size + 1), dtype=bool)
    hit[np.arange(owners.shape[0])[:, None], owners] = True
    return hit


def get_layout(topk_idx: Any, num_experts: int, num_ranks: int) -> tuple[Any, Any, Any]:
    """Where the tokens of ``topk_idx`` go, like DeepEP's ``get_dispatch_layout``.

    Returns ``(num_tokens_per_rank [num_ranks], num_tokens_per_expert [num_experts],
    is_token_in_rank [num_tokens, num_ranks] bool)``; counts are int64. A token counts once per
    rank and once per expert however many of its slots name them; -1 slots count nowhere.
    torch tensors in, torch tensors out.
    """
    if num_ranks < 1 or num_experts < 1 or num_experts % num_ranks:
        raise InvalidArgument(
            f"num_experts={num_experts} must be a positive multiple of num_ranks={num_ranks}")
    idx = _check_routing(topk_idx, num_experts)
    owners = _owners(idx, num_experts // num_ranks, num_ranks)
    in_rank = np.ascontiguousarray(_token_in_rank(owners, num_ranks)[:, :num_ranks])
    per_rank = in_rank.sum(axis=0, dtype=np.int64)
    # One count per (token, expert) pair, duplicates within a token removed.
    ordered = np.sort(idx, axis=1)
    first = np.ones(ordered.shape, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    per_expert = np.bincount(ordered[first & (ordered >= 0)], minlength=num_experts)
    per_expert = per_expert.astype(np.int64)
    if _is_torch(topk_idx):
        torch = _torch()
        return torch.from_numpy(per_rank), torch.from_numpy(per_expert), torch.from_numpy(in_rank)
    return per_rank, per_expert, in_rank


# -- the dispatcher ----------------------------------------------------------------------------
class Handle:
    """What ``combine`` needs to send rows back and add them up; returned by ``dispatch``."""

    __slots__ = ("dispatcher", "num_tokens", "recv_rows", "send_rows", "recv_place",
                 "contributions")

    def __init__(self, dispatcher: Dispatcher, num_tokens: int, send_rows: np.ndarray,
                 recv_rows: np.ndarray, recv_place: np.ndarray,
                 contributions: np.ndarray) -> None:
        self.dispatcher = dispatcher
        self.num_tokens = num_tokens
        self.send_rows = send_rows  # rows sent to each rank
        self.recv_rows = recv_rows  # rows received from each rank
        # combine: where each received row goes back to (its source's slot c, token t:
        # row c * max_tokens_per_rank + t of the source's combine table)
        self.recv_place = recv_place
        self.contributions = contributions  # ranks each of our tokens went to

    @property
    def num_recv_rows(self) -> int:
        return int(self.recv_rows.sum())

    def __repr__(self) -> str:
        return (f"<moe.Handle tokens={self.num_tokens} sent={self.send_rows.tolist()} "
                f"received={self.recv_rows.tolist()}>")


class Dispatcher:
    """Dispatch tokens to the ranks holding their experts and combine the results back.

    All ranks of ``team`` build it with the same arguments and call ``dispatch``/``combine`` in
    the same order (they are collectives), with the same ``k`` and all passing ``topk_weights``
    or all ``None``. Each call blocks until its all-to-all-v completed.

    Buffers are allocated once here (``ctx.empty`` job-shared memory on a real team, so peers'
    DPA threads copy straight into them) and reused by every call: ``recv_x`` returned by
    ``dispatch`` is a VIEW of the receive buffer, valid until the next ``dispatch`` on this
    Dispatcher (copy it to keep it); ``recv_topk_idx``, ``recv_topk_weights`` and ``combine``'s
    output are new arrays. ``y`` may be ``recv_x`` itself, modified in place.
    """

    def __init__(self, team: Any, num_experts: int, hidden: int, max_tokens_per_rank: int,
                 dtype: Any) -> None:
        if not all(hasattr(team, a) for a in ("size", "rank", "alltoallv_rows")):
            raise InvalidArgument(f"team must be a Team (ctx.world, ctx.create_team(...)), "
                                  f"got {brief(team)}")
        size, rank = int(team.size), int(team.rank)
        for name, value in (("num_experts", num_experts), ("hidden", hidden),
                            ("max_tokens_per_rank", max_tokens_per_rank)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {brief(value)}")
        if num_experts % size:
            raise InvalidArgument(
                f"num_experts={num_experts} does not split evenly over {size} ranks: "
                f"use a multiple of {size}")
        self.team = team
        self.size, self.rank = size, rank
        self.num_experts = int(num_experts)
        self.hidden = int(hidden)
        self.max_tokens_per_rank = int(max_tokens_per_rank)
        self.num_local_experts = self.num_experts // size
        self.first_local_expert = rank * self.num_local_experts
        self._payload = _payload(dtype)
        self.dtype = self._payload.name
        max_rows = size * self.max_tokens_per_rank  # sent by one rank, or received by one
        # combine's table: row c * max_tokens_per_rank + t holds the c-th rank's output for
        # token t (a token goes to at most `size` ranks), placed there by the DPA
        self._stage = self._alloc(max_rows * self.hidden, self._payload.wire)
        self._recv = self._alloc(max_rows * self.hidden, self._payload.wire)
        self._recv_gpu: Any = None  # dispatch's receive buffer on the GPU, made on first use
        self._meta_width = 0
        self._meta_send = self._meta_recv = np.empty(0, np.int64)

    def __repr__(self) -> str:
        return (f"<moe.Dispatcher rank={self.rank}/{self.size} experts={self.num_experts} "
                f"hidden={self.hidden} max_tokens={self.max_tokens_per_rank} {self.dtype}>")

    def _alloc(self, count: int, dtype: np.dtype) -> np.ndarray:
        ctx = getattr(self.team, "_ctx", None)
        if ctx is not None and hasattr(ctx, "empty"):
            return ctx.empty(count, dtype)
        return np.empty(count, dtype)

    def _meta_buffers(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        # Sized by the first k seen (metadata is small); regrown only if k grows.
        if width > self._meta_width:
            count = self.size * self.max_tokens_per_rank * width
            self._meta_send = self._alloc(count, np.dtype(np.int64))
            self._meta_recv = self._alloc(count, np.dtype(np.int64))
            self._meta_width = width
        return self._meta_send, self._meta_recv

    def get_layout(self, topk_idx: Any) -> tuple[Any, Any, Any]:
        """``get_layout(topk_idx, num_experts, team size)``: tokens per rank, per expert, and
        which ranks each token goes to."""
        return get_layout(topk_idx, self.num_experts, self.size)

    # -- argument checks -------------------------------------------------------------------------
    def _rows(self, obj: Any, name: str) -> np.ndarray:
        """``obj`` as [rows, hidden] of the payload, viewed as raw wire units (no copy)."""
        if _is_torch(obj):
            want = self._payload.name
            got = str(obj.dtype).removeprefix("torch.")
            if got != want:
                raise InvalidArgument(f"{name} is torch.{got} but the Dispatcher moves {want}: "
                                      f"pass {name}.to(torch.{want})")
        a = _as_array(obj, name)
        if a.ndim != 2 or a.shape[1] != self.hidden:
            raise InvalidArgument(
                f"{name} must be [rows, hidden={self.hidden}], got shape {a.shape}")
        ok = a.dtype.name == self._payload.name
        if self._payload.name == "bfloat16":
            ok = ok or a.dtype in (np.dtype(np.uint16), np.dtype(np.int16))
        if not ok:
            hint = ("uint16 bfloat16 bit patterns" if self._payload.name == "bfloat16"
                    else self._payload.name)
            raise InvalidArgument(
                f"{name} is {a.dtype} but the Dispatcher moves {self._payload.name}: pass {hint}")
        return a.view(self._payload.wire)

    def _gpu_rows(self, obj: Any, name: str) -> Any:
        """Check GPU rows [rows, hidden] of the payload; returns them as torch or cupy."""
        kind = _gpu_kind(obj)
        if kind == "other":
            raise InvalidArgument(f"{name} is GPU memory of {type(obj).__name__}: the "
                                  "Dispatcher takes torch CUDA tensors or cupy arrays")
        shape = tuple(int(d) for d in obj.shape)
        if len(shape) != 2 or shape[1] != self.hidden:
            raise InvalidArgument(f"{name} must be [rows, hidden={self.hidden}], got shape {shape}")
        got = str(obj.dtype).removeprefix("torch.")
        if got != self._payload.name:
            raise InvalidArgument(f"{name} is {got} but the Dispatcher moves {self._payload.name}")
        return obj

    def _gpu_recv(self, x: Any) -> Any:
        """Dispatch's receive buffer on x's device, made once like the host one."""
        rows = self.size * self.max_tokens_per_rank
        buf = self._recv_gpu
        if buf is None or getattr(buf, "device", None) != getattr(x, "device", None):
            if _gpu_kind(x) == "torch":
                buf = _torch().empty((rows, self.hidden), dtype=x.dtype, device=x.device)
            else:
                buf = _gpu_lib(x).empty((rows, self.hidden), x.dtype)
            self._recv_gpu = buf
        return buf

    def _weights(self, topk_weights: Any, shape: tuple[int, ...]) -> np.ndarray:
        if _is_torch(topk_weights):
            t = _torch_cpu(topk_weights, "topk_weights")
            if not t.dtype.is_floating_point:
                raise InvalidArgument(f"topk_weights must be floating point, not {t.dtype}")
            w = t.to(_torch().float64).numpy()
        else:
            w = _as_array(topk_weights, "topk_weights")
            if w.dtype.kind != "f":
                raise InvalidArgument(f"topk_weights must be floating point, not {w.dtype}")
        if w.shape != shape:
            raise InvalidArgument(
                f"topk_weights has shape {w.shape} but topk_idx has {shape}: one weight per slot")
        return w.astype(np.float64, copy=False)

    # -- dispatch ----------------------------------------------------------------------------
    def dispatch(self, x: Any, topk_idx: Any, topk_weights: Any = None
                 ) -> tuple[Any, Any, Any, Handle]:
        """Send each token of ``x`` [num_tokens, hidden] once to every rank holding one of its
        experts (``topk_idx`` [num_tokens, k], -1 = dropped slot; ``topk_weights`` same shape).

        Returns ``(recv_x [rows, hidden], recv_topk_idx [rows, k] int64, recv_topk_weights
        [rows, k] or None, handle)``: rows grouped by source rank in source token order;
        ``recv_topk_idx`` holds LOCAL expert indices on this rank, -1 where the expert is
        elsewhere or dropped (weight 0 there). ``recv_x`` is a view valid until the next
        dispatch. Outputs are torch tensors when ``x`` is one.
        """
        gpu = _gpu_kind(x) is not None
        xr = self._gpu_rows(x, "x") if gpu else self._rows(x, "x")
        topk_idx = _to_host(topk_idx, "topk_idx")
        topk_weights = _to_host(topk_weights, "topk_weights")
        tokens = int(xr.shape[0])
        if tokens > self.max_tokens_per_rank:
            raise InvalidArgument(
                f"x has {tokens} tokens but the Dispatcher was built for max_tokens_per_rank="
                f"{self.max_tokens_per_rank}: split the batch or build a larger Dispatcher")
        idx = _check_routing(topk_idx, self.num_experts, tokens)
        k = idx.shape[1]
        w = None if topk_weights is None else self._weights(topk_weights, idx.shape)
        w_dtype = None if w is None else _weights_dtype(topk_weights)

        # Layout: the rows to send, grouped by destination rank, each group in token order.
        owners = _owners(idx, self.num_local_experts, self.size)
        in_rank = _token_in_rank(owners, self.size)[:, :self.size]
        dest, tok = np.nonzero(in_rank.T)
        send_rows = np.bincount(dest, minlength=self.size).astype(np.int64)
        nsend = tok.size

        hidden = self.hidden

        # Metadata per row: local expert ids, weights, and where combine lands the row's
        # output here (the token's c-th rank, c counted in rank order).
        width = (k if w is None else 2 * k) + 1
        meta_send, meta_recv = self._meta_buffers(width)
        meta = meta_send[:nsend * width].reshape(nsend, width)
        mine = owners[tok] == dest[:, None]
        first_of_dest = (dest * self.num_local_experts)[:, None]
        np.copyto(meta[:, :k], np.where(mine, idx[tok] - first_of_dest, -1))
        if w is not None:
            meta[:, k:2 * k].view(np.float64)[...] = np.where(mine, w[tok], 0.0)
        nth_rank = np.cumsum(in_rank, axis=1, dtype=np.int64) - 1
        meta[:, -1] = nth_rank[tok, dest] * self.max_tokens_per_rank + tok

        team = self.team
        # The DPA gathers the token rows straight from x: no send buffer, no host copy.
        rows_src, recv = (xr, self._gpu_recv(x)) if gpu else (np.ascontiguousarray(xr),
                                                              self._recv)
        reqs = [team.alltoallv_rows(rows_src, tok, send_rows, recv),
                team.alltoallv(meta.reshape(-1), send_rows * width, meta_recv)]
        got_rows, got_meta = _wait_all(reqs)

        recv_rows = np.asarray(got_rows, np.int64)
        if (recv_rows * width != got_meta).any():
            raise OffloadError(
                f"dispatch: rows and routing metadata from the ranks do not match (received "
                f"{recv_rows.tolist()} rows, {np.asarray(got_meta).tolist()} elements of "
                "metadata): all ranks must use the same hidden and k, and all pass "
                "topk_weights or all pass None")
        nrecv = int(recv_rows.sum())
        got = meta_recv[:nrecv * width].reshape(nrecv, width)
        recv_idx = got[:, :k].copy()
        recv_w = None if w is None else got[:, k:2 * k].view(np.float64).astype(w_dtype)
        handle = Handle(self, tokens, send_rows, recv_rows, got[:, -1].copy(),
                        in_rank.sum(axis=1))
        if gpu:
            out_w = None
            if recv_w is not None:
                out_w = _torch_weights(recv_w, topk_weights) if _is_torch(topk_weights) \
                    else recv_w
                out_w = _to_device(out_w, x) if isinstance(out_w, np.ndarray) else \
                    out_w.to(x.device)
            return recv[:nrecv], _to_device(recv_idx, x), out_w, handle
        recv_x = self._recv[:nrecv * hidden].reshape(nrecv, hidden)

        if _is_torch(x):
            torch = _torch()
            out_x = torch.from_numpy(recv_x).view(getattr(torch, self._payload.name))
            out_w = None if recv_w is None else _torch_weights(recv_w, topk_weights)
            return out_x, torch.from_numpy(recv_idx), out_w, handle
        return recv_x.view(_user_dtype(x)), recv_idx, recv_w, handle

    # -- combine -----------------------------------------------------------------------------
    def combine(self, y: Any, handle: Handle) -> Any:
        """Send the expert outputs ``y`` [rows of recv_x, hidden] (already weighted) back and
        return ``out`` [num_tokens, hidden] with ``out[t]`` = the sum of the rows token t became,
        zeros for tokens with no expert. A new array; torch when ``y`` is a tensor."""
        if not isinstance(handle, Handle) or handle.dispatcher is not self:
            raise InvalidArgument("handle must come from dispatch() on this Dispatcher")
        gpu = _gpu_kind(y) is not None
        yr = self._gpu_rows(y, "y") if gpu else self._rows(y, "y")
        if yr.shape[0] != handle.num_recv_rows:
            raise InvalidArgument(
                f"y has {yr.shape[0]} rows but dispatch delivered {handle.num_recv_rows}: "
                "one output row per row of recv_x")
        src = _gpu_view(yr, self._payload.wire) if gpu else np.ascontiguousarray(yr)
        # Each row lands in its token's slot of our table: no unpacking, no gather.
        table = self._stage.reshape(-1, self.hidden)
        got = np.asarray(self.team.alltoallv_place(src, handle.recv_rows, table,
                                                   handle.recv_place).wait(), np.int64)
        if (got != handle.send_rows).any():
            raise OffloadError(
                f"combine: received {got.tolist()} rows but dispatch sent "
                f"{handle.send_rows.tolist()}: every rank must combine the handle of the same "
                "dispatch")
        out = sum_slots(table, handle.contributions, self.max_tokens_per_rank,
                        self._payload.name)
        return self._finish(out, y)

    def _finish(self, out: np.ndarray, like: Any) -> Any:
        name = self._payload.name
        raw = _f32_to_bf16_bits(out) if name == "bfloat16" else out.astype(name, copy=False)
        if _is_torch(like):
            torch = _torch()
            t = torch.from_numpy(raw.view(self._payload.wire)).view(getattr(torch, name))
            return t.to(like.device) if like.device.type != "cpu" else t
        if _gpu_kind(like):
            return _to_device(raw, like)
        return raw.view(_user_dtype(like))


def sum_slots(table: np.ndarray, contributions: np.ndarray, stride: int,
              payload: str) -> np.ndarray:
    """out[t] = the sum over c < contributions[t] of table[c * stride + t], widened to the
    payload's accumulation type (combine's host work). Slot c holds the token's c-th
    contribution; where a token has fewer, slot c is stale and is left out: zeroed when
    most tokens have a c-th contribution (then one contiguous add), else added only where
    present."""
    p = _PAYLOADS[payload]
    num_tokens, hidden = contributions.size, table.shape[1]
    depth = int(contributions.max()) if num_tokens else 0
    rows = table.view(np.uint16) if payload == "bfloat16" else table.view(payload)

    def slot(c: int) -> np.ndarray:
        part = rows[c * stride:c * stride + num_tokens]
        return _bf16_bits_to_f32(part) if payload == "bfloat16" else part

    def dense(c: int) -> np.ndarray | None:
        """Slot c with its stale rows zeroed, or None when most tokens lack a c-th row."""
        has = contributions > c
        present = int(np.count_nonzero(has))
        if 2 * present < num_tokens:
            return None
        if present < num_tokens:
            rows[c * stride:c * stride + num_tokens][~has] = 0
        return slot(c)

    if depth == 0:
        return np.zeros((num_tokens, hidden), p.acc)
    out = np.empty((num_tokens, hidden), p.acc)
    first = dense(0)
    if first is None:
        out[...] = 0
        done = 0
    elif depth > 1 and (second := dense(1)) is not None:
        np.add(first, second, out=out, dtype=p.acc)  # one pass for the common top-2 case
        done = 2
    else:
        out[...] = first
        done = 1
    for c in range(done, depth):
        full = dense(c)
        if full is not None:
            out += full
        else:
            picked = np.flatnonzero(contributions > c)
            out[picked] += slot(c)[picked]
    return out


def _wait_all(reqs: list[Any]) -> list[Any]:
    """Wait for every request, even after one failed, then raise the first error."""
    results: list[Any] = []
    error: BaseException | None = None
    for req in reqs:
        try:
            results.append(req.wait())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results.append(None)
            error = error or exc
    if error is not None:
        raise error
    return results


def _user_dtype(obj: Any) -> np.dtype:
    return obj.dtype if isinstance(obj, np.ndarray) else np.asarray(obj).dtype


def _weights_dtype(topk_weights: Any) -> Any:
    if _is_torch(topk_weights):
        return np.float64  # converted back to the tensor's dtype by _torch_weights
    return _as_array(topk_weights, "topk_weights").dtype


def _torch_weights(w: np.ndarray, like: Any) -> Any:
    return _torch().from_numpy(w).to(like.dtype)
