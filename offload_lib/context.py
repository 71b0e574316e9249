"""Context: one rank's connection to its DPA: lifecycle, teams, memory, counters, and the
posting every collective goes through (Team in team.py encodes with _commands.py and
submits here; the GPU stager and the reductions post through a _posting.Posting, the
internal interface over the same few methods)."""
from __future__ import annotations

import errno
import math
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from offload_lib import _commands, _fast, _reduce, _staging
from offload_lib._buffers import Buffer
from offload_lib._regcache import Cookies
from offload_lib._native import ffi, lib
from offload_lib.bootstrap import World, allgather
from offload_lib.config import MAX_RAILS, Config, parse_rail_faults
from offload_lib.errors import ConfigError, InvalidArgument, OffloadError, Unsupported, brief, check_rc
from offload_lib.request import SMALL_MAX_BYTES, PersistentRequest, Request, Result
from offload_lib.team import DST_ACCESS, SRC_ACCESS, Team

__all__ = ["Context", "Team", "SRC_ACCESS", "DST_ACCESS", "MAX_TEAMS", "MAX_RANKS"]

MAX_TEAMS = lib.OFFLOAD_MAX_TEAMS
MAX_RANKS = lib.OFFLOAD_RANKS_LIMIT  # ranks in a job (the ABI's validation cap)

# struct offload_thread_stats: uint64 counters, in the order of its fields
_STAT_FIELDS = tuple(name for name, _ in ffi.typeof("struct offload_thread_stats").fields)
_STAT_WORDS = ffi.sizeof("struct offload_thread_stats") // 8


@ffi.def_extern()
def offload_allgather(arg: Any, mine: Any, length: int, out: Any) -> int:
    """host_ctx_params.allgather for hardware backends: the bootstrap's allgather."""
    try:
        ctx = ffi.from_handle(arg)
        parts = allgather(ctx._world, bytes(ffi.buffer(mine, length)),
                          ctx.config.bootstrap_timeout)
        if any(len(p) != length for p in parts):
            return -errno.EPROTO
        ffi.memmove(out, b"".join(parts), length * len(parts))
        return 0
    except Exception as e:  # an exception must not unwind through C
        warnings.warn(f"bootstrap allgather failed: {e}", RuntimeWarning, stacklevel=1)
        return -errno.EIO


def _backend_load_error(path: str) -> str:
    """Why the host could not use the backend library at path, in the loader's words."""
    import ctypes

    try:
        ctypes.CDLL(path)
    except OSError as e:
        return f"loading the backend library {path} failed: {e}"
    return (f"loading the backend library {path} failed: it has no dpaoffload_flexio_ops "
            "(is it dpa-offload's FlexIO backend? build it with scripts/build_flexio.sh)")


def _rail_thresholds(config: Config, rank: int) -> list[int]:
    """Bytes after which each of this rank's rails fails (rail_faults), 2**64-1 for never."""
    never = 2**64 - 1
    out = [never] * MAX_RAILS
    for who, rail, after in parse_rail_faults(config.rail_faults):
        if rail >= config.rails:
            raise ConfigError(f"rail_faults names rail {rail} but rails is {config.rails}; "
                              f"rails are numbered 0..{config.rails - 1}")
        if who is None or who == rank:
            out[rail] = min(out[rail], after)
    return out


