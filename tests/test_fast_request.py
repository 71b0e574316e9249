"""The one-shot request's common case in C (offload_lib._fast, host/py/): wait() and test()
call the library themselves and hand everything else to the Python methods of
offload_lib.request.Request. Each way out of the C path must behave as the Python one did:
arguments, a failed op's error (raised again by later calls), a slice that ends, a closed
context, a request dropped before its op completed (its buffers kept until then), and a
request caught in a reference cycle (collected); and the kept command's entry (kept.c)."""
from __future__ import annotations

import pytest

from _mp import run_ranks

ONE_RANK = r'''
import gc, weakref
ctx = ol.init()
team = ctx.world
src, dst = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
team.alltoall(src, dst).wait()
req = team.alltoall(src, dst)            # the kept command: a request made in C
assert type(req) is ol.Request, type(req)
assert repr(req).startswith("<Request alltoall tag="), repr(req)
assert req.wait() is None and req.wait() is None and req.test() is True
assert "done" in repr(req) and req._keep == ()
check_equal(dst, src, "the C path's alltoall")
for args, kwargs in [((1, 2), {}), ((), {"timeout": 1, "x": 2}), ((), {"tmo": 1})]:
    try:
        team.barrier().wait(*args, **kwargs)
        raise AssertionError(f"wait{args}{kwargs} accepted")
    except TypeError:
        pass
team.barrier().wait()                     # the ones above completed, unwaited: fine
done = team.barrier()
done.wait()
for bad in ("1", True, [1]):
    for r in (team.barrier(), done):      # pending, and finished: checked alike
        try:
            r.wait(timeout=bad)
            raise AssertionError(f"timeout={bad!r} accepted")
        except ol.InvalidArgument as e:
            assert "timeout must be a number" in str(e), e
    team.barrier().wait()
assert team.barrier().wait(0.5) is None and team.barrier().wait(timeout=5) is None
r = team.barrier()
while not r.test():
    pass
assert r.wait() is None

# The kept command (host/py/kept.c) holds its arrays weakly: they go when the caller drops
# them, and the entry says so.
a, b = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
team.alltoall(a, b).wait()
team.alltoall(a, b).wait()
(k,) = [p for p in team._alltoalls._entries.values() if p.matches(a, b)]
assert type(k).__name__ == "Kept" and k.what == "alltoall" and k.small and k.alive()
assert team._alltoalls.get(a, b) is k and team._alltoalls.get(a, b, "sum") is None
assert not k.matches(b, a) and not k.matches(a, a)
arrays = weakref.ref(a), weakref.ref(b)
del a, b
gc.collect()
assert arrays[0]() is None and arrays[1]() is None and not k.alive()
for bad in ((), (1, 2, 3)):
    try:
        ol._fast.post_kept(*bad)
        raise AssertionError("post_kept took bad arguments")
    except TypeError:
        pass
blank = ol._fast.Kept.__new__(ol._fast.Kept)  # never initialised: matches nothing
assert not blank.matches(src, dst) and not blank.alive()
try:
    ol._fast.bind(0, 0, 0, dict)                # requests of another layout: refused
    raise AssertionError("bind() took a type that is not a RequestCore")
except TypeError:
    pass
# The barrier's command is made with the team: two threads' first barrier() share it.
from offload_lib._native import ffi
assert team._barrier_addr == int(ffi.cast("uintptr_t", team._barrier_op))

# Weak references work, and a request in a cycle (its error's traceback holds the frame
# that holds it) is collected.
ref = weakref.ref(team.barrier())
gc.collect()
assert ref() is None
ctx.close()
try:
    req.wait()                           # done before the close: its outcome stands
except Exception as e:
    raise AssertionError(f"a finished request's wait() raised after close: {e!r}")
try:
    team.barrier()
    raise AssertionError("posted on a closed context")
except ol.OffloadError as e:
    assert "closed" in str(e), e
'''


@pytest.mark.timeout(60)
def test_c_request_arguments_outcomes_and_lifetime():
    run_ranks(1, ONE_RANK, timeout=45)


# Two ranks; rank 1 posts late, so rank 0's request is pending meanwhile.
PENDING = r'''
import errno, gc
ctx = ol.init()
team = ctx.world
src, dst = np.arange(64, dtype=np.float32) + rank, np.zeros(64, np.float32)
team.alltoall(src, dst).wait(timeout=20)
team.barrier().wait(timeout=20)
if rank == 0:
    dst[:] = -1
    req = team.alltoall(src, dst)        # C-made; rank 1 is not there yet
    assert req.test() is False and "pending" in repr(req)
    # host_done, wait()'s first look (made with the GIL held): pending says 0 and leaves
    # the request as it was; a tag it never had, -ENOENT.
    from offload_lib._native import ffi, lib
    comp = ffi.new("struct host_completion *")
    assert lib.host_done(ctx._handle(), req._tag, comp) == 0
    assert lib.host_done(ctx._handle(), req._tag ^ 0x40000000, comp) == -errno.ENOENT
    assert req.test() is False and "pending" in repr(req)
    try:
        req.wait(timeout=0.2)
        raise AssertionError("wait(timeout=0.2) returned before the peer posted")
    except ol.Timeout:
        pass
    tag = req._tag
    del req                              # dropped pending: the context keeps the arrays
    gc.collect()
    assert tag in ctx._orphans and ctx._orphans[tag][0] is src, ctx._orphans
    # Rank 1 posts its alltoall now; the context reaps the completion (at a post, or
    # here by hand) and lets the arrays go.
    deadline = time.monotonic() + 20
    while tag in ctx._orphans and time.monotonic() < deadline:
        time.sleep(0.01)
        ctx._reap_orphans()
    assert tag not in ctx._orphans, ctx._orphans
    check_equal(dst[32:], np.arange(32, dtype=np.float32) + 1, "the dropped op's data")
else:
    time.sleep(0.6)
    team.alltoall(src, dst).wait(timeout=20)
team.barrier().wait(timeout=20)
ctx.close()
'''


