"""The torch entry points beyond the plain single-tensor ones (offload_lib.torch).

torch routes much of its traffic through forms the 'dpa' team does not post as such: the
group's name and description (funcol, torch.compile and DeviceMesh look the group up by
name), the coalesced forms every functional all-gather and reduce-scatter goes through
(even of one tensor), the list forms of ``dist.all_gather`` / ``dist.all_to_all`` /
``dist.scatter`` and the reductions. This module maps each onto team collectives.

List forms stage: their tensors are copied into one contiguous buffer before posting
(inputs) or out of it after completion (outputs), a host copy of every byte. Their users
(DDP's start-up, ``torch.distributed.nn``, DTensor's ``distribute_tensor``) move little;
bulk traffic belongs in the single-tensor forms, which copy nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from offload_lib.errors import InvalidArgument, OffloadError, Unsupported

_RED = dist.ReduceOp.RedOpType
# torch's reduce ops that the DPA reduces; the others (bitwise, PREMUL_SUM) are refused.
_REDOPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.PRODUCT: "prod", _RED.MAX: "max",
           _RED.MIN: "min"}


def reduce_op(opts: Any) -> str:
    """The team's op name for ``opts.reduceOp`` (SUM when torch passes no options)."""
    red = getattr(opts, "reduceOp", None)
    if red is None:
        return "sum"
    kind = getattr(red, "op", red)
    name = _REDOPS.get(kind)
    if name is None:
        raise Unsupported(f"the 'dpa' backend does not reduce with {kind}: it serves SUM, AVG, "
                          "PRODUCT, MAX and MIN. Run this reduction on a gloo or nccl group "
                          "(dist.new_group(backend='gloo')) beside it")
    return name


class WorkBase(dist._Work):
    """What every "dpa" work shares: success, error, result, and a future that completes the
    work first (it is for code that chains on it, not a way around wait()). Subclasses set
    ``_result`` and ``_error`` and define wait() and is_completed()."""

    _result: list[torch.Tensor]
    _error: BaseException | None

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut


