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
# up to 1000 elements: within eager_max (8 KiB) for every dtype, the eager allreduce
for count in (0, 1, n - 1, n, 2 * n + 1, 1000, 4099, 65539, 1048583):
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


EAGER_VS_RENDEZVOUS = r'''
import hashlib
ctx = ol.init()
t = ctx.world
n, r = t.size, t.rank
digest = hashlib.sha256()
signals = ctx.stats()["signals"]
for count in (1, 7, 333, 1000, 2048):
    for dt in (np.float32, np.float64, np.float16, np.int32, np.int64):
        for op in ("sum", "prod", "max", "min", "avg"):
            if (op == "avg" and np.dtype(dt).kind == "i") or np.dtype(dt).itemsize * count > 8192:
                continue
            rng = np.random.default_rng([count, r, len(op)])
            x = (rng.standard_normal(count) * 100).astype(dt)
            x[::17] = np.nan if np.dtype(dt).kind == "f" else x[::17]
            out = np.zeros(count, dt)
            t.allreduce(x, op, out=out).wait(60)
            digest.update(out.tobytes())
print("digest", digest.hexdigest(), "signals", ctx.stats()["signals"] - signals, flush=True)
ctx.close()
'''


@pytest.mark.timeout(120)
def test_eager_and_rendezvous_allreduce_agree_bitwise():
    """The same inputs (NaNs included) through the eager allreduce (within eager_max) and
    the rendezvous one (OFFLOAD_EAGER_MAX=0): bit-identical results; the rendezvous one
    orders its phases by done signals, the eager one sends none."""
    eager = run_ranks(3, EAGER_VS_RENDEZVOUS, timeout=100)
    rendezvous = run_ranks(3, EAGER_VS_RENDEZVOUS, timeout=100, env={"OFFLOAD_EAGER_MAX": "0"})
    lines = [[ln.split() for ln in out.splitlines() if ln.startswith("digest")][0]
             for out in eager + rendezvous]
    assert len({ln[1] for ln in lines}) == 1, lines
    assert all(int(ln[3]) == 0 for ln in lines[:3]), lines
    assert all(int(ln[3]) > 0 for ln in lines[3:]), lines


@pytest.mark.timeout(120)
def test_refusals_and_repeatability():
    run_ranks(3, r'''
ctx = ol.init()
t = ctx.world
n, r = t.size, t.rank
x = np.arange(6 * n, dtype=np.int64)
for call, words in ((lambda: t.allreduce(x.copy(), "avg"), "avg of int64"),
                    (lambda: t.allreduce(x.copy(), "band"), "not a reduction"),
                    # an output passed where the op goes: named by type, not printed whole
                    (lambda: t.allreduce(x.copy(), np.empty(6 * n, np.int64)),
                     "op a numpy.ndarray is not a reduction the DPA runs: use one of sum, prod,"
                     " max, min, avg (an output buffer goes in out=)"),
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
# Ranks that disagree on the op, dtype or size fail on every rank with the named error,
# and the team goes on: eager against eager (within eager_max), eager against rendezvous.
for what, mine in (("op", lambda: t.allreduce(np.ones(8, np.float32), "sum" if r else "max")),
                   ("dtype", lambda: t.allreduce(np.ones(8 if r else 4,
                                                         np.float32 if r else np.float64))),
                   ("size", lambda: t.allreduce(np.ones(8 + r, np.float32))),
                   ("size", lambda: t.allreduce(np.ones(8 if r else 4096, np.float32))),
                   ("op", lambda: t.allreduce(np.ones(4096, np.float32), "sum" if r else "min"))):
    try:
        mine().wait(30)
    except ol.InvalidArgument as e:  # the op/dtype word is the command's root
        assert ("names root" if what != "size" else "moves blocks of size") in str(e), (what, e)
    else:
        raise AssertionError(f"ranks disagreeing on the {what} went unnoticed")
    y = np.full(5, r + 1.0)
    t.allreduce(y).wait(30)
    check_equal(y, np.full(5, n * (n + 1) / 2), f"allreduce after the {what} mismatch")
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