@pytest.mark.timeout(90)
def test_c_request_pending_timeout_and_dropped():
    run_ranks(2, PENDING, timeout=60)


# A failed op through the C path: the peer left, so the op completes with an error, which
# wait() raises, and raises again.
FAILED = r'''
ctx = ol.init()
team = ctx.world
src, dst = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
team.alltoall(src, dst).wait(timeout=20)
team.barrier().wait(timeout=20)
if rank == 1:
    ctx.close()
else:
    req = team.alltoall(src, dst)
    errors = []
    for _ in range(2):
        try:
            req.wait()
        except ol.PeerClosed as e:
            errors.append(e)
    assert len(errors) == 2 and errors[0] is errors[1], errors
    try:
        req.test()
        raise AssertionError("test() of a failed op returned")
    except ol.PeerClosed as e:
        assert e is errors[0]
    try:
        team.barrier().wait()
        raise AssertionError("a barrier with a closed peer completed")
    except ol.OffloadError:
        pass
    ctx.close()
'''


@pytest.mark.timeout(90)
def test_c_request_failed_op_raises_and_raises_again():
    run_ranks(2, FAILED, timeout=60)


# close() from another thread while a thread is in wait() or test() (the C path): the
# waiter's error arrives only once the device stopped, so that it may free its buffers
# (Context._check's rule; "persistent": a persistent request's test()). Rank 1 never posts
# the op rank 0 waits for.
CLOSE_WHILE_WAITING = r'''
import threading
ctx = ol.init()
team = ctx.world
team.barrier().wait(timeout=20)
if rank == 0:
    src, dst = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    req = team.alltoall_init(src, dst).post() if HOW == "persistent" else team.alltoall(src, dst)
    seen = []

    def waiter():
        try:
            if HOW == "wait":
                req.wait()
            else:
                while not req.test():
                    pass
            seen.append("returned")
        except ol.OffloadError as e:
            seen.append((ctx._shut.is_set(), str(e)))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    ctx.close()
    t.join(20)
    assert seen and seen[0][0] is True and "closed" in seen[0][1], seen
else:
    time.sleep(1.0)   # never posts the op rank 0 waits for
    ctx.close()
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["wait", "test", "persistent"])
def test_close_from_another_thread_during_a_c_wait_raises_after_the_device_stopped(how):
    run_ranks(2, f"HOW = {how!r}\n" + CLOSE_WHILE_WAITING, timeout=60)


# The persistent request's post() and test() in C (host/py/persistent.c): rounds with new
# data each time, then every way out of the C path: posted twice, idle, a wait() that timed
# out (its Request takes over), a failed op (the peer left), freed, a closed context, and
# a core nobody initialised.
PERSISTENT = r'''
ctx = ol.init()
team = ctx.world
n = 64
src, dst = np.zeros(2 * n, np.float32), np.zeros(2 * n, np.float32)
p = team.alltoall_init(src, dst)
assert type(p).__mro__[1] is ol._fast.PersistentCore and p.test() is True and "idle" in repr(p)


def slow(*args):
    raise AssertionError("the common case left the C path")


for it in range(20):
    src[:] = 100 * it + 10 * rank + np.repeat(np.arange(2, dtype=np.float32), n)
    dst[:] = -1
    p._post_slow = p._test_slow = slow   # the instance's: what the C path would call
    assert p.post() is p and "posted" in repr(p)
    while not p.test():
        pass
    del p._post_slow, p._test_slow
    want = 100 * it + 10 * np.repeat(np.arange(2, dtype=np.float32), n) + rank
    check_equal(dst, want, f"round {it}")
    team.barrier().wait(timeout=20)
    p.post()
    try:
        p.post()
        raise AssertionError("posted twice")
    except ol.InvalidArgument as e:
        assert "already posted" in str(e), e
    while not p.test():
        pass
    assert p.test() is True and p._tag == 0
    check_equal(dst, want, f"round {it}, again")
    team.barrier().wait(timeout=20)
if rank == 0:  # rank 1 posts late: wait() times out, its Request then serves test()
    p.post()
    try:
        p.wait(timeout=0.2)
        raise AssertionError("wait(timeout=0.2) returned before the peer posted")
    except ol.Timeout:
        pass
    assert p._req is not None and p._tag
    while not p.test():
        time.sleep(0.001)
    assert p._req is None and p._tag == 0