class MultiWork(WorkBase):
    """Posted team requests (one per tensor of a coalesced or staged call), finished as one:
    ``wait()`` waits every request in post order, then runs ``after`` (the staged copy-out)
    if all succeeded, and raises the first error."""

    def __init__(self, reqs: Sequence[Any], result: list[torch.Tensor], timeout: timedelta,
                 after: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._reqs = list(reqs)
        self._result = result
        self._timeout = timeout
        self._after = after
        self._done = False
        self._error: BaseException | None = None

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._done:
            if self._error is not None:
                raise self._error
            return True
        bound = (timeout if timeout > timedelta(0) else self._timeout).total_seconds()
        first: BaseException | None = None
        for req in self._reqs:
            try:
                req.wait(bound)
            except BaseException as e:  # every request is waited: their buffers stay alive
                first = first or e
        if first is None and self._after is not None:
            self._after()
        self._done, self._error = True, first
        if first is not None:
            raise first
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        try:
            if all(bool(r.test()) for r in self._reqs):
                self.wait()
                return True
        except OffloadError as e:
            self._done, self._error = True, e
            return True
        return False


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 1-D tensor over the same memory; InvalidArgument if it is not contiguous
    (the single-tensor forms write in place, so a copy would lose the result)."""
    if not t.is_contiguous():
        raise InvalidArgument("the 'dpa' backend needs contiguous tensors: call .contiguous() "
                              "first")
    return t.view(-1)


def _same_dtype(tensors: Sequence[torch.Tensor], what: str) -> torch.dtype:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise InvalidArgument(f"{what} mix dtypes {sorted(str(d) for d in dtypes)}: use one")
    return dtypes.pop()


def _unstage(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> Callable[[], None]:
    """The copy-out of a staged receive: consecutive pieces of ``flat`` into ``outputs``."""
    def after() -> None:
        at = 0
        for o in outputs:
            k = o.numel()
            o.copy_(flat[at:at + k].view(o.shape))
            at += k
    return after


class TorchForms:
    """Mixin of ProcessGroupDPA: names, coalesced, list and reduction forms."""

    team: Any
    _timeout: timedelta
    _group_name = ""
    _group_desc = ""

    # -- names: funcol, torch.compile and DeviceMesh resolve the group by name --------------
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def _works(self, reqs: Sequence[Any], result: list[torch.Tensor],
               after: Callable[[], None] | None = None) -> MultiWork:
        return MultiWork(reqs, result, self._timeout, after)

    # -- coalesced forms: one team op per tensor, posted together --------------------------
    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> MultiWork:
        if len(outputs) != len(inputs):
            raise InvalidArgument(f"{len(outputs)} outputs for {len(inputs)} inputs: pass one "
                                  "output per input")
        return self._works([self.team.allgather(i, o) for o, i in zip(outputs, inputs)], outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # its name before torch 2.6

    # -- list forms (staged) ----------------------------------------------------------------
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> MultiWork:
        if len(inputs) != 1 or len(output_lists) != 1:
            raise InvalidArgument(f"allgather takes one input tensor per call, got {len(inputs)}")
        outs, x = output_lists[0], inputs[0]
        n = self.team.size
        if len(outs) != n or any(o.numel() != x.numel() for o in outs):
            raise InvalidArgument(f"allgather needs {n} output tensors of the input's "
                                  f"{x.numel()} elements")
        _same_dtype([x, *outs], "allgather's tensors")
        flat = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
        req = self.team.allgather(_flat(x.contiguous()), flat)
        return self._works([req], outs, _unstage(flat, outs))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> MultiWork:
        n = self.team.size
        if len(outputs) != n or len(inputs) != n:
            raise InvalidArgument(f"alltoall takes {n} input and {n} output tensors, got "
                                  f"{len(inputs)} and {len(outputs)}")
        dtype = _same_dtype([*inputs, *outputs], "alltoall's tensors")
        device = inputs[0].device
        send = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0)
        recv = torch.empty(sum(o.numel() for o in outputs), dtype=dtype, device=device)
        req = self.team.alltoallv(send, [t.numel() for t in inputs], recv,
                                  recv_counts=[o.numel() for o in outputs])
        return self._works([req], outputs, _unstage(recv, outputs))

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> MultiWork:
        """The root's block j goes to rank j: an all-to-all-v in which only the root sends."""
        n, me = self.team.size, self.team.rank
        root = int(getattr(opts, "rootRank", 0))
        if len(outputs) != 1:
            raise InvalidArgument(f"scatter takes one output tensor per call, got {len(outputs)}")
        out = outputs[0]
        if me == root:
            if len(input_lists) != 1 or len(input_lists[0]) != n:
                raise InvalidArgument(f"the scatter root passes {n} input tensors")
            ins = input_lists[0]
            if any(t.numel() != out.numel() for t in ins):
                raise InvalidArgument("scatter's input tensors must each match the output's "
                                      f"{out.numel()} elements")
            _same_dtype([*ins, out], "scatter's tensors")
            send = torch.cat([t.reshape(-1) for t in ins])
            counts = [out.numel()] * n
        else:
            send = torch.empty(0, dtype=out.dtype, device=out.device)
            counts = [0] * n
        recv_counts = [out.numel() if r == root else 0 for r in range(n)]
        recv = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
        req = self.team.alltoallv(send, counts, recv, recv_counts=recv_counts)
        return self._works([req], outputs, _unstage(recv, outputs))

    # -- reductions on the DPA ----------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MultiWork:
        if len(tensors) != 1:
            raise InvalidArgument(f"allreduce takes one tensor per call, got {len(tensors)}")
        return self._works([self.team.allreduce(_flat(tensors[0]), reduce_op(opts))], tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> MultiWork:
        op = reduce_op(opts)
        return self._works([self.team.allreduce(_flat(t), op) for t in tensors], tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> MultiWork:
        req = self.team.reduce_scatter(_flat(input), _flat(output), reduce_op(opts))
        return self._works([req], [output])

    _reduce_scatter_base = reduce_scatter_single  # its name before torch 2.6

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> MultiWork:
        if len(outputs) != len(inputs):
            raise InvalidArgument(f"{len(outputs)} outputs for {len(inputs)} inputs: pass one "
                                  "output per input")
        op = reduce_op(opts)
        return self._works([self.team.reduce_scatter(_flat(i), _flat(o), op)
                            for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # before torch 2.6

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> MultiWork:
        """The list form: the inputs are staged into one contiguous tensor."""
        n = self.team.size
        if len(outputs) != 1 or len(input_lists) != 1 or len(input_lists[0]) != n:
            raise InvalidArgument(f"reduce_scatter takes one output and {n} input tensors")
        out, ins = outputs[0], input_lists[0]
        if any(t.numel() != out.numel() for t in ins):
            raise InvalidArgument(f"reduce_scatter's inputs must each hold the output's "
                                  f"{out.numel()} elements")
        send = torch.cat([t.reshape(-1) for t in ins])
        return self._works([self.team.reduce_scatter(send, _flat(out), reduce_op(opts))], outputs)
