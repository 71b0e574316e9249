"""The edges a hostile user finds: buffers that are not plain bytes, arguments of the wrong
type, a context closed from another thread. Each test here failed before its fix (see
docs/reliability.md, "Edges"); multi-rank faults (peers that close, mismatched collectives,
shrink, launcher death, names in /dev/shm) live in tests/test_edges_jobs.py.
"""
from __future__ import annotations

import pytest

from _mp import run_ranks

# Every entry point that takes a buffer, fed buffers whose elements are Python objects (or
# hold some): each must be InvalidArgument before anything is posted, and a good op pairs
# up afterwards (it would not if one rank had posted). Runs as ranks: before the fix an
# object array was sent as raw PyObject pointers and reading the result crashed.
OBJECT_BUFFERS = r'''
import ctypes

ctx = ol.init()
w = ctx.world
n = size


class Struct(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int), ("o", ctypes.py_object)]


class ArrayInterface:
    def __init__(self, a):
        self.__array_interface__ = a.__array_interface__
        self._a = a


def objects(count):
    return np.array([object() for _ in range(count)], dtype=object)


def with_object_field(count):
    return np.zeros(count, dtype=[("x", "i8"), ("o", "O")])


bad_sources = {
    "object array": lambda c: objects(c),
    "variable-width strings": lambda c: np.array(["x" * 40] * c, dtype=np.dtypes.StringDType()),
    "structured with an object field": lambda c: with_object_field(c),
    "memoryview of an object array": lambda c: memoryview(objects(c)),
    "ctypes py_object array": lambda c: memoryview((ctypes.py_object * c)()),
    "ctypes struct with a py_object": lambda c: memoryview((Struct * c)()),
    "__array_interface__ of objects": lambda c: ArrayInterface(objects(c)),
}
good = np.zeros(n, np.int64)
calls = {
    "alltoall": lambda s, d: w.alltoall(s, d),
    "alltoall_init": lambda s, d: w.alltoall_init(s, d),
    "alltoallv": lambda s, d: w.alltoallv(s, [1] * n, d),
    "alltoallv slot": lambda s, d: w.alltoallv(s, [1] * n, d, slot=1),
    "broadcast": lambda s, d: w.broadcast(d, root=0),
    "allgather": lambda s, d: w.allgather(s, np.zeros(n * n, np.int64) if d is good else d),
}
refused = 0
for kind, make in bad_sources.items():
    for call_name, call in calls.items():
        for side in ("src", "dst", "both"):
            s = make(n) if side in ("src", "both") else good
            d = make(n) if side in ("dst", "both") else np.zeros(n, np.int64)
            try:
                call(s, d)
            except ol.InvalidArgument as e:
                assert "object" in str(e), f"{kind} via {call_name}: {e}"
                refused += 1
            except Exception as e:
                raise AssertionError(f"{kind} as {side} of {call_name}: {type(e).__name__}: {e}")
            else:
                if call_name == "broadcast" and side == "src":
                    continue  # broadcast has one buffer, dst
                raise AssertionError(f"{kind} as {side} of {call_name} was accepted")
rows = objects(2 * n).reshape(n, 2)
for what, call in (
        ("alltoallv_rows", lambda: w.alltoallv_rows(rows, np.arange(n), [1] * n,
                                                    np.zeros((n, 2), np.int64))),
        ("alltoallv_place", lambda: w.alltoallv_place(rows, [1] * n, np.zeros((n, 2), np.int64),
                                                      np.zeros(n, np.int64))),
        ("empty(object)", lambda: ctx.empty(4, object)),
        ("empty(object field)", lambda: ctx.empty(4, [("x", "i8"), ("o", "O")])),
        ("Dispatcher(object)", lambda: ol.moe.Dispatcher(w, n, 4, 8, object)),
        ("dispatch(objects)", lambda: ol.moe.Dispatcher(w, n, 4, 8, np.float32).dispatch(
            objects(4).reshape(1, 4), np.zeros((1, 1), np.int64))),
):
    try:
        call()
    except ol.InvalidArgument:
        refused += 1
    else:
        raise AssertionError(f"{what} was accepted")
print("refused", refused)
src = np.arange(4 * n, dtype=np.int64) + 100 * rank
dst = np.zeros_like(src)
w.alltoall(src, dst).wait(timeout=20)
check_equal(dst, np.concatenate([np.arange(4 * rank, 4 * rank + 4) + 100 * p for p in range(n)]),
            "all-to-all after the refused calls")
ctx.close()
'''


@pytest.mark.timeout(90)
def test_object_buffers_are_invalid_on_every_entry_point():
    out = run_ranks(2, OBJECT_BUFFERS, timeout=75)
    assert all("refused" in o for o in out), out