else:
    time.sleep(0.6)
    p.post()
    assert p.wait(timeout=20) is None
team.barrier().wait(timeout=20)
if rank == 1:
    ctx.close()
else:
    p.post()
    try:
        deadline = time.monotonic() + 20
        while not p.test():
            assert time.monotonic() < deadline, "the failed op never completed"
        raise AssertionError("test() of a failed op returned True")
    except ol.PeerClosed:
        pass
    assert p._tag == 0 and p.test() is True
    p.free()
    for call in (p.post, p.test):
        try:
            call()
            raise AssertionError(f"{call.__name__}() of a freed request returned")
        except ol.InvalidArgument as e:
            assert "freed" in str(e), e
    q = team.alltoall_init(src, dst)
    ctx.close()
    for call in (q.post, q.test):
        try:
            call()
            raise AssertionError(f"{call.__name__}() after close returned")
        except ol.OffloadError as e:
            assert "closed" in str(e), e
    blank = ol._fast.PersistentCore.__new__(ol._fast.PersistentCore)
    for call in (blank.post, blank.test):
        try:
            call()
            raise AssertionError("an uninitialised PersistentCore posted")
        except AttributeError:
            pass
    for bad, error in [((), TypeError), ((ctx, None, 0, 0), TypeError),
                       ((ctx, None, 0, 0, {}), ValueError), ((ctx, None, "x", 0, {}), TypeError),
                       ((ctx, None, 1, 0, []), TypeError), ((None, None, 1, 0, {}), AttributeError)]:
        try:
            ol._fast.PersistentCore(*bad)
            raise AssertionError(f"PersistentCore{bad} accepted")
        except error:
            pass
'''


@pytest.mark.timeout(90)
def test_c_persistent_post_test_and_every_way_out():
    run_ranks(2, PERSISTENT, timeout=60)


# A team's barrier() and kept all-to-all in C (host/py/team.c): the C path runs where it
# may (the slow methods, overridden on the instance, are not called), and every other call
# reaches the Python methods: first arrays, other arrays, keywords, wrong arguments,
# something in line (an orphan, a stager), a closed context.
TEAM_CORE = r'''
import gc, weakref
ctx = ol.init()
team = ctx.world
assert isinstance(team, ol._fast.TeamCore) and team in ctx._teams
calls = []
def counted(name):
    real = getattr(type(team), name)
    def slow(*args, **kwargs):
        calls.append(name)
        return real(team, *args, **kwargs)
    return slow
team._barrier_slow, team._alltoall_slow = counted("_barrier_slow"), counted("_alltoall_slow")
src, dst = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
team.alltoall(src, dst).wait()              # first arrays: the full way keeps the command
assert calls == ["_alltoall_slow"], calls
for _ in range(3):
    assert type(team.barrier()) is ol.Request
    team.barrier().wait()
    dst[:] = 0
    team.alltoall(src, dst).wait()
assert calls == ["_alltoall_slow"], calls  # both in C
check_equal(dst, src, "the C path's alltoall")
dst[:] = 0
team.alltoall(src=src, dst=dst).wait()
check_equal(dst, src, "alltoall with keywords")
other = np.zeros(64, np.float32)
team.alltoall(src, other).wait()
check_equal(other, src, "alltoall on other arrays")
assert calls == ["_alltoall_slow"] * 3, calls
for call in (lambda: team.barrier(1), lambda: team.barrier(x=1), lambda: team.alltoall(src),
             lambda: team.alltoall(src, dst, dst)):
    try:
        call()
        raise AssertionError("wrong arguments accepted")
    except TypeError:
        pass
team._barrier_slow, team._alltoall_slow = (lambda: "slow"), (lambda s, d: "slow")
ctx._orphans[1 << 30] = ()                  # something in line: the Python way sees to it
assert team.barrier() == "slow" and team.alltoall(src, dst) == "slow"
del ctx._orphans[1 << 30]
team._staged = True                         # a stager: its ops go first
assert team.barrier() == "slow" and team.alltoall(src, dst) == "slow"
team._staged = False
del team._barrier_slow, team._alltoall_slow
team.barrier().wait()
ctx.close()
assert team._fast_closed
for call in (team.barrier, lambda: team.alltoall(src, dst)):
    try:
        call()
        raise AssertionError("posted on a closed context")
    except ol.OffloadError as e:
        assert "closed" in str(e), e
ref = weakref.ref(team)
del team, ctx, call
gc.collect()
assert ref() is None, "a team and its context in a cycle were not collected"
blank = ol._fast.TeamCore.__new__(ol._fast.TeamCore)
for call in (blank.barrier, lambda: blank.alltoall(src, dst)):  # never initialised
    try:
        call()
        raise AssertionError("an uninitialised TeamCore posted")
    except AttributeError:
        pass
'''


@pytest.mark.timeout(60)
def test_c_team_barrier_and_alltoall_and_every_way_out():
    run_ranks(1, TEAM_CORE, timeout=45)
