"""offload_lib.config: defaults, YAML, env precedence, size strings and every kind of bad input."""
from __future__ import annotations

import dataclasses

import pytest

from offload_lib.config import TUNABLES, Config, describe, load_config
from offload_lib.errors import ConfigError, InvalidArgument

KEYS = [t.name for t in TUNABLES]

DEFAULTS = {
    "backend": "auto",
    "flexio_runtime": "vendor",
    "dpa_threads": "auto",
    "chunk_size": 1048576,
    "gpu_piece": 4194304,
    "ring_entries": 256,
    "post_timeout": 10.0,
    "op_timeout": 300.0,
    "rails": 1,
    "rail_faults": "",
    "mtu": 4096,
    "mcast_roots": 2,
    "mcast_rq_depth": 1024,
    "mcast_placement": "direct",
    "link_rate": 10.0,
    "mcast_loss": 0.0,
    "mcast_reorder": 0.0,
    "mcast_seed": 1,
    "bootstrap_timeout": 60.0,
    "spin_us": 20,
    "idle_poll_us": 50000,
    "progress": "cooperative",
    "wire_min": 65536,
    "eager_max": 8192,
}


def write(tmp_path, text: str, name: str = "offload.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_config(env={})
    assert cfg.as_dict() == DEFAULTS
    assert cfg == Config()
    assert [name for name, _, _ in describe()] == list(DEFAULTS)
    assert all(desc for _, _, desc in describe())
    assert dict((n, d) for n, d, _ in describe())["chunk_size"] == "1048576"


def test_config_is_frozen_and_validated():
    cfg = Config(dpa_threads=4, chunk_size="1M")
    assert cfg.chunk_size == 1 << 20
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dpa_threads = 8  # type: ignore[misc]
    with pytest.raises(ConfigError, match="dpa_threads"):
        Config(dpa_threads=0)


def test_yaml_file(tmp_path):
    path = write(tmp_path, "backend: emulator\ndpa_threads: 4\nchunk_size: 1M\npost_timeout: 2\n")
    cfg = load_config(path, env={})
    assert (cfg.backend, cfg.dpa_threads, cfg.chunk_size, cfg.post_timeout) == (
        "emulator", 4, 1 << 20, 2.0)
    assert cfg.ring_entries == 256
    assert load_config(str(path), env={}) == cfg


def test_empty_yaml_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "# nothing\n"), env={}) == Config()


def test_offload_config_env_names_the_file(tmp_path):
    path = write(tmp_path, "dpa_threads: 3\n")
    assert load_config(env={"OFFLOAD_CONFIG": str(path)}).dpa_threads == 3
    # an explicit config wins over OFFLOAD_CONFIG
    other = write(tmp_path, "dpa_threads: 5\n", "other.yaml")
    assert load_config(other, env={"OFFLOAD_CONFIG": str(path)}).dpa_threads == 5
    assert load_config({}, env={"OFFLOAD_CONFIG": str(path)}).dpa_threads == "auto"


def test_env_overrides_file_and_mapping(tmp_path):
    path = write(tmp_path, "dpa_threads: 4\nspin_us: 10\n")
    env = {"OFFLOAD_DPA_THREADS": "8", "OFFLOAD_EAGER_MAX": "1K", "OFFLOAD_CHUNK_SIZE": "64KiB"}
    cfg = load_config(path, env=env)
    assert (cfg.dpa_threads, cfg.spin_us, cfg.eager_max, cfg.chunk_size) == (8, 10, 1024, 65536)
    assert load_config({"dpa_threads": 4}, env=env).dpa_threads == 8
    assert load_config(Config(dpa_threads=4), env=env).dpa_threads == 8
    assert load_config(Config(dpa_threads=4), env={}).dpa_threads == 4


def test_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("OFFLOAD_BACKEND", "Emulator")
    assert load_config().backend == "emulator"


def test_reserved_unknown_and_empty_env_vars_are_ignored():
    env = {
        "OFFLOAD_RANK": "3", "OFFLOAD_SIZE": "8", "OFFLOAD_JOB": "dpaoff-0-1-x",
        "OFFLOAD_LOCAL_RANK": "3", "OFFLOAD_CONFIG": "", "OFFLOAD_SOMETHING_ELSE": "???",
        "OFFLOAD_DPA_THREADS": "",
    }
    assert load_config(env=env) == Config()


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("4096B", 4096), ("256K", 256 << 10), ("256k", 256 << 10),
    ("64KiB", 64 << 10), ("64 KiB", 64 << 10), ("1M", 1 << 20), ("1MB", 1 << 20),
    ("1MiB", 1 << 20), ("64M", 64 << 20), (" 512K ", 512 << 10), (131072, 131072),
])
def test_size_strings(text, expected):
    assert load_config({"chunk_size": text}, env={}).chunk_size == expected
    if isinstance(text, str):
        assert load_config(env={"OFFLOAD_CHUNK_SIZE": text}).chunk_size == expected


