"""Shared fixtures. Multi-rank helpers live in tests/_mp.py (``from _mp import run_ranks``)."""
from __future__ import annotations

import os
import sys
import time

import pytest

# _mp.py sits next to this file, build_defs.py (the build definition) one level up: make
# both importable whatever pytest's import mode is.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), _HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

_LAUNCH_ENV = ("OFFLOAD_RANK", "OFFLOAD_SIZE", "OFFLOAD_JOB", "OFFLOAD_LOCAL_RANK")


@pytest.fixture
def ctx(monkeypatch):
    """A one-rank context in the test process, closed afterwards."""
    import offload_lib as ol

    for key in _LAUNCH_ENV:
        monkeypatch.delenv(key, raising=False)
    c = ol.init()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def test_seed() -> int:
    """Seed for randomised sizes: OFFLOAD_TEST_SEED if set, else the clock. Printed once."""
    raw = os.environ.get("OFFLOAD_TEST_SEED", "")
    seed = int(raw) if raw else int(time.time_ns() % 2**31)
    print(f"\n[dpa-offload tests] OFFLOAD_TEST_SEED={seed}")
    return seed


# Tests marked slow (minutes: the planted-bug builds, scale runs) run with --run-slow or
# OFFLOAD_RUN_SLOW=1 only, so that the default suite stays within its CI budget.
def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: minutes long; run with --run-slow or OFFLOAD_RUN_SLOW=1")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get("OFFLOAD_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow or OFFLOAD_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