def _flexio_library(config: Config, rank: int) -> str:
    """The FlexIO backend library to load; on the FlexIO model, built if needed, and the
    model's NIC told which of this rank's ports fail (rail_faults) and how many it has."""
    from offload_lib.discovery import backend_library_path

    if config.flexio_runtime != "model":
        return backend_library_path(config)
    from offload_lib.flexio_runtime import build_model

    never = 2**64 - 1
    faults = [f"{r}@{after}" for r, after in enumerate(_rail_thresholds(config, rank))
              if after != never]
    os.environ["OFFLOAD_FXM_PORT_FAULTS"] = ",".join(faults)
    os.environ["FXM_PORTS"] = str(max(2, config.rails))
    return str(build_model())


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _resolve_threads(config: Config, ranks: int) -> int:
    if config.dpa_threads != "auto":
        return int(config.dpa_threads)
    # The emulator's DPA threads share the host's cores with every rank of the job.
    return max(1, min(4, _cores() // ranks))


class Context:
    """One rank's connection to its (emulated or real) DPA. Close it, or use ``with``."""

    @classmethod
    def from_world(cls, config: Config, world: World, backend: str | None = None) -> Context:
        """Open this rank's context in a bootstrapped world (ol.init() and the torch backend
        both come here): the backend the config selects unless given, the launcher watched
        (a rank dies with `dpa-offload run`), and rank 0 clears what dead jobs left in
        /dev/shm first."""
        from offload_lib.discovery import select_backend
        from offload_lib.launcher import cleanup_stale_segments, watch_launcher

        if backend is None:
            backend, _reason = select_backend(config)
        if world.launcher == "dpa-offload":
            watch_launcher()  # die with the launcher, also when it is not our parent
        if world.rank == 0:
            cleanup_stale_segments()
        return cls(config, world, backend)

    def __init__(self, config: Config, world: World, backend: str) -> None:
        self.config = config
        self.rank = world.rank
        self.size = world.size
        self.backend = backend
        self.job = world.job
        self.launcher = world.launcher  # "dpa-offload", "mpi" or "single"
        self._lock = threading.Lock()
        self._orphans: dict[int, tuple[Any, ...]] = {}
        self._persistents: weakref.WeakSet[PersistentRequest] = weakref.WeakSet()
        self._teams: weakref.WeakSet[Team] = weakref.WeakSet()  # their C calls read flags
        self._next_team = 1
        self._stager: _staging.Stager | None = None  # made when a GPU buffer first shows up
        self._cookies = Cookies(self)  # exporters of buffers host_post registers and keeps
        # multicast faults this rank's NIC injects now (set_mcast_faults changes them)
        self._mcast_faults = (config.mcast_loss, config.mcast_reorder)
        # The host context. It stays valid after close() (every call into it then answers
        # -ESHUTDOWN) and is freed with this object, so that threads that read it before a
        # close() from another thread never touch freed memory (host_ctx_shutdown).
        self._ptr: Any = None
        self._closed = True  # until the device is open
        self._close_lock = threading.Lock()
        self._shut = threading.Event()  # set once the device stopped (close() returned)
        # One struct, filled here once and passed down by pointer (host setup, the backend,
        # the firmware's part as it is): offload_host.h's struct host_ctx_params.
        params = ffi.new("struct host_ctx_params *")
        params.struct_size = ffi.sizeof("struct host_ctx_params")
        params.version = lib.HOST_CTX_PARAMS_VERSION
        engine = params.engine  # the firmware's settings (dpa_engine.h)
        job_c = ffi.new("char[]", world.job.encode())
        backend_c = ffi.new("char[]", backend.encode())
        params.job, params.backend = job_c, backend_c
        lib_c = ffi.NULL
        if backend != "emulator":
            lib_c = ffi.new("char[]", _flexio_library(config, world.rank).encode())
        params.backend_lib = lib_c
        params.rank, params.size = world.rank, world.size
        params.num_threads = self.dpa_threads = _resolve_threads(config, world.size)
        self.progress = config.progress if backend == "emulator" else "threads"
        params.coop = self.progress == "cooperative"
        # The emulator spins only while every awake thread of the job has a core; a host
        # thread that waits on the completion ring (threads mode) spins as long, then sleeps.
        params.spin_us = config.spin_us
        params.idle_poll_us = config.idle_poll_us
        params.wire_min = config.wire_min
        self._poll_ns = config.spin_us * 1000
        engine.eager_max = config.eager_max
        params.ring_entries = config.ring_entries
        engine.chunk_size = config.chunk_size
        params.bootstrap_timeout_ns = int(config.bootstrap_timeout * 1e9)
        engine.op_timeout_ms = int(round(config.op_timeout * 1000))
        # Hardware backends connect their queues through the bootstrap (see _allgather).
        self._world = world
        self._self_handle = ffi.new_handle(self)
        params.allgather = lib.offload_allgather
        params.allgather_arg = self._self_handle
        params.rails = config.rails
        params.mtu = config.mtu
        engine.mcast_roots = config.mcast_roots
        params.mcast_rq_depth = config.mcast_rq_depth
        params.mcast_staged = config.mcast_placement == "staged"
        engine.link_mbps = max(1, int(config.link_rate * 1000))
        params.mcast_loss_ppm = int(round(config.mcast_loss * 1e6))
        params.mcast_reorder_ppm = int(round(config.mcast_reorder * 1e6))
        params.mcast_seed = config.mcast_seed
        params.job_key = world.key64
        for r, after in enumerate(_rail_thresholds(config, world.rank)):
            params.rail_down_after[r] = after
        self._post_timeout_ns = int(config.post_timeout * 1e9)
        out = ffi.new("struct host_ctx **")
        rc = lib.host_ctx_open(params, out)
        what = f"opening the {backend} device for rank {world.rank}/{world.size} (job {world.job})"
        if rc in (-errno.ENOENT, -errno.ENOEXEC) and backend != "emulator":
            raise OffloadError(f"{what}: {_backend_load_error(ffi.string(lib_c).decode())}")
        if rc == -errno.EPROTO and backend != "emulator" and lib_c != ffi.NULL:
            raise OffloadError(f"{what}: the backend library {ffi.string(lib_c).decode()} was "
                               "built from other headers (another OFFLOAD_ABI_VERSION): rebuild "
                               "it with scripts/build_flexio.sh")
        if rc == -errno.EEXIST:
            raise OffloadError(f"{what}: job name in use: another job runs under "
                               f"OFFLOAD_JOB={world.job} (every job needs a name of its own: "
                               "dpa-offload run and mpirun make one)")
        if rc == -errno.EACCES:
            raise OffloadError(f"{what}: /dev/shm/{world.job} is not a private file of this "
                               "user (made by someone else?): refusing to use it")
        if rc == -errno.EPROTONOSUPPORT:
            raise OffloadError(f"{what}: the host library reads struct host_ctx_params version "
                               f"{lib.HOST_CTX_PARAMS_VERSION}, not the {params.struct_size} bytes "
                               f"of version {params.version} given: offload_lib._native was built "
                               "from other headers (reinstall: pip install -e .)")
        check_rc(rc, what)
        self._ptr = ffi.gc(out[0], lib.host_ctx_close)
        self._addr = int(ffi.cast("uintptr_t", self._ptr))  # for offload_lib._fast
        self._closed = False
        self.world = self._make_team(0, list(range(self.size)))

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise OffloadError("the context closed: open a new one with ol.init()")

    def _handle(self) -> Any:
        self._check_open()
        return self._ptr

    def _check(self, rc: int, what: str) -> None:
        """check_rc for calls on this context: one that ended because another thread
        closed it raises once the device stopped, so that the caller may free its buffers."""
        if rc == -errno.ESHUTDOWN:
            self._shut.wait(timeout=30)
        check_rc(rc, what)

    def close(self) -> None:
        """Stop the DPA threads and release everything; safe to call twice, and from any
        thread: calls waiting or posting in other threads raise OffloadError."""
        with self._close_lock:  # a second close() returns once the first is done
            if self._closed:
                return
            stager, self._stager = self._stager, None
            if stager is not None:
                stager.close()  # finishes the staged ops while the device is still open
            self._closed = True  # from here on, calls raise before entering the library
            for p in list(self._persistents):  # children first: they hold registrations
                p._freed = True
            for t in list(self._teams):  # their barrier() and alltoall() in C look no further
                t._fast_closed = True
            lib.host_ctx_shutdown(self._ptr)  # wakes the threads inside, waits for them
            self._cookies.close()
            self._orphans.clear()
            self._shut.set()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"{self!r} was not closed", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Context rank={self.rank}/{self.size} backend={self.backend} {state}>"

    # -- teams ------------------------------------------------------------------------------
    def _make_team(self, team_id: int, ranks: list[int]) -> Team:
        arr = ffi.new("uint32_t[]", ranks)
        self._check(lib.host_team_create(self._handle(), team_id, len(ranks), arr,
                                         int(self.config.post_timeout * 1e9)),
                    f"creating team {team_id}")
        return Team(self, team_id, ranks)

    def _rank_list(self, closed: bool) -> list[int]:
        """The ring's failed (or closed) set, ascending (host_failed_list)."""
        h = self._handle()
        fn = lib.host_closed_list if closed else lib.host_failed_list
        out = ffi.new("uint32_t[]", self.size)
        n = fn(h, out, self.size)
        self._check(min(n, 0), "reading the failed and closed ranks")
        return [int(out[i]) for i in range(min(n, self.size))]

    def _gone_mask(self) -> int:
        """World ranks known to have failed or closed, one bit each."""
        return sum(1 << r for r in set(self._rank_list(False)) | set(self._rank_list(True)))

    def _agree(self, team: Team, failed: int, value: int, fp: int, what: str
               ) -> tuple[int, int, int]:
        """Fault-tolerant agreement among team's live members (OFFLOAD_OP_AGREE): every one
        gets the same (failed ranks: the union of what each knew, and who was gone; value:
        the largest proposed; a member whose fp differed, or -1)."""
        words = lib.offload_rank_words(self.size)
        # The 32-byte header, then the failed bitmap (offload_agree_args): 8-aligned.
        block = ffi.new("uint64_t[]", lib.offload_agree_args_bytes(self.size) // 8)
        args = ffi.cast("struct offload_agree_args *", block)
        args.nranks, args.words, args.value, args.fp = self.size, words, value, fp
        bits = lib.offload_agree_failed(args)
        for i in range(words):
            bits[i] = failed >> (64 * i) & 0xFFFF_FFFF_FFFF_FFFF
        op = ffi.new("struct host_op *")
        op.opcode = lib.OFFLOAD_OP_AGREE
        op.team = team.id
        op.aux_addr = int(ffi.cast("uintptr_t", args))
        op.aux_len = ffi.sizeof(block)
        self._post(op, what, (block,)).wait()
        agreed = sum(int(bits[i]) << (64 * i) for i in range(words) if bits[i])
        return agreed, int(args.value), int(args.differs) - 1

    def _new_team_id(self, team_id: int) -> int:
        if team_id >= MAX_TEAMS:
            raise OffloadError(f"at most {MAX_TEAMS} teams (world included) can exist in a job")
        self._next_team = max(self._next_team, team_id + 1)
        return team_id

    def create_team(self, ranks: Sequence[int]) -> Team | None:
        """Collective over all live ranks (same list everywhere, in the same order); members
        get a Team, others None. The ranks agree on it first: a rank that passed another
        list makes it fail on every rank (InvalidArgument naming it)."""
        self._check_open()
        if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
            raise InvalidArgument(f"team ranks must be a sequence of world ranks, got {brief(ranks)}")
        members = [_commands.integer(r, "a team rank") for r in ranks]
        if not members or len(set(members)) != len(members):
            raise InvalidArgument(f"team ranks {members} must be non-empty and distinct")
        bad = [r for r in members if not 0 <= r < self.size]
        if bad:
            raise InvalidArgument(f"team ranks {bad} are outside the world (size {self.size})")
        _, team_id, differs = self._agree(self.world, self._gone_mask(), self._next_team,
                                          _commands.list_fp(members), "create_team")
        if differs >= 0:
            raise InvalidArgument(
                f"create_team({members}): rank {differs} passed another member list (or the "
                "same members in another order); every rank must pass the same list")
        team_id = self._new_team_id(team_id)
        return self._make_team(team_id, members) if self.rank in members else None

    def shrink(self) -> Team:
        """The world without the ranks that failed or closed (ULFM's MPI_Comm_shrink): call
        it on every live rank after a PeerFailure; every one gets the same team, whatever
        each one knew of the failures and whenever it calls, and further failures during
        the call do not change that. Equivalent to ``ctx.world.shrink()``."""
        return self.world.shrink()

    # -- memory -----------------------------------------------------------------------------
    def _register(self, buf: Buffer, access: int) -> tuple[int, bool]:
        if buf.nbytes == 0:
            return 0, False
        key = ffi.new("uint32_t *")
        owned = ffi.new("int *")
        self._check(lib.host_mr_acquire(self._handle(), ffi.cast("void *", buf.addr), buf.nbytes,
                                     access, key, owned), "registering memory")
        return int(key[0]), bool(owned[0])

    def _release_key(self, key: int) -> None:
        if not self._closed:
            lib.host_mr_release(self._ptr, key)

    def empty(self, shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
        """A numpy array in registered job-shared memory: peers copy into it directly."""
        self._check_open()
        dt = _commands.dtype_of(dtype)
        dims = [_commands.integer(d, "a dimension of shape") for d in
                (shape if isinstance(shape, (tuple, list)) else [shape])]
        if any(d < 0 for d in dims):
            raise InvalidArgument(f"shape {shape!r} has a negative dimension")
        count = math.prod(dims)
        nbytes = count * dt.itemsize
        if nbytes > _commands.MAX_COUNT:
            raise InvalidArgument(f"shape {shape!r} of {dt} is {nbytes} bytes: more than any "
                                  "buffer holds")
        addr = ffi.new("void **")
        key = ffi.new("uint32_t *")
        self._check(lib.host_alloc_shared(self._handle(), nbytes, addr, key),
                    "allocating shared memory")
        ref = weakref.ref(self)

        def release(ptr: Any) -> None:
            ctx = ref()
            handle = None if ctx is None else ctx._ptr  # closed: it only unmaps
            lib.host_free_shared(handle if handle is not None else ffi.NULL, ptr, nbytes)

        owner = ffi.gc(addr[0], release)
        return np.frombuffer(ffi.buffer(owner, nbytes), dtype=dt, count=count).reshape(shape)

    def _scratch(self) -> _reduce.ScratchPool:
        """The registered scratch the reductions' commands name (made on first use)."""
        with self._lock:
            pool = self.__dict__.get("_scratch_pool")
            if pool is None:
                pool = self._scratch_pool = _reduce.ScratchPool(self)
            return pool

    # -- posting ----------------------------------------------------------------------------
    def _gpu(self) -> _staging.Stager:
        """The stager GPU buffers go through: GPUDirect where the device registers dma-bufs
        (FlexIO), else staged through host memory (the emulator)."""
        with self._lock:
            if self._stager is None:
                from offload_lib import _cuda

                key = ffi.new("uint32_t *")
                # A probe that registers nothing: -EINVAL (fd -1) if supported, else
                # -EOPNOTSUPP.
                direct = lib.host_mr_acquire_dmabuf(self._handle(), 0, 0, -1, 0, key) != \
                    -errno.EOPNOTSUPP
                self._stager = _staging.Stager(self, _cuda.driver(), direct)
                for p in [*self._persistents, *self._teams]:  # their C calls look no further
                    p._staged = True  # (_persistent() and Team() read the stager under this lock)
            return self._stager

    # -- posting: what Team, the stager and the reductions submit through ---------------------
    def _submit(self, cmd: _commands.Command) -> Any:
        """Post an encoded collective on its (src, dst) buffers; GPU memory goes through the
        stager: registered directly (GPUDirect), or staged through host memory."""
        s, d = cmd.bufs
        keep = (s.obj, d.obj, *cmd.keep)
        if not (s.on_gpu or d.on_gpu):
            return self._post_host(cmd, keep)
        g = self._gpu()
        if g.direct:
            return g.direct_op(cmd.op, cmd.what, cmd.bufs, keep, cmd.result, cmd.itemsize)
        assert cmd.staged is not None
        return cmd.staged(g)

    def _post_host(self, cmd: _commands.Command, keep: tuple[Any, ...] | None = None) -> Request:
        """Post a command on host buffers (the stager's staged pieces too): host_post
        registers them once and keeps that for the next op on them."""
        s, d = cmd.bufs
        op = cmd.op
        if s.nbytes:
            op.src_cookie = self._cookies.cookie(s)
        if d.nbytes:
            op.dst_cookie = self._cookies.cookie(d)
        if keep is None:
            keep = (s.obj, d.obj, *cmd.keep)
        return self._post(op, cmd.what, keep, cmd.result, cmd.nbytes, cmd.itemsize)

    def _post(self, op: Any, what: str, keep: tuple[Any, ...], result: Result | None = None,
              nbytes: int = 0, itemsize: int | None = None) -> Request:
        op.small = small = nbytes <= SMALL_MAX_BYTES
        req = self._post_ready(int(ffi.cast("uintptr_t", op)), what, keep, small, itemsize)
        if result is not None:  # before anyone can wait: the caller has it only now
            req._result = result
        return req

    def _make_way(self) -> None:
        """Before a post: staged ops called earlier take their place in line first, and
        completions of requests nobody waits for are reaped."""
        if self._stager is not None:
            self._stager.drain()
        if self._orphans:
            self._reap_orphans()

    def _post_ready(self, op_addr: int, what: str, keep: tuple[Any, ...], small: bool,
                    itemsize: int | None) -> Request:
        """Post an encoded host_op as it is (op_addr: its address; host_post copies it):
        the Request is made in C."""
        self._make_way()
        return _fast.post(self, op_addr, self._post_timeout_ns, what, keep,
                          self._poll_ns if small else 0, itemsize)

    def _post_tag(self, op: Any, what: str, nbytes: int, tagp: Any) -> int:
        """Post op (moving nbytes per rank) and return its tag (persistent requests)."""
        self._make_way()
        op.small = nbytes <= SMALL_MAX_BYTES
        rc = lib.host_post(self._handle(), op, self._post_timeout_ns, tagp)
        if rc:
            self._check(rc, f"posting {what}")
        return int(tagp[0])

    def _persistent(self, op: Any, what: str, keys: list[int], keep: tuple[Any, ...],
                    result: Result | None = None, nbytes: int = 0) -> PersistentRequest:
        p = PersistentRequest(self, what, op, keys, keep, result, nbytes)
        with self._lock:  # as _gpu() marks them: a stager made meanwhile is not missed
            self._persistents.add(p)
            p._staged = self._stager is not None
        return p

    def _adopt(self, tag: int, keep: tuple[Any, ...]) -> None:
        if self._closed:
            return
        if keep:
            self._orphans[tag] = keep
        else:
            lib.host_abandon(self._ptr, tag)

    def _reap_orphans(self) -> None:
        comp = ffi.new("struct host_completion *")
        for tag in list(self._orphans):
            if lib.host_test(self._handle(), tag, comp) != 0:
                self._orphans.pop(tag, None)  # the stager's poster reaps too

    # -- fault injection --------------------------------------------------------------------
    def set_mcast_faults(self, loss: float | None = None, reorder: float | None = None
                         ) -> tuple[float, float]:
        """Emulator: from now on this rank's NIC loses (and delivers out of order) this
        fraction of the multicast chunks it receives, like the ``mcast_loss`` and
        ``mcast_reorder`` config keys, which set them at start; None keeps a value as it
        is. Returns the previous (loss, reorder). Call it on every rank at the same point
        (after a barrier) for a run to reproduce. Hardware raises Unsupported."""
        self._check_open()
        new = list(self._mcast_faults)
        for i, (name, value) in enumerate((("loss", loss), ("reorder", reorder))):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0.0 <= float(value) <= 1.0:
                raise InvalidArgument(f"{name} must be a fraction from 0 to 1, got {brief(value)}")
            new[i] = float(value)
        rc = lib.host_set_mcast_faults(self._handle(), int(round(new[0] * 1e6)),
                                       int(round(new[1] * 1e6)))
        if rc == -errno.EOPNOTSUPP:
            raise Unsupported(f"set_mcast_faults: the {self.backend} backend injects no faults "
                              "(a real fabric loses what it loses)")
        self._check(rc, "set_mcast_faults")
        old, self._mcast_faults = self._mcast_faults, (new[0], new[1])
        return old

    # -- introspection ----------------------------------------------------------------------
    def failed_ranks(self) -> list[int]:
        """World ranks known to have died. Teams that hold one fail every op with
        PeerFailure; ``create_team`` over the survivors gives a working team again."""
        return self._rank_list(False)

    def closed_ranks(self) -> list[int]:
        """World ranks that closed their context (left the job cleanly). Ops that needed
        one fail with PeerClosed; ``shrink()`` leaves them out."""
        return self._rank_list(True)

    def stats(self) -> dict[str, Any]:
        """Firmware counters: totals and per DPA thread."""
        n = lib.host_num_threads(self._handle())
        raw = ffi.new("uint64_t[]", n * _STAT_WORDS)
        self._check(lib.host_stats(self._ptr, raw, n), "stats")
        per_thread = [
            {f: int(raw[t * _STAT_WORDS + i]) for i, f in enumerate(_STAT_FIELDS)}
            for t in range(n)
        ]
        totals = {f: sum(t[f] for t in per_thread) for f in _STAT_FIELDS}
        host = ffi.new("struct host_drive_stats *")
        lib.host_drive_stats(self._ptr, host)
        mr = ffi.new("uint64_t[2]")
        cached = ffi.new("uint32_t *")
        lib.host_mr_cache_stats(self._ptr, mr, mr + 1, cached)
        gpu = {"path": "none", "ops": 0, "pieces": 0, "d2h_bytes": 0, "h2d_bytes": 0}
        if self._stager is not None:
            gpu.update(self._stager.stats)
        return {
            "backend": self.backend,
            "failed_ranks": self.failed_ranks(),
            "gpu": gpu,
            "bytes": totals["bytes_written"],
            "chunks": totals["writes"],
            **totals,
            # cooperative progress: ops whose completion a host thread's pass wrote; its passes
            "progress": self.progress, "host_ops": int(host.ops), "host_passes": int(host.passes),
            # work handed to the progress threads, and how much had to wake one (idle_poll_us)
            "doorbells": int(host.doorbells),
            "doorbell_wakes": int(host.doorbell_wakes),
            # cooperative waits (host threads running the firmware until a completion), their
            # sleeps, the yields to a thread of the job waiting for the core instead (one per
            # wait, per sleep, per pass with news after one), small posts that yielded to one
            "host_waits": int(host.waits),
            "host_sleeps": int(host.sleeps),
            "handoff_yields": int(host.handoff_yields),
            "handoff_rearms": int(host.handoff_rearms),
            "post_yields": int(host.post_yields),
            # peers' wake-ups handed to a thread of the job on the sleeper's CPU (a local
            # wake-up, not an inter-processor interrupt); moves to a CPU with fewer ranks
            "wake_handovers": int(host.wake_handovers),
            "balance_moves": int(host.balance_moves),
            # emulator: bytes this rank sent into peers' ordinary memory through the wire's
            # slots (placed by their own threads), bytes of those writes that went by
            # process_vm_writev instead (the wire full, a stalled target), and the pieces
            # it took back from a target that did not place them (wire_min, emu_wire.c),
            # and bytes of writes the wire could have taken that went by process_vm_writev
            # by its choice: that cost less lately, or a probe keeping its cost measured
            "wire_bytes": int(host.wire_bytes),
            "wire_direct_bytes": int(host.wire_direct_bytes),
            "wire_rescues": int(host.wire_rescues),
            "wire_skipped_bytes": int(host.wire_skipped_bytes),
            # memory registrations made (host_post's and persistent requests'), op buffers
            # the registration cache already held, and the registrations it holds now
            "registrations": int(mr[0]),
            "cache_hits": int(mr[1]),
            "cached_registrations": int(cached[0]),
            "threads": per_thread,
        }
