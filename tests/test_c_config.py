"""The C API's settings are offload_lib's config table: same names, defaults and verdicts
on bad values (the C library is loaded with ctypes here; C programs read OFFLOAD_* alike)."""
from __future__ import annotations

import ctypes

import pytest

from offload_lib import config, mpi_lib
from offload_lib.errors import ConfigError

C_KEYS = ["backend", "dpa_threads", "chunk_size", "ring_entries", "post_timeout", "op_timeout",
          "rails", "mtu", "mcast_roots", "mcast_rq_depth", "mcast_placement", "link_rate",
          "mcast_loss", "mcast_reorder", "mcast_seed", "bootstrap_timeout", "spin_us", "idle_poll_us", "progress",
          "eager_max"]


@pytest.fixture
def c(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith("OFFLOAD_"):
            monkeypatch.delenv(key)
    lib = ctypes.CDLL(str(mpi_lib.c_library()))
    lib.dpo_last_error.restype = ctypes.c_char_p
    cfg = ctypes.c_void_p()
    assert lib.dpo_config_read(ctypes.byref(cfg)) == 0
    yield lib, cfg
    lib.dpo_config_release(cfg)


def _get(lib, cfg, key: str) -> str:
    buf = ctypes.create_string_buffer(64)
    assert lib.dpo_config_get(cfg, key.encode(), buf, 64) == 0, key
    return buf.value.decode()


def test_every_c_key_is_a_python_tunable_with_the_same_default(c):
    lib, cfg = c
    names = {t.name for t in config.TUNABLES}
    py = config.load_config(None)
    for key in C_KEYS:
        assert key in names, key
        want = getattr(py, key)
        got = _get(lib, cfg, key)
        if isinstance(want, float):
            assert float(got) == want, key
        else:
            assert got == str(want), key


@pytest.mark.parametrize("key,value", [
    ("mtu", "3000"), ("mtu", "128"), ("ring_entries", "4097"), ("chunk_size", "1K"),
    ("chunk_size", "65M"), ("rails", "0"), ("rails", "9"), ("mcast_loss", "1.5"),
    ("post_timeout", "0"), ("op_timeout", "-1"), ("dpa_threads", "0"), ("dpa_threads", "65"),
    ("backend", "gpu"), ("mcast_placement", "both"), ("spin_us", "x"), ("progress", "auto"),
    ("eager_max", "16K"), ("idle_poll_us", "1000001"),
])
def test_bad_values_are_refused_by_both(c, key, value):
    lib, cfg = c
    with pytest.raises(ConfigError):
        config.load_config({key: value})
    assert lib.dpo_config_modify(cfg, key.encode(), value.encode()) == -1
    assert key.encode() in lib.dpo_last_error()


@pytest.mark.parametrize("key,value,shown", [
    ("chunk_size", "256K", "262144"), ("mtu", "8192", "8192"), ("dpa_threads", "auto", "auto"),
    ("mcast_placement", "staged", "staged"), ("op_timeout", "0", "0"),
])
def test_good_values_are_taken_by_both(c, key, value, shown):
    lib, cfg = c
    config.load_config({key: value})
    assert lib.dpo_config_modify(cfg, key.encode(), value.encode()) == 0
    assert _get(lib, cfg, key) == shown


def test_environment_is_read_and_a_bad_variable_named(c, monkeypatch):
    lib, _ = c
    cfg = ctypes.c_void_p()
    monkeypatch.setenv("OFFLOAD_MTU", "8192")
    assert lib.dpo_config_read(ctypes.byref(cfg)) == 0
    assert _get(lib, cfg, "mtu") == "8192"
    lib.dpo_config_release(cfg)
    monkeypatch.setenv("OFFLOAD_MTU", "1000")
    assert lib.dpo_config_read(ctypes.byref(cfg)) == -1
    assert b"OFFLOAD_MTU=1000" in lib.dpo_last_error()