def test_create_team_and_other_integers_must_be_integers(ctx):
    """Arguments that must be integers: a string, a float, a bool or None is InvalidArgument
    (before the fix create_team(['a']) raised ValueError and create_team([0.7]) made a team
    of rank 0)."""
    import numpy as np

    import offload_lib as ol
    from offload_lib import InvalidArgument

    for ranks in (["a"], [0.7], [True], [None], None, 5, "0", [[0]]):
        with pytest.raises(InvalidArgument):
            ctx.create_team(ranks)
    src, dst = np.zeros(4), np.zeros(4)
    for slot in ("a", 1.5, None, True):
        if slot is None:
            continue  # None means: no slot mode
        with pytest.raises(InvalidArgument):
            ctx.world.alltoallv(src, [1], dst, slot=slot)
    for shape in ("a", 1.5, -1, (2, -3), (2, "x"), None, 2**70):
        with pytest.raises(InvalidArgument):
            ctx.empty(shape, np.float32)
    for dtype in ("no such dtype", object(), 5):
        with pytest.raises(InvalidArgument):
            ctx.empty(4, dtype)
    req = ctx.world.alltoall(np.arange(4.0), dst)
    for timeout in ("a", [1]):
        with pytest.raises(InvalidArgument):
            req.wait(timeout=timeout)
    req.wait(timeout=10)
    for team in (None, "world", 0):
        with pytest.raises(InvalidArgument):
            ol.moe.Dispatcher(team, 2, 4, 8, np.float32)
    assert ctx.create_team(np.array([0])) is not None  # numpy integers are integers


# Rank 0 closes its context while its other threads wait on ops that cannot complete (rank
# 1 never posts them) and post in a loop: every thread must get OffloadError naming the
# closed context, nothing may crash, and requests, persistent requests and teams that
# outlive the context must keep raising. Before the fix a waiter touched the freed ring
# (3 of 3 runs segfaulted). With cooperative progress the waiters and posters run the
# firmware themselves (one at a time; the driver asleep between its passes, with eager
# blocks until every peer's block is in): the closer must get them out of it too.
CLOSE_FROM_ANOTHER_THREAD = r'''
import threading
import gc

if os.environ.get("TWO_CPUS"):  # the ranks outnumber the cores: a bulk waiter drives too
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
ctx = ol.init()
w = ctx.world
w.barrier().wait(timeout=20)
if rank == 0:
    src = np.arange(int(os.environ["ELEMS"]), dtype=np.int64)
    dst = np.zeros_like(src)
    errors, started = [], threading.Barrier(8)
    p = w.alltoall_init(src, dst)
    p.post()

    def waiter(req):
        started.wait()
        try:
            req.wait()
        except ol.OffloadError as e:
            errors.append(str(e))
        else:
            errors.append("completed")

    def poster():
        started.wait()
        try:
            while True:
                w.alltoall(src, np.zeros_like(src))
                w.barrier()
        except ol.OffloadError as e:
            errors.append(str(e))

    def creator():  # an agreement rank 1 never joins
        started.wait()
        try:
            ctx.create_team([0, 1])
        except ol.OffloadError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=waiter, args=(w.alltoall(src, dst),)) for _ in range(3)]
    threads += [threading.Thread(target=poster) for _ in range(3)]
    threads.append(threading.Thread(target=creator))
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.3)  # all of them inside the library
    t0 = time.monotonic()
    closer = threading.Thread(target=ctx.close)  # two closes at once: both return, once
    closer.start()
    ctx.close()
    closer.join(timeout=10)
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive(), "a thread still waits after close()"
    took = time.monotonic() - t0
    assert took < 1.0, f"close() and the threads' wake-up took {took:.2f} s"
    assert len(errors) == 7 and all("context closed" in e for e in errors), errors
    for call in (lambda: p.wait(timeout=1), lambda: p.post(), lambda: w.barrier(),
                 lambda: ctx.failed_ranks(), lambda: ctx.create_team([0, 1])):
        try:
            call()
        except ol.OffloadError as e:
            assert "closed" in str(e), e
        else:
            raise AssertionError("a call on a closed context returned")
    p.free()
    req = w.alltoall  # a bound method of a team of a closed context
    del req, p, threads
    gc.collect()
    open(os.path.join(os.environ["FLAG_DIR"], "closed"), "w").close()
else:
    flag = os.path.join(os.environ["FLAG_DIR"], "closed")
    deadline = time.monotonic() + 30
    while not os.path.exists(flag):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ctx.close()
print("ok")
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("progress, elems, n", [("cooperative", 4096, 2), ("cooperative", 64, 2),
                                                ("threads", 4096, 2),
                                                ("cooperative", 1 << 18, 4)],
                         ids=["cooperative", "cooperative-eager", "threads",
                              "cooperative-bulk-4-ranks-on-2-cpus"])
def test_close_from_another_thread_while_others_wait_and_post(tmp_path, progress, elems, n):
    for attempt in range(3 if n == 2 else 1):  # 4 ranks cost three times the time
        out = run_ranks(n, CLOSE_FROM_ANOTHER_THREAD, timeout=60,
                        env={"FLAG_DIR": str(tmp_path), "OFFLOAD_PROGRESS": progress,
                             "ELEMS": str(elems), "TWO_CPUS": "1" if n > 2 else ""})
        assert "ok" in out[0], out
        for f in tmp_path.iterdir():
            f.unlink()
