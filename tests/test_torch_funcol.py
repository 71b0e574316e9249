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
