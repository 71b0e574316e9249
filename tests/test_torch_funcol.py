"""torch's higher layers on the "dpa" backend alone, checked against gloo in the same job:
group names, functional collectives given the group object, torch.compile of them,
DeviceMesh and DTensor, the list forms, fairscale's MoE layer. Skipped without torch."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from test_torch_backend import _run  # noqa: E402


@pytest.mark.timeout(150)
def test_names_funcol_compile_and_mesh():
    _run(4, r'''
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.distributed_c10d import _resolve_process_group

def w(t):  # funcol results are waited on explicitly, as compiled code does
    return fc.wait_tensor(t)

world = dist.group.WORLD
assert world.group_name == "0" and world.group_desc == "default_pg", (world.group_name, world.group_desc)
assert _resolve_process_group(world.group_name) is world
sub = dist.new_group([0, 1, 2, 3], group_desc="mine")
assert sub.group_desc == "mine" and _resolve_process_group(sub.group_name) is sub

# funcol with the group object (the usual call), against gloo's group object.
x = payload((8, 3), torch.float32, 1)
same(w(fc.all_to_all_single(x, None, None, world)),
     w(fc.all_to_all_single(x, None, None, gloo)), "funcol all_to_all_single")
for dim in (0, 1):
    same(w(fc.all_gather_tensor(x, dim, world)), w(fc.all_gather_tensor(x, dim, gloo)),
         f"funcol all_gather_tensor dim {dim}")
a, b = payload((5,), torch.int64, 2), payload((2, 2), torch.bfloat16, 3)
got = [w(t) for t in fc.all_gather_into_tensor_coalesced([a, b], world)]
want = [w(fc.all_gather_tensor(t, 0, gloo)) for t in (a, b)]  # gloo's coalesced mixes dtypes up
for g, wt in zip(got, want):
    same(g, wt, "funcol coalesced all-gather")

# torch.compile of a funcol chain equals eager and gloo.
def chain(t, group):
    t = fc.all_gather_tensor(t, 0, group)
    return fc.all_to_all_single(t, None, None, group)
compiled = torch.compile(chain, backend="aot_eager", fullgraph=True)
same(w(compiled(x, world)), w(chain(x, gloo)), "compiled funcol")

# DeviceMesh and DTensor on "dpa" alone.
mesh = init_device_mesh("cpu", (size,))
assert mesh.get_group().group_name == world.group_name
full = torch.arange(4 * size * 3, dtype=torch.float32).reshape(4 * size, 3)
local = full[rank * 4:(rank + 1) * 4].clone()
rep = DTensor.from_local(local, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
same(rep.to_local(), full, "DTensor Shard(0) -> Replicate()")
dt = distribute_tensor(full, mesh, [Shard(0)])  # scatter from rank 0
same(dt.to_local(), local, "distribute_tensor Shard(0)")
same(dt.full_tensor(), full, "full_tensor")

# List forms (staged), against gloo.
outs = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
want = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
y = payload((3,), torch.int64, 4)
dist.all_gather(outs, y)
dist.all_gather(want, y, group=gloo)
for g, wt in zip(outs, want):
    same(g, wt, "list all_gather")
ins = [payload((2, 3), torch.float32, r) for r in range(size)]
outs = [torch.empty(2, 3) for _ in range(size)]
want = [torch.empty(2, 3) for _ in range(size)]
dist.all_to_all(outs, ins)
dist.all_to_all(want, ins, group=gloo)  # gloo takes equal sizes only
for g, wt in zip(outs, want):
    same(g, wt, "list all_to_all")
ins = [torch.full((rank + 1, 2), float(rank * 10 + r)) for r in range(size)]  # rank r sends r+1 rows
outs = [torch.empty(r + 1, 2) for r in range(size)]
dist.all_to_all(outs, ins)
for r, g in enumerate(outs):
    same(g, torch.full((r + 1, 2), float(r * 10 + rank)), f"uneven list all_to_all from {r}")
import torch.distributed.nn.functional as dnn
z = payload((4,), torch.float32, 5).requires_grad_()
gathered = dnn.all_gather(z)
torch.stack(gathered).mul(torch.arange(size, dtype=torch.float32)[:, None]).sum().backward()
zg = z.detach().clone().requires_grad_()
torch.stack(dnn.all_gather(zg, group=gloo)).mul(torch.arange(size, dtype=torch.float32)[:, None]).sum().backward()
same(z.grad, zg.grad, "dist.nn all_gather backward (list all_to_all)")

# Still unserved: named, with the alternative.
for call in (lambda: dist.gather(torch.ones(1), [torch.empty(1)] * size if rank == 0 else None),
             lambda: dist.reduce(torch.ones(1), 0)):
    try:
        call()
    except ol.Unsupported as e:
        assert "gloo" in str(e), e
    else:
        raise AssertionError("an unsupported collective ran")
''', timeout=140)


@pytest.mark.timeout(120)
def test_fairscale_moe_matches_gloo():
    pytest.importorskip("fairscale")
    _run(4, r'''
from fairscale.nn import MOELayer, Top2Gate

def build():
    torch.manual_seed(11)  # the same gate on every rank, a different expert per rank
    gate = Top2Gate(8, size)
    torch.manual_seed(100 + rank)
    expert = torch.nn.Linear(8, 8)
    return gate, expert

def step(group):
    gate, expert = build()
    layer = MOELayer(gate, expert, group)
    torch.manual_seed(rank)
    x = torch.randn(2, 8, 8, requires_grad=True)
    out = layer(x)
    out.pow(2).sum().backward()
    return out.detach(), x.grad, [p.grad for p in layer.parameters()]

got, want = step(dist.group.WORLD), step(gloo)
same(got[0], want[0], "MOELayer forward")
same(got[1], want[1], "MOELayer input grad")
for i, (g, w) in enumerate(zip(got[2], want[2])):
    same(g, w, f"MOELayer param grad {i}")
''')


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.timeout(150)
def test_reductions_match_gloo_bitwise(n):
    _run(n, r'''
import torch.distributed._functional_collectives as fc
R = dist.ReduceOp
world = dist.group.WORLD
ops = {"sum": R.SUM, "avg": R.AVG, "product": R.PRODUCT, "max": R.MAX, "min": R.MIN}
torch.manual_seed(3 + rank)
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.int64):
    for count in (1, size * 3, 1000 // size, 4099, 262147):  # up to ~1000: eager allreduce
        base = torch.randn(count * size) * 4
        x = base.to(dtype) if dtype.is_floating_point else (base * 1000).to(dtype)
        for name, op in ops.items():
            if name == "avg" and not dtype.is_floating_point:
                continue
            if name == "product" and count > 4099:
                continue
            got, want = x.clone(), x.clone()
            dist.all_reduce(got, op=op)
            dist.all_reduce(want, op=op, group=gloo)
            same(got, want, f"all_reduce {name} {dtype} {count * size}")
            got, want = torch.empty(count, dtype=dtype), torch.empty(count, dtype=dtype)
            work = dist.reduce_scatter_tensor(got, x, op=op, async_op=True)
            dist.reduce_scatter_tensor(want, x, op=op, group=gloo)
            work.wait()
            same(got, want, f"reduce_scatter_tensor {name} {dtype} {count * size}")

# funcol with the group object
x = torch.randn(8 * size)
for op in ("sum", "avg", "max"):
    same(fc.wait_tensor(fc.all_reduce(x, op, world)), fc.wait_tensor(fc.all_reduce(x, op, gloo)),
         f"funcol all_reduce {op}")
    same(fc.wait_tensor(fc.reduce_scatter_tensor(x, op, 0, world)),
         fc.wait_tensor(fc.reduce_scatter_tensor(x, op, 0, gloo)), f"funcol reduce_scatter_tensor {op}")
got = [fc.wait_tensor(t) for t in fc.all_reduce_coalesced([x, x[:5] * 2], "sum", world)]
# gloo's coalesced form reduces the tensors as one buffer (another split, another order);
# the DPA reduces each tensor on its own, as an all_reduce of it does
want = [fc.wait_tensor(fc.all_reduce(t, "sum", gloo)) for t in (x, x[:5] * 2)]
for g, wt in zip(got, want):
    same(g, wt, "funcol all_reduce_coalesced")
# list reduce_scatter, _reduce_scatter_base, int64 MAX (DeepSpeed's top-2 gate)
ins = [torch.full((3,), float(rank * size + j)) for j in range(size)]
got, want = torch.empty(3), torch.empty(3)
dist.reduce_scatter(got, ins)
dist.reduce_scatter(want, ins, group=gloo)
same(got, want, "list reduce_scatter")
got = torch.empty(2)
dist._reduce_scatter_base(got, torch.arange(2.0 * size) + rank)
same(got, (torch.arange(2.0 * size)[rank * 2:rank * 2 + 2] * size + sum(range(size))), "_reduce_scatter_base")
m = torch.tensor([rank * 7 % 5, -rank], dtype=torch.int64)
dist.all_reduce(m, op=R.MAX)
same(m, torch.tensor([max(r * 7 % 5 for r in range(size)), 0]), "int64 MAX")
for bad in (R.BAND, R.BOR):
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=bad)
    except ol.Unsupported as e:
        assert "gloo" in str(e), e
    else:
        raise AssertionError(f"{bad} ran")
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int64), op=R.AVG)
except ol.InvalidArgument as e:
    assert "avg" in str(e), e
else:
    raise AssertionError("AVG of int64 ran")
''', timeout=140)


@pytest.mark.timeout(120)
def test_data_parallel_training_on_dpa_alone_equals_gloo():
    _run(4, r'''
def train(group, dtype, avg):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(20):
        x = torch.randn(8, 16, generator=gen).to(dtype)
        y = torch.randn(8, 5, generator=gen).to(dtype)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            if avg:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=group)
            else:
                dist.all_reduce(p.grad, group=group)
                p.grad /= size
        opt.step()
    return [p.detach() for p in model.parameters()]

for dtype in (torch.float32, torch.bfloat16):
    for avg in (False, True):
        got, want = train(None, dtype, avg), train(gloo, dtype, avg)
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"weights {i} after 20 steps {dtype} avg={avg}")
        for g in got:  # the replicas agree, too
            ref = g.clone()
            dist.broadcast(ref, 0)
            same(g, ref, "replicas in step")
''')
