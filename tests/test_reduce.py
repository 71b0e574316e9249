"""team.reduce_scatter / team.allreduce against the numpy reference of the fixed order
(offload_lib._reduce.reference): bitwise, every dtype and op, odd team sizes and sizes that
leave blocks short or empty; in place; refusals before posting; runs that repeat bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from _mp import run_ranks
from offload_lib._reduce import order_block, reference

BODY = r'''
from offload_lib._reduce import reference
ctx = ol.init()
t = ctx.world
n, r = t.size, t.rank
DT = (np.float32, np.float64, np.float16, np.int32, np.int64)
for count in (0, 1, n - 1, n, 2 * n + 1, 4099, 65539, 1048583):
    for dt in DT:
        for op in ("sum", "prod", "max", "min", "avg"):
            if (op == "avg" and np.dtype(dt).kind == "i") or (op == "prod" and count > 4099):
                continue
            rng = np.random.default_rng(count * 31 + len(op))
            xs = [(rng.standard_normal(count) * 100).astype(dt) for _ in range(n)]
            want = reference(op, xs)
            out = np.zeros(count, dt)
            t.allreduce(xs[r], op, out=out).wait(60)
            check_equal(out.view(np.uint8), want.view(np.uint8), f"allreduce {op} {dt} {count}")
            buf = ctx.empty(count, dt)
            buf[:] = xs[r]
            t.allreduce(buf, op).wait(60)  # in place, in job-shared memory
            check_equal(buf.view(np.uint8), want.view(np.uint8), f"in-place allreduce {op} {dt} {count}")
            c = count - count % n
            part = [x[:c] for x in xs]
            want = reference(op, part)[r * (c // n):(r + 1) * (c // n)]
            dst = np.zeros(c // n, dt)
            t.reduce_scatter(part[r], dst, op).wait(60)
            check_equal(dst.view(np.uint8), want.view(np.uint8), f"reduce_scatter {op} {dt} {c}")
            src = part[r].copy()  # in place: dst is our own block of src
            t.reduce_scatter(src, src[r * (c // n):(r + 1) * (c // n)], op).wait(60)
            check_equal(src[r * (c // n):(r + 1) * (c // n)].view(np.uint8), want.view(np.uint8),
                        f"in-place reduce_scatter {op} {dt} {c}")
print("checked", flush=True)
'''


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.timeout(240)
def test_reductions_match_the_reference_bitwise(n):
    out = run_ranks(n, BODY, timeout=220)
    assert all("checked" in o for o in out)


@pytest.mark.timeout(120)
def test_refusals_and_repeatability():
    run_ranks(3, r'''
ctx = ol.init()
t = ctx.world
n, r = t.size, t.rank
x = np.arange(6 * n, dtype=np.int64)
for call, words in ((lambda: t.allreduce(x.copy(), "avg"), "avg of int64"),
                    (lambda: t.allreduce(x.copy(), "band"), "not a reduction"),
                    (lambda: t.allreduce(x.astype(np.int8), "sum"), "the DPA reduces"),
                    (lambda: t.reduce_scatter(x, np.empty(5, np.int64)), "gives each rank"),
                    (lambda: t.reduce_scatter(x, np.empty(6, np.int32)), "same dtype"),
                    (lambda: t.reduce_scatter(x[:7], np.empty(2, np.int64)), "split evenly"),
                    (lambda: t.allreduce(x, out=np.empty(5, np.int64)), "must match"),
                    (lambda: t.reduce_scatter(x, x[1:7]), "own block")):
    try:
        call()
    except ol.InvalidArgument as e:
        assert words in str(e), (words, e)
    else:
        raise AssertionError(f"accepted: {words}")
# Ranks that disagree on the op fail on every rank, and the team goes on.
try:
    t.allreduce(np.ones(8, np.float32), "sum" if r else "max").wait(30)
except ol.OffloadError as e:
    print("mismatch:", e)
else:
    raise AssertionError("ranks disagreeing on the op went unnoticed")
# The same random allreduce ten times: identical bits each time.
rng = np.random.default_rng(5 + r)
a = rng.standard_normal(300007).astype(np.float32)
first = None
for _ in range(10):
    b = a.copy()
    t.allreduce(b).wait(30)
    if first is None:
        first = b
    check_equal(b.view(np.uint32), first.view(np.uint32), "repeat")
print("ok", flush=True)
''', timeout=100)


def test_reference_order_block_is_glooish():
    # gloo's split: 2n segments at least, 1 MiB segments at most, element aligned
    assert order_block(4 * 4099, 4, 4) == 4104
    assert order_block(64 << 20, 4, 4) == 16 << 20
    x = [np.float32([1e8]), np.float32([1.0]), np.float32([-1e8])]
    # block 0 of 3 ranks starts at rank 2: (-1e8 + 1) + 1e8 = 0 in f32 -> 0, not 1
    assert reference("sum", x)[0] == np.float32(0.0)
