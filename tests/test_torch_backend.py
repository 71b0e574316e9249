"""torch.distributed backend "dpa" on CPU tensors, checked against gloo in the same job.

Each rank opens the default group on "dpa" and a gloo group beside it; every collective runs
on both with the same tensors and the results must be identical. Skipped without torch.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _mp import DONE_MARK, run_ranks  # noqa: E402

PRELUDE = r'''
from datetime import timedelta
import torch
import torch.distributed as dist
import offload_lib.torch as olt

# One intra-op thread per rank: the ranks share the job's cores with each other and with
# the DPA emulator's threads, and idle OpenMP workers spinning for the CPU made a
# 20-step training loop of a tiny model take ~25 s instead of ~10 (results do not change:
# dpa and gloo run the same model code in each rank).
torch.set_num_threads(1)
dist.init_process_group("dpa", timeout=timedelta(seconds=60))
gloo = dist.new_group(backend="gloo")
assert dist.get_backend() == "dpa"
assert dist.get_rank() == rank and dist.get_world_size() == size
rng = np.random.default_rng(int(os.environ.get("TORCH_SEED", "7")))  # same draws everywhere

def same(got, want, what):
    assert got.dtype == want.dtype, f"{what}: {got.dtype} != {want.dtype}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError(f"{what}: {bad.shape[0]} elements differ, first at "
                             f"{bad[0].tolist()}: {got[tuple(bad[0])]} vs {want[tuple(bad[0])]}")

def payload(shape, dtype, salt):
    t = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    return ((t * 7 + salt * 1000 + rank * 100) % 251 - 120).to(dtype)
'''

DTYPES = "(torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8)"


# gloo's worker threads drop their last tensor references after an op has completed, taking
# the GIL; one still doing so while the interpreter exits aborts the process (seen in about
# one job in ten). The scripts therefore leave with os._exit once everything is checked.
EPILOGUE = f"""
dist.destroy_process_group()
print({DONE_MARK!r}, flush=True)
os._exit(0)
"""


def _run(n: int, body: str, timeout: float = 90) -> list[str]:
    return run_ranks(n, PRELUDE + body + EPILOGUE, timeout=timeout)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.timeout(120)
def test_all_to_all_single_matches_gloo(n):
    _run(n, f'''
for dtype in {DTYPES}:
    for rows in (0, 1, 3, 1024):  # rows per peer; width 5 makes nothing a power of two
        x = payload((rows * size, 5), dtype, rows)
        got, want = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(got, x)
        dist.all_to_all_single(want, x, group=gloo)
        same(got, want, f"even {{dtype}} rows={{rows}}")

    for trial in range(4):
        # rows[i][j]: rank i sends to rank j; zeros, one hot receiver, and random skew
        m = rng.integers(0, 7, (size, size))
        if trial == 1:
            m[:] = 0
        if trial == 2:
            m[:, :] = 0
            m[:, size - 1] = rng.integers(1, 50, size)
        ins, outs = m[rank].tolist(), m[:, rank].tolist()
        x = payload((sum(ins), 3), dtype, trial)
        got = torch.full((sum(outs), 3), -1, dtype=dtype)
        want = torch.full((sum(outs), 3), -1, dtype=dtype)
        work = dist.all_to_all_single(got, x, outs, ins, async_op=True)
        dist.all_to_all_single(want, x, outs, ins, group=gloo)
        assert work.wait()
        assert work.is_completed() and work.exception() is None
        same(got, want, f"uneven {{dtype}} trial {{trial}} {{m.tolist()}}")

# one split list given, the other even
x = payload((2 * size,), torch.float32, 9)
got, want = torch.empty(2 * size), torch.empty(2 * size)
dist.all_to_all_single(got, x, input_split_sizes=[2] * size)
dist.all_to_all_single(want, x, input_split_sizes=[2] * size, group=gloo)
same(got, want, "input splits only")
''')


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.timeout(120)
def test_all_gather_broadcast_barrier_match_gloo(n):
    _run(n, f'''
for dtype in {DTYPES}:
    for count in (0, 1, 4097):
        x = payload((count,), dtype, count)
        got = torch.empty(count * size, dtype=dtype)
        want = torch.empty(count * size, dtype=dtype)
        dist.all_gather_into_tensor(got, x)
        dist.all_gather_into_tensor(want, x, group=gloo)
        same(got, want, f"all-gather {{dtype}} {{count}}")
        for root in range(size):
            got = payload((count, 2), dtype, root)
            want = got.clone()
            work = dist.broadcast(got, src=root, async_op=True)
            dist.broadcast(want, src=root, group=gloo)
            work.wait()
            same(got, want, f"broadcast {{dtype}} {{count}} root {{root}}")
dist.barrier()
''')


@pytest.mark.timeout(120)
def test_subgroups_and_errors():
    _run(4, r'''
evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
evens_gloo = dist.new_group([0, 2], backend="gloo")
odds_gloo = dist.new_group([1, 3], backend="gloo")
mine, ref = (evens, evens_gloo) if rank % 2 == 0 else (odds, odds_gloo)
assert dist.get_backend(mine) == "dpa" and mine.size() == 2
x = payload((6,), torch.float32, 1)
got, want = torch.empty(6), torch.empty(6)
dist.all_to_all_single(got, x, group=mine)
dist.all_to_all_single(want, x, group=ref)
same(got, want, "subgroup all-to-all")
got, want = payload((3,), torch.int64, 2), payload((3,), torch.int64, 2)
second = 2 if rank % 2 == 0 else 3  # the group's second member, as a world rank
dist.broadcast(got, src=second, group=mine)
dist.broadcast(want, src=second, group=ref)
same(got, want, "subgroup broadcast")

# Overlapping groups (rank 1 and 2 in both) get distinct teams on every member.
low, high = dist.new_group([0, 1, 2]), dist.new_group([1, 2, 3])
low_gloo, high_gloo = dist.new_group([0, 1, 2], backend="gloo"), dist.new_group([1, 2, 3], backend="gloo")
for grp, ref, members in ((low, low_gloo, [0, 1, 2]), (high, high_gloo, [1, 2, 3])):
    if rank in members:
        x = payload((9,), torch.int64, members[0])
        got, want = torch.empty(9, dtype=torch.int64), torch.empty(9, dtype=torch.int64)
        dist.all_to_all_single(got, x, group=grp)
        dist.all_to_all_single(want, x, group=ref)
        same(got, want, f"overlapping group {members}")

# Unsupported collectives name the supported ones; nothing is posted, the group goes on.
for call in (lambda: dist.reduce(torch.ones(2), 0),
             lambda: dist.gather(torch.ones(1), [torch.empty(1)] * size if rank == 0 else None),
             lambda: dist.send(torch.ones(1), (rank + 1) % size)):
    try:
        call()
    except ol.Unsupported as e:
        assert "all_to_all_single" in str(e) and "gloo" in str(e), e
    else:
        raise AssertionError("an unsupported collective ran")

# Bad splits are refused before anything is posted.
for ins, outs in (([1] * (size - 1), [1] * size), ([2] * size, [1] * size)):
    try:
        dist.all_to_all_single(torch.empty(sum(outs)), torch.ones(size), outs, ins)
    except ol.InvalidArgument as e:
        assert "split sizes" in str(e), e
    else:
        raise AssertionError(f"splits {ins} / {outs} were accepted")
try:
    dist.all_to_all_single(torch.empty(3), torch.ones(3))
except ol.InvalidArgument as e:
    assert "split evenly" in str(e) or "multiple of" in str(e), e
else:
    raise AssertionError("3 elements over 4 ranks were accepted")

# A receiver whose split sizes disagree with its senders' fails with a clear error, and
# its peers learn that rank 0 failed its part.
outs = [1] * size
if rank == 0:
    outs = [1] * (size - 1) + [0]
got = torch.empty(sum(outs))
try:
    dist.all_to_all_single(got, torch.ones(size), outs, [1] * size)
    failed = None
except ol.OffloadError as e:
    failed = e
assert failed is not None, "a split-size mismatch went unnoticed"
print("mismatch:", failed)
assert ("rank 3" in str(failed)) if rank == 0 else ("rank 0 failed" in str(failed)), failed

# Still in step: the world group works after all of that.
x = payload((size,), torch.float32, 3)
got, want = torch.empty(size), torch.empty(size)
dist.all_to_all_single(got, x)
dist.all_to_all_single(want, x, group=gloo)
same(got, want, "after errors")
st = olt.context().stats()
assert st["ops_completed"] > 0
''')


@pytest.mark.timeout(60)
def test_single_rank_without_launcher(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "one.py"
    script.write_text(r'''
import torch, torch.distributed as dist, offload_lib.torch
dist.init_process_group("dpa", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
x = torch.arange(4.0)
y = torch.empty(4)
dist.all_to_all_single(y, x)
assert torch.equal(x, y)
dist.destroy_process_group()
dist.init_process_group("dpa", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
dist.broadcast(y, 0)
dist.destroy_process_group()
print("ok")
''')
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.timeout(90)
def test_example_moe_torch_4_ranks():
    import os
    import re

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "moe_torch.py")
    with open(path, encoding="utf-8") as f:
        out = run_ranks(4, f.read(), timeout=80)
    for r in range(4):
        assert re.search(rf"rank {r}/4: torch MoE layer on \d+ tokens \((cpu|cuda:0)\) matches",
                         out[r]), out[r]