BAD_VALUES = [
    ("backend", "gpu"), ("backend", 1), ("backend", ""),
    ("flexio_runtime", "doca"), ("flexio_runtime", 1),
    ("dpa_threads", 0), ("dpa_threads", 65), ("dpa_threads", "two"), ("dpa_threads", "autox"), ("dpa_threads", 2.5),
    ("dpa_threads", True), ("dpa_threads", None), ("dpa_threads", [2]),
    ("chunk_size", 4095), ("chunk_size", "64MiB1"), ("chunk_size", "65M"), ("chunk_size", "1G"),
    ("chunk_size", "1.5M"), ("chunk_size", "-4096"), ("chunk_size", "256X"),
    ("gpu_piece", "32K"), ("gpu_piece", "2G"), ("gpu_piece", "big"),
    ("ring_entries", 100), ("ring_entries", 4), ("ring_entries", 8192), ("ring_entries", 0),
    ("ring_entries", "lots"),
    ("post_timeout", 0), ("post_timeout", -1), ("post_timeout", "soon"), ("post_timeout", "inf"),
    ("mtu", 4000), ("mtu", 128), ("mcast_loss", 1.5), ("mcast_loss", -0.1),
    ("mcast_reorder", "some"), ("mcast_rq_depth", 1), ("link_rate", 0), ("mcast_roots", 0),
    ("mcast_seed", -1), ("mcast_seed", "x"), ("mcast_placement", "ud"), ("mcast_placement", 1),
    ("rails", 0), ("rails", 9), ("rail_faults", "0"), ("rail_faults", "x@1M"),
    ("rail_faults", "8@1M"), ("rail_faults", "1:0@lots"), ("rail_faults", 5),
    ("op_timeout", -1), ("op_timeout", 86401), ("op_timeout", "inf"), ("op_timeout", "never"),
    ("bootstrap_timeout", 0.0), ("bootstrap_timeout", "nan"), ("bootstrap_timeout", False),
    ("spin_us", -1), ("spin_us", 100_001), ("spin_us", "1e3"),
    ("idle_poll_us", -1), ("idle_poll_us", 1_000_001), ("idle_poll_us", "50ms"),
    ("progress", "threads-only"), ("progress", 1),
    ("wire_min", -1), ("wire_min", "2G"), ("wire_min", "lots"),
    ("eager_max", "16K"), ("eager_max", -1), ("eager_max", "lots"),
]


@pytest.mark.parametrize("key, value", BAD_VALUES)
def test_bad_value_names_key_value_and_allowed(key, value):
    with pytest.raises(ConfigError) as info:
        load_config({key: value}, env={})
    msg = str(info.value)
    assert repr(key) in msg and repr(value) in msg and "expected" in msg


@pytest.mark.parametrize("key, value", [(k, v) for k, v in BAD_VALUES if isinstance(v, str) and v])
def test_bad_env_value_names_the_variable(key, value):
    var = "OFFLOAD_" + key.upper()
    with pytest.raises(ConfigError, match=var) as info:
        load_config(env={var: value})
    assert repr(key) in str(info.value)


def test_every_key_is_covered_by_a_bad_value():
    assert {k for k, _ in BAD_VALUES} == set(KEYS)


def test_a_removed_key_says_what_replaced_it():
    with pytest.raises(ConfigError, match=r"'yield_us' .*was removed: .*spin_us"):
        load_config({"yield_us": 2000}, env={})


def test_bad_value_in_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "ring_entries: 100\n")
    with pytest.raises(ConfigError, match="ring_entries") as info:
        load_config(path, env={})
    assert str(path) in str(info.value) and "power of two" in str(info.value)


def test_unknown_key_in_mapping():
    with pytest.raises(ConfigError) as info:
        load_config({"chunksize": 4096}, env={})
    msg = str(info.value)
    assert "'chunksize'" in msg and "chunk_size" in msg
    assert all(key in msg for key in KEYS)


def test_unknown_key_in_yaml(tmp_path):
    path = write(tmp_path, "dpa_threads: 4\nrank: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    msg = str(info.value)
    assert "'rank'" in msg and str(path) in msg and all(key in msg for key in KEYS)


def test_missing_yaml_file_names_the_path(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match="OFFLOAD_CONFIG") as info:
        load_config(env={"OFFLOAD_CONFIG": str(path)})
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ["dpa_threads: [1, 2\n", "- 1\n- 2\n", "just a string\n"])
def test_malformed_yaml(tmp_path, text):
    path = write(tmp_path, text, "bad.yaml")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(path, env={})


def test_yaml_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=str(tmp_path)):
        load_config(tmp_path, env={})


def test_wrong_config_type():
    with pytest.raises(ConfigError, match="int"):
        load_config(42, env={})  # type: ignore[arg-type]


def test_config_error_is_invalid_argument():
    assert issubclass(ConfigError, InvalidArgument)
