"""Tunables of offload_lib: one table, one frozen Config, one loader.

Precedence, lowest first: the table's defaults, then a YAML file (``config`` as a path, or the
``OFFLOAD_CONFIG`` env var when ``config`` is None) or a mapping, then ``OFFLOAD_<KEY>`` env vars.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import yaml

from offload_lib._native import lib
from offload_lib.errors import ConfigError

__all__ = ["Config", "Tunable", "TUNABLES", "RESERVED_ENV", "load_config", "describe"]

ENV_PREFIX = "OFFLOAD_"
# Set by the launcher / bootstrap, never config keys.
RESERVED_ENV = frozenset(
    {"OFFLOAD_CONFIG", "OFFLOAD_RANK", "OFFLOAD_SIZE", "OFFLOAD_JOB", "OFFLOAD_LOCAL_RANK"}
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

Validator = Callable[[Any], Any]


@dataclass(frozen=True)
class Tunable:
    name: str
    type: type
    default: Any
    description: str
    # Returns the normalised value or raises ValueError whose text says what is allowed.
    validator: Validator


# ---------------------------------------------------------------------------------------------
# validators


def _as_int(value: Any, allowed: str) -> int:
    # bool is an int subclass; "dpa_threads: yes" must not become 1.
    if isinstance(value, bool):
        raise ValueError(allowed)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            raise ValueError(allowed) from None
    raise ValueError(allowed)


def _int_range(lo: int, hi: int) -> Validator:
    allowed = f"an integer from {lo} to {hi}"

    def check(value: Any) -> int:
        n = _as_int(value, allowed)
        if not lo <= n <= hi:
            raise ValueError(allowed)
        return n

    return check


def _pow2_range(lo: int, hi: int) -> Validator:
    allowed = f"a power of two from {lo} to {hi}"

    def check(value: Any) -> int:
        n = _as_int(value, allowed)
        if not lo <= n <= hi or n & (n - 1):
            raise ValueError(allowed)
        return n

    return check


_SIZE_RE = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB}
_SIZE_HINT = "a size in bytes, e.g. 262144, 256K, 1M or 64KiB"


def parse_size(value: Any) -> int:
    """Bytes from an int or a string like "4096", "256K", "1M", "64KiB" (units are binary)."""
    if isinstance(value, str):
        m = _SIZE_RE.fullmatch(value.strip())
        if m:
            return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
        raise ValueError(_SIZE_HINT)
    return _as_int(value, _SIZE_HINT)


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _size_range(lo: int, hi: int) -> Validator:
    allowed = (f"a size in bytes from {_fmt_size(lo)} to {_fmt_size(hi)} "
               "(e.g. 262144, 256K, 1M, 64KiB)")

    def check(value: Any) -> int:
        try:
            n = parse_size(value)
        except ValueError:
            raise ValueError(allowed) from None
        if not lo <= n <= hi:
            raise ValueError(allowed)
        return n

    return check


def _finite_float(value: Any, allowed: str) -> float:
    """A finite float from a number or a numeric string (not a bool), else ValueError(allowed).
    inf/nan would overflow the nanosecond deadlines of the C core."""
    if isinstance(value, bool):
        raise ValueError(allowed)
    try:
        x = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise ValueError(allowed) from None
    if not math.isfinite(x):
        raise ValueError(allowed)
    return x


def _seconds(minimum: float, inclusive: bool) -> Validator:
    allowed = f"a number of seconds {'>=' if inclusive else '>'} {minimum:g}"

    def check(value: Any) -> float:
        x = _finite_float(value, allowed)
        if x < minimum or (x == minimum and not inclusive):
            raise ValueError(allowed)
        return x

    return check


def _float_range(lo: float, hi: float, allowed: str) -> Validator:
    def check(value: Any) -> float:
        x = _finite_float(value, allowed)
        if not lo <= x <= hi:
            raise ValueError(allowed)
        return x

    return check


_op_timeout = _float_range(0.0, 86400.0, "a number of seconds from 0 (never) to 86400")


MAX_RAILS = lib.OFFLOAD_FLEXIO_MAX_RAILS  # ports a rank uses as rails (host_ctx_params.rails)
_RAIL_FAULTS_HINT = ("a comma-separated list of [RANK:]RAIL@BYTES, e.g. '0@512K' (rail 0 of "
                     "every rank fails after 512 KiB sent on it) or '1:0@1M,2:1@0'; '' for none")


def parse_rail_faults(spec: str) -> list[tuple[int | None, int, int]]:
    """(rank or None for every rank, rail, bytes) for each entry of a rail_faults value."""
    out: list[tuple[int | None, int, int]] = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        where, at, size = item.partition("@")
        rank_s, colon, rail_s = where.rpartition(":")
        if not at or not rail_s.strip().isdigit() or (colon and not rank_s.strip().isdigit()):
            raise ValueError(_RAIL_FAULTS_HINT)
        rail = int(rail_s)
        if rail >= MAX_RAILS:
            raise ValueError(f"rail numbers below {MAX_RAILS}; " + _RAIL_FAULTS_HINT)
        out.append((int(rank_s) if colon else None, rail, parse_size(size)))
    return out


def _rail_faults(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(_RAIL_FAULTS_HINT)
    parse_rail_faults(value)
    return value.strip()


def _fraction(hi: float) -> Validator:
    return _float_range(0.0, hi, f"a fraction from 0 to {hi:g} (e.g. 0.05 for 5%)")


def _threads(value: Any) -> int | str:
    allowed = "'auto' or an integer from 1 to 64"
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    n = _as_int(value, allowed)
    if not 1 <= n <= 64:
        raise ValueError(allowed)
    return n


def _choice(*options: str) -> Validator:
    allowed = "one of " + ", ".join(options)

    def check(value: Any) -> str:
        if isinstance(value, str) and value.strip().lower() in options:
            return value.strip().lower()
        raise ValueError(allowed)

    return check


# ---------------------------------------------------------------------------------------------
# the table

TUNABLES: tuple[Tunable, ...] = (
    Tunable("backend", str, "auto",
            "auto (flexio when a DPA is found, else emulator), emulator or flexio",
            _choice("auto", "emulator", "flexio")),
    Tunable("flexio_runtime", str, "vendor",
            "what the flexio backend runs on: vendor (DOCA's libflexio and a BlueField's DPA) "
            "or model (the FlexIO model: the same hardware binding over emulated DPA queues, "
            "emulator/flexio_model, built on first use)",
            _choice("vendor", "model")),
    Tunable("dpa_threads", int, "auto",
            "DPA progress threads per rank (1..64), or auto: in the emulator as many as the "
            "cores can run next to the other ranks (cores // ranks, 1..4)",
            _threads),
    Tunable("chunk_size", int, 1 * MiB,
            "RDMA write piece size in bytes (4 KiB..64 MiB; K/M/G suffixes allowed)",
            _size_range(4 * KiB, 64 * MiB)),
    Tunable("gpu_piece", int, 4 * MiB,
            "GPU buffers staged through host memory move in pieces of about this many bytes "
            "per rank, so that the copies of one piece overlap the network of another "
            "(64 KiB..1 GiB; K/M/G suffixes allowed)",
            _size_range(64 * KiB, 1024 * MiB)),
    Tunable("ring_entries", int, 256,
            "command ring slots (power of two, 8..4096)",
            _pow2_range(8, 4096)),
    Tunable("post_timeout", float, 10.0,
            "seconds a post blocks while the command ring is full (> 0)",
            _seconds(0.0, inclusive=False)),
    Tunable("op_timeout", float, 300.0,
            "seconds after which the firmware aborts an op that has not completed (a peer "
            "that never posts its part, a lost rank); the team is unusable afterwards. "
            "0 = never (0..86400)",
            _op_timeout),
    Tunable("rails", int, 1,
            "network ports (rails) per rank (1..8); the firmware fails over between them",
            _int_range(1, MAX_RAILS)),
    Tunable("rail_faults", str, "",
            "fault injection (emulator): [RANK:]RAIL@BYTES,... takes a rail down after that "
            "many bytes sent on it; '' for none",
            _rail_faults),
    Tunable("mtu", int, 4096,
            "multicast chunk size in bytes (power of two, 256..65536)",
            _pow2_range(256, 65536)),
    Tunable("mcast_roots", int, 2,
            "all-gather: ranks that multicast at once, the token passing along (1..64)",
            _int_range(1, 64)),
    Tunable("mcast_rq_depth", int, 1024,
            "multicast receive queue per member, chunks (2..65536); a member that falls "
            "further behind drops chunks, which the firmware fetches again (senders wait "
            "for credits when a member is a whole ring, at most 1024 chunks, behind)",
            _int_range(2, 65536)),
    Tunable("mcast_placement", str, "direct",
            "multicast receive (emulator): 'direct' places each chunk at its offset, as a "
            "write with immediate is placed; 'staged' receives it into one of "
            "mcast_rq_depth staging slots (at most 512) and the firmware copies it out, as "
            "on a UD queue pair",
            _choice("direct", "staged")),
    Tunable("link_rate", float, 10.0,
            "link rate in GB/s: the multicast receive timeout is derived from size / rate",
            _seconds(0.0, inclusive=False)),
    Tunable("mcast_loss", float, 0.0,
            "fault injection (emulator): fraction of multicast chunks each member loses "
            "(1: every chunk; the firmware then reads everything)",
            _fraction(1.0)),
    Tunable("mcast_reorder", float, 0.0,
            "fault injection (emulator): fraction of multicast chunks delivered out of order",
            _fraction(1.0)),
    Tunable("mcast_seed", int, 1,
            "seed of the multicast fault injection, so a failure reproduces (0..2**63-1)",
            _int_range(0, 2**63 - 1)),
    Tunable("bootstrap_timeout", float, 60.0,
            "seconds to wait for all ranks to join at init (> 0)",
            _seconds(0.0, inclusive=False)),
    Tunable("spin_us", int, 20,
            "microseconds a waiting thread (progress thread, or host thread waiting for a "
            "small op) spins before it sleeps on a futex, and never longer than a wake-up "
            "was measured to cost (0..100000); skipped where the ranks outnumber the cores",
            _int_range(0, 100_000)),
    Tunable("idle_poll_us", int, 50_000,
            "emulator: microseconds a progress thread keeps looking at its queue in naps "
            "(from 2 ms of idle time on, an eighth of it, at most 1 ms) after bulk work, "
            "before it sleeps until woken: a post meanwhile costs the posting thread no "
            "wake-up system call, as a doorbell write on a card (0..1000000; 0: sleep at "
            "once, every doorbell wakes)",
            _int_range(0, 1_000_000)),
    Tunable("progress", str, "cooperative",
            "emulator: 'cooperative' lets a host thread that posts, tests or waits for a "
            "small op (at most 1 MiB per rank) run its rank's firmware itself, so a small "
            "exchange needs no hand-off to a progress thread (that CPU is the calling "
            "thread's); 'threads' leaves all of it to the progress threads (the offload "
            "as on a card: use it to measure what the host is spared)",
            _choice("cooperative", "threads")),
    Tunable("wire_min", int, 64 * KiB,
            "emulator: RDMA writes of at least this many bytes into another rank's ordinary "
            "memory (not ctx.empty()) may go in two copies through slots in the job "
            "segment, the second by the receiving rank's own threads, instead of one "
            "process_vm_writev, which pins the receiver's pages one by one; each goes by "
            "the way that cost less lately, both measured as they go (0: always "
            "process_vm_writev; up to 1 GiB; K/M/G suffixes allowed)",
            _size_range(0, 1024 * MiB)),
    Tunable("eager_max", int, 8 * KiB,
            "all-to-all blocks up to this many bytes per peer, and allreduce vectors up "
            "to this many bytes, go eagerly: straight into the receiver's pre-registered "
            "slots, with no ready round trip, and the receiver copies them out (allreduce: "
            "reduces them there) (0 turns it off; at most 8 KiB, the slot size; every rank "
            "must use the same value)",
            _size_range(0, 8 * KiB)),
)

_TABLE: dict[str, Tunable] = {t.name: t for t in TUNABLES}


def _default(name: str) -> Any:
    return _TABLE[name].default


def _check(t: Tunable, value: Any, source: str) -> Any:
    try:
        return t.validator(value)
    except ValueError as e:
        raise ConfigError(
            f"bad value for config key '{t.name}' ({source}): {value!r}; expected {e}"
        ) from None


# Keys that existed once: naming one says what replaced it, not just "unknown".
_REMOVED = {
    "yield_us": "nothing yields the core any more (a yielding waiter hands it to any "
                "runnable task for a slice); waits spin at most spin_us, then sleep",
}


def _unknown_key(key: Any, source: str) -> ConfigError:
    if key in _REMOVED:
        return ConfigError(f"config key {key!r} ({source}) was removed: {_REMOVED[key]}; "
                           "drop it from the config")
    hint = ""
    if isinstance(key, str):
        close = difflib.get_close_matches(key.lower(), _TABLE, n=1)
        if close:
            hint = f" (did you mean '{close[0]}'?)"
    return ConfigError(
        f"unknown config key {key!r} ({source}){hint}; valid keys: {', '.join(_TABLE)}"
    )


@dataclass(frozen=True)
class Config:
    """Validated tunables; build it with :func:`load_config` (or directly, also validated)."""

    backend: str = _default("backend")
    flexio_runtime: str = _default("flexio_runtime")
    dpa_threads: int | str = _default("dpa_threads")
    chunk_size: int = _default("chunk_size")
    gpu_piece: int = _default("gpu_piece")
    ring_entries: int = _default("ring_entries")
    post_timeout: float = _default("post_timeout")
    op_timeout: float = _default("op_timeout")
    rails: int = _default("rails")
    rail_faults: str = _default("rail_faults")
    mtu: int = _default("mtu")
    mcast_roots: int = _default("mcast_roots")
    mcast_rq_depth: int = _default("mcast_rq_depth")
    mcast_placement: str = _default("mcast_placement")
    link_rate: float = _default("link_rate")
    mcast_loss: float = _default("mcast_loss")
    mcast_reorder: float = _default("mcast_reorder")
    mcast_seed: int = _default("mcast_seed")
    bootstrap_timeout: float = _default("bootstrap_timeout")
    spin_us: int = _default("spin_us")
    idle_poll_us: int = _default("idle_poll_us")
    progress: str = _default("progress")
    wire_min: int = _default("wire_min")
    eager_max: int = _default("eager_max")

    def __post_init__(self) -> None:
        for t in TUNABLES:
            object.__setattr__(self, t.name, _check(t, getattr(self, t.name), "Config()"))

    def as_dict(self) -> dict[str, Any]:
        return {t.name: getattr(self, t.name) for t in TUNABLES}


if [f.name for f in fields(Config)] != list(_TABLE):
    raise RuntimeError("offload_lib.config: Config fields and TUNABLES are out of sync")
if RESERVED_ENV & {ENV_PREFIX + name.upper() for name in _TABLE}:
    raise RuntimeError("offload_lib.config: a config key collides with a reserved env var")


# ---------------------------------------------------------------------------------------------
# loading


def _read_yaml(path: str | os.PathLike[str], via: str) -> Mapping[Any, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {os.fspath(path)}{via}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {os.fspath(path)}{via}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {os.fspath(path)}{via} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {os.fspath(path)}{via} must hold a mapping of keys to values "
            f"(e.g. 'dpa_threads: 4'), not a {type(data).__name__}"
        )
    return data


def load_config(
    config: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Merge defaults < YAML file or mapping < ``OFFLOAD_<KEY>`` env vars into a Config.

    ``config`` may be a YAML path, a mapping, a Config, or None (then ``OFFLOAD_CONFIG`` names
    the YAML file, if set). ``env`` defaults to os.environ; an empty env value counts as unset,
    and OFFLOAD_* variables that are not config keys are ignored.
    """
    env = os.environ if env is None else env
    layer: Mapping[Any, Any] = {}
    source = "defaults"
    if config is None:
        path = env.get("OFFLOAD_CONFIG", "")
        if path:
            layer, source = _read_yaml(path, " (from OFFLOAD_CONFIG)"), f"file {path}"
    elif isinstance(config, Config):
        layer, source = config.as_dict(), "Config"
    elif isinstance(config, Mapping):
        layer, source = config, "config mapping"
    elif isinstance(config, (str, os.PathLike)):
        layer, source = _read_yaml(config, ""), f"file {os.fspath(config)}"
    else:
        raise ConfigError(
            f"config must be a YAML file path, a mapping, a Config or None, "
            f"not {type(config).__name__}"
        )

    values: dict[str, Any] = {}
    for key, value in layer.items():
        if key not in _TABLE:
            raise _unknown_key(key, source)
        values[key] = _check(_TABLE[key], value, source)

    for t in TUNABLES:
        var = ENV_PREFIX + t.name.upper()
        raw = env.get(var)
        if raw is not None and raw.strip():
            values[t.name] = _check(t, raw, f"env {var}")

    return Config(**values)


def describe() -> list[tuple[str, str, str]]:
    """(name, default, description) of every tunable, in table order, for docs and the CLI."""
    return [(t.name, str(t.default), t.description) for t in TUNABLES]
