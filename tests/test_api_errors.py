"""Bad input, lifecycle and introspection of the public API.

Contract (DESIGN.md, "Contract details"): bad input raises InvalidArgument at call time, before
anything is posted; any call on a closed context raises OffloadError; close() twice is harmless.
"Nothing was posted" is checked two ways: on one rank, the next request gets the very next tag
(the host numbers posts 1, 2, 3, ...); on two ranks, a later valid all-to-all still pairs up
correctly, which it would not if the bad call had consumed a team sequence number on one side.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import offload_lib as ol
from offload_lib import ConfigError, InvalidArgument, OffloadError

from _mp import probe_tag, run_ranks


def _assert_nothing_posted(ctx, tag_before):
    after = probe_tag(ctx)
    if tag_before is not None and after is not None:
        assert after == tag_before + 1, (
            f"a rejected call posted something: tags went {tag_before} -> {after}")


def _noncontig_view():
    return memoryview(bytearray(16))[::2]


def _f_order():
    return np.zeros((4, 4)).T  # F-contiguous, not C-contiguous


def _readonly():
    a = np.zeros(8)
    a.setflags(write=False)
    return a


# (id, src factory, dst factory, words the message must contain)
BAD_ALLTOALL = [
    ("sizes-differ", lambda: np.zeros(8), lambda: np.zeros(16), ["src", "dst"]),
    ("sizes-differ-bytes", lambda: np.zeros(8, np.uint8), lambda: bytearray(9), []),
    ("dst-noncontiguous", lambda: np.zeros(8), lambda: np.zeros(16)[::2], ["dst"]),
    ("src-noncontiguous", lambda: np.zeros(16)[::2], lambda: np.zeros(8), ["src"]),
    ("dst-fortran-order", lambda: np.zeros(16), _f_order, ["dst"]),
    ("dst-noncontiguous-memoryview", lambda: bytearray(8), _noncontig_view, ["dst"]),
    ("src-noncontiguous-memoryview", _noncontig_view, lambda: bytearray(8), ["src"]),
    ("dst-readonly-array", lambda: np.zeros(8), _readonly, ["dst"]),
    ("dst-bytes", lambda: b"\0" * 8, lambda: b"\0" * 8, ["dst"]),
    ("dst-readonly-memoryview", lambda: bytearray(8),
     lambda: memoryview(bytearray(8)).toreadonly(), ["dst"]),
    ("dtype-mismatch-same-itemsize", lambda: np.zeros(8, np.float32),
     lambda: np.zeros(8, np.int32), []),
    ("dtype-mismatch-same-nbytes", lambda: np.zeros(8, np.float64),
     lambda: np.zeros(16, np.float32), []),
    ("dtype-mismatch-signedness", lambda: np.zeros(8, np.int8), lambda: bytearray(8), []),
    ("src-object", lambda: object(), lambda: np.zeros(8), ["src"]),
    ("dst-object", lambda: np.zeros(8), lambda: object(), ["dst"]),
    ("src-list", lambda: [0.0] * 8, lambda: np.zeros(8), ["src"]),
    ("dst-list", lambda: np.zeros(8), lambda: [0.0] * 8, ["dst"]),
    ("dst-none", lambda: np.zeros(8), lambda: None, ["dst"]),
    ("src-int", lambda: 8, lambda: np.zeros(8), ["src"]),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("use_init", [False, True], ids=["alltoall", "alltoall_init"])
@pytest.mark.parametrize("make_src,make_dst,words",
                         [c[1:] for c in BAD_ALLTOALL], ids=[c[0] for c in BAD_ALLTOALL])
def test_bad_alltoall_arguments(ctx, make_src, make_dst, words, use_init):
    src, dst = make_src(), make_dst()
    dst_before = dst.copy() if isinstance(dst, np.ndarray) else None
    before = probe_tag(ctx)
    call = ctx.world.alltoall_init if use_init else ctx.world.alltoall
    with pytest.raises(InvalidArgument) as info:
        call(src, dst)
    assert isinstance(info.value, TypeError)  # InvalidArgument is a TypeError too
    for w in words:
        assert w in str(info.value), f"message should name {w!r}: {info.value}"
    _assert_nothing_posted(ctx, before)
    if dst_before is not None:
        assert np.array_equal(dst, dst_before), "dst was written"
    # the context is not poisoned: a good all-to-all still works
    s, d = np.arange(4.0), np.zeros(4)
    ctx.world.alltoall(s, d).wait(timeout=10)
    assert np.array_equal(s, d)


def _overlaps():
    a = np.zeros(16)
    b = np.zeros(16, np.uint8)
    return [
        ("same-array", a, a),
        ("partial", a[:8], a[4:12]),
        ("partial-reverse", a[4:12], a[:8]),
        ("same-memory-two-views", a[:8], a[:8].view(np.float64)),
        ("memoryview-vs-array", memoryview(b)[:8], b[4:12]),
    ]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", range(5))
def test_overlapping_src_and_dst(ctx, case):
    name, src, dst = _overlaps()[case]
    before = probe_tag(ctx)
    with pytest.raises(InvalidArgument, match="overlap"):
        ctx.world.alltoall(src, dst)
    _assert_nothing_posted(ctx, before)


@pytest.mark.timeout(30)
def test_adjacent_buffers_and_readonly_src_are_fine(ctx):
    a = np.arange(16.0)
    ctx.world.alltoall(a[:8], a[8:]).wait(timeout=10)  # touching, not overlapping
    assert np.array_equal(a[8:], a[:8])
    ro = np.arange(8.0)
    ro.setflags(write=False)  # a read-only SOURCE is legal
    out = np.zeros(8)
    ctx.world.alltoall(ro, out).wait(timeout=10)
    assert np.array_equal(out, ro)
    out2 = bytearray(4)
    ctx.world.alltoall(b"\x01\x02\x03\x04", out2).wait(timeout=10)
    assert out2 == bytearray(b"\x01\x02\x03\x04")
    # zero-length ops are valid everywhere
    ctx.world.alltoall(np.zeros(0), np.zeros(0)).wait(timeout=10)
    ctx.world.alltoall(bytearray(), bytearray()).wait(timeout=10)


@pytest.mark.timeout(30)
def test_use_after_close_raises_offload_error(ctx):
    world = ctx.world
    src, dst = np.zeros(4), np.zeros(4)
    p = world.alltoall_init(src, dst)
    done = world.alltoall(src, dst)
    done.wait(timeout=10)
    ctx.close()
    assert ctx.closed
    calls = {
        "alltoall": lambda: world.alltoall(src, dst),
        "alltoall_init": lambda: world.alltoall_init(src, dst),
        "barrier": lambda: world.barrier(),
        "empty": lambda: ctx.empty(4),
        "stats": lambda: ctx.stats(),
        "create_team": lambda: ctx.create_team([0]),
        "persistent post": lambda: p.post(),
    }
    for what, call in calls.items():
        with pytest.raises(OffloadError):
            call()
            pytest.fail(f"{what} on a closed context did not raise")
    # a request that finished before close still answers
    assert done.test() is True
    done.wait()
    ctx.close()  # twice: harmless
    ctx.close()
    p.free()  # freeing after close: harmless


@pytest.mark.timeout(30)
def test_context_manager_closes():
    with ol.init() as c:
        assert not c.closed
        c.world.barrier().wait(timeout=10)
    assert c.closed
    with pytest.raises(OffloadError):
        c.world.barrier()
    with pytest.raises(ValueError, match="boom"):
        with ol.init() as c2:
            raise ValueError("boom")
    assert c2.closed
    c2.close()


@pytest.mark.timeout(30)
def test_unclosed_context_warns():
    c = ol.init()
    with pytest.warns(ResourceWarning):
        del c
        gc.collect()


@pytest.mark.timeout(30)
def test_persistent_request_misuse(ctx):
    src, dst = np.arange(6.0), np.zeros(6)
    p = ctx.world.alltoall_init(src, dst)
    with pytest.raises(InvalidArgument):
        p.wait(timeout=5)  # never posted
    p.post()
    before = probe_tag(ctx)
    with pytest.raises(InvalidArgument):
        p.post()  # still posted: wait() first
    _assert_nothing_posted(ctx, before)
    p.wait(timeout=10)
    assert np.array_equal(dst, src)
    # after a completed wait it may be posted again
    src += 1
    p.post().wait(timeout=10)
    assert np.array_equal(dst, src)
    p.free()
    for call in (lambda: p.wait(timeout=1), lambda: p.post(), lambda: p.test()):
        with pytest.raises(InvalidArgument):
            call()
    p.free()  # twice: harmless


@pytest.mark.timeout(60)
def test_dropped_alltoall_requests_do_not_exhaust_the_context(ctx):
    """Requests nobody waits for (dropped, garbage collected) must not use up the host's
    request table (4096 tags): the library keeps their buffers and reaps them."""
    src, dst = np.arange(4.0), np.zeros(4)
    for _ in range(5000):
        ctx.world.alltoall(src, dst)  # result dropped at once
    ctx.world.alltoall(src, dst).wait(timeout=10)
    assert np.array_equal(src, dst)


@pytest.mark.timeout(60)
def test_dropped_barrier_requests_do_not_exhaust_the_context(ctx):
    for _ in range(5000):
        ctx.world.barrier()  # result dropped at once
    ctx.world.barrier().wait(timeout=10)


@pytest.mark.timeout(30)
def test_reprs(ctx):
    r = repr(ctx)
    assert "Context" in r and "rank=0/1" in r and "open" in r and ctx.backend in r
    assert repr(ctx.world) == "<Team id=0 rank=0/1>" or (
        "Team" in repr(ctx.world) and "id=0" in repr(ctx.world))
    src, dst = np.arange(4.0), np.zeros(4)
    req = ctx.world.alltoall(src, dst)
    assert "alltoall" in repr(req)
    req.wait(timeout=10)
    assert "alltoall" in repr(req) and "done" in repr(req)
    b = ctx.world.barrier()
    b.wait(timeout=10)
    assert "barrier" in repr(b) and "done" in repr(b)
    p = ctx.world.alltoall_init(src, dst)
    assert "alltoall" in repr(p) and "idle" in repr(p)
    p.post()
    assert "posted" in repr(p)
    p.wait(timeout=10)
    assert "idle" in repr(p)
    p.free()
    assert "freed" in repr(p)
    ctx.close()
    assert "closed" in repr(ctx)


@pytest.mark.timeout(30)
def test_stats_counts_bytes_and_threads():
    with ol.init({"dpa_threads": 3}) as c:
        st = c.stats()
        for key in ("bytes", "chunks", "threads"):
            assert key in st, st
        threads = st["threads"]
        assert isinstance(threads, list) and len(threads) == 3, threads
        assert all(isinstance(t, dict) and t for t in threads), threads
        src = np.arange(4096, dtype=np.int64)
        dst = np.zeros_like(src)
        c.world.alltoall(src, dst).wait(timeout=10)
        st2 = c.stats()
        assert st2["bytes"] >= st["bytes"] + src.nbytes, (st, st2)
        assert st2["chunks"] >= st["chunks"] + 1, (st, st2)
        # totals are the sums of the per-thread entries
        for key, value in st2["threads"][0].items():
            if key in st2 and isinstance(value, int):
                assert st2[key] == sum(t[key] for t in st2["threads"]), (key, st2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("progress", ["cooperative", "threads"])
def test_stats_count_what_host_threads_ran(progress, monkeypatch):
    """stats() says who ran the firmware: with cooperative progress the thread that posts
    and waits (host_ops, host_passes), with progress: threads the DPA threads alone."""
    monkeypatch.setenv("OFFLOAD_PROGRESS", progress)  # the suite may run with another one
    with ol.init({"progress": progress}) as c:
        before = c.stats()
        assert before["progress"] == progress, before
        for _ in range(5):
            c.world.alltoall(np.arange(4.0), np.zeros(4)).wait(timeout=10)
            c.world.barrier().wait(timeout=10)
        st = c.stats()
        ops = st["ops_completed"] - before["ops_completed"]
        host_ops = st["host_ops"] - before["host_ops"]
        assert ops == 10, (before, st)
        if progress == "cooperative":
            assert 1 <= host_ops <= ops and st["host_passes"] > before["host_passes"], st
        else:
            assert st["host_ops"] == st["host_passes"] == 0, st


@pytest.mark.timeout(30)
def test_empty_array_properties(ctx):
    a = ctx.empty(10, np.int32)
    assert a.shape == (10,) and a.dtype == np.int32 and a.flags.writeable
    assert a.flags.c_contiguous
    a[:] = np.arange(10)
    assert a.sum() == 45
    b = ctx.empty((3, 5), np.float32)
    assert b.shape == (3, 5) and b.dtype == np.float32 and b.flags.writeable
    c = ctx.empty([2, 2, 2], np.uint8)
    assert c.shape == (2, 2, 2) and c.dtype == np.uint8
    z = ctx.empty(0, np.float64)
    assert z.shape == (0,) and z.size == 0
    # an empty() buffer is a valid all-to-all operand, also as a 2-D array
    d = ctx.empty((3, 5), np.float32)
    b[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
    ctx.world.alltoall(b, d).wait(timeout=10)
    assert np.array_equal(b, d)


EMPTY_AFTER_CLOSE = r'''
import gc
# 1. the array outlives close(): readable and writable, contents kept
ctx = ol.init()
a = ctx.empty(1000, np.int64)
a[:] = 5
ctx.world.alltoall(np.arange(1000, dtype=np.int64), a).wait(timeout=10)
ctx.close()
assert int(a.sum()) == sum(range(1000)), a[:10]
a[:] = 7
assert int(a.sum()) == 7000
# 2. ... and outlives the context object itself
del ctx
gc.collect()
assert int(a[::7].sum()) == 7 * len(a[::7])
a[3] = 11
assert a[3] == 11
del a
gc.collect()
# 3. an array released while the context is open, then the context closed
ctx = ol.init()
b = ctx.empty((4, 4), np.float32)
b[:] = 1.5
del b
gc.collect()
c = ctx.empty(16, np.float32)  # the slot is reusable
c[:] = 2.5
ctx.close()
assert float(c.sum()) == 40.0
del ctx, c
gc.collect()
print("survived")
'''


@pytest.mark.timeout(60)
def test_empty_array_outlives_close_without_crashing():
    # In a child process: a segfault must fail this test, not kill the test session.
    out = run_ranks(1, EMPTY_AFTER_CLOSE, timeout=45)
    assert "survived" in out[0]


@pytest.mark.timeout(30)
def test_bad_config_key_names_it(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no_such_knob"):
        ol.init({"no_such_knob": 1})
    with pytest.raises(ConfigError, match="ring_entries"):
        ol.init({"ring_entries": 3})  # a bad value names its key too
    cfg = tmp_path / "offload.yaml"
    cfg.write_text("dpa_threadz: 2\n")
    with pytest.raises(ConfigError, match="dpa_threadz"):
        ol.init(str(cfg))
    monkeypatch.setenv("OFFLOAD_CONFIG", str(cfg))
    with pytest.raises(ConfigError, match="dpa_threadz"):
        ol.init()
    assert issubclass(ConfigError, InvalidArgument) and issubclass(ConfigError, OffloadError)


@pytest.mark.timeout(30)
def test_create_team_bad_ranks(ctx):
    for ranks in ([], [0, 0], [1], [-1], [0, 5]):
        with pytest.raises(InvalidArgument):
            ctx.create_team(ranks)
    t = ctx.create_team([0])
    assert t is not None and t.size == 1 and t.rank == 0
    src, dst = np.arange(3.0), np.zeros(3)
    t.alltoall(src, dst).wait(timeout=10)
    assert np.array_equal(src, dst)


TWO_RANK_BAD_INPUT = r'''
ctx = ol.init()
w = ctx.world
if rank == 0:
    # rank 0 alone makes every mistake; rank 1 makes none. If any of these had posted,
    # the two ranks' team sequences would disagree and the good op below would not pair up.
    bad = [
        (np.zeros(3), np.zeros(3)),                 # 3 elements do not split over 2 ranks
        (np.zeros(5, np.uint8), np.zeros(5, np.uint8)),
        (np.zeros(4), np.zeros(6)),                 # sizes differ
        (np.zeros(4), np.zeros(8)[::2]),            # non-contiguous dst
        (np.zeros(4), np.zeros(4, np.float32)),     # dtype
        (object(), np.zeros(4)),
    ]
    for s, d in bad:
        for call in (w.alltoall, w.alltoall_init):
            try:
                call(s, d)
            except ol.InvalidArgument as e:
                print("rejected:", e)
            else:
                raise AssertionError(f"{call.__name__}({s!r}, {d!r}) was accepted")
    try:
        ctx.create_team([0, 2])
    except ol.InvalidArgument:
        pass
    else:
        raise AssertionError("create_team with rank 2 of 2 was accepted")
for it in range(3):
    src = np.arange(8, dtype=np.int64) + 100 * rank + 1000 * it
    dst = np.full(8, -1, np.int64)
    w.alltoall(src, dst).wait(timeout=20)
    want = np.concatenate([np.arange(4 * rank, 4 * rank + 4) + 100 * p + 1000 * it
                           for p in range(2)])
    check_equal(dst, want, f"good all-to-all {it} after rejected calls")
w.barrier().wait(timeout=20)
ctx.close()
'''


@pytest.mark.timeout(60)
def test_two_ranks_rejected_calls_post_nothing():
    run_ranks(2, TWO_RANK_BAD_INPUT, timeout=45)


WAIT_TIMEOUT = r'''
ctx = ol.init()
flag = os.environ["FLAG_DIR"]
w = ctx.world
src = np.arange(8, dtype=np.int64) + 100 * rank
dst = np.full(8, -1, np.int64)


def wait_flag(name):
    path = os.path.join(flag, name)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"flag {name} never came"
        time.sleep(0.01)


if rank == 0:
    req = w.alltoall(src, dst)
    assert req.test() is False
    assert "pending" in repr(req), repr(req)
    for bound in (0.0, 0.3, 1.0):
        t0 = time.monotonic()
        try:
            req.wait(timeout=bound)
        except ol.Timeout as e:
            took = time.monotonic() - t0
            assert isinstance(e, ol.OffloadError)
            assert took >= bound - 0.01, f"Timeout after {took:.3f} s, before the {bound} s bound"
            assert took < bound + 1.0, f"wait(timeout={bound}) took {took:.3f} s"
        else:
            raise AssertionError(f"wait(timeout={bound}) returned though rank 1 never posted")
    assert req.test() is False
    # a barrier rank 1 has not joined times out the same way
    b = w.barrier()
    t0 = time.monotonic()
    try:
        b.wait(timeout=0.3)
    except ol.Timeout:
        assert time.monotonic() - t0 < 1.3
    else:
        raise AssertionError("barrier completed without rank 1")
    open(os.path.join(flag, "go"), "w").close()
    # Timeout does not poison the request: it completes once the peer posts
    req.wait(timeout=30)
    b.wait(timeout=30)
else:
    wait_flag("go")
    w.alltoall(src, dst).wait(timeout=30)
    w.barrier().wait(timeout=30)
want = np.concatenate([np.arange(4 * rank, 4 * rank + 4) + 100 * p for p in range(2)])
check_equal(dst, want, "all-to-all completed after a Timeout")
ctx.close()
'''


@pytest.mark.timeout(60)
def test_wait_timeout_when_peer_never_posts(tmp_path):
    run_ranks(2, WAIT_TIMEOUT, timeout=45, env={"FLAG_DIR": str(tmp_path)})
