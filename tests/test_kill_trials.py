"""A seeded, CI-sized run of scripts/kill_trials.py (8 ranks, a random rank killed at a
random point of a stream of collectives, then the documented recovery: PeerFailure within
1 s, shrink, an exact all-to-all; nothing left in /dev/shm, no orphan process). The
recorded 50-trial runs are in docs/reliability.md."""
from __future__ import annotations

import importlib.util
import os

import pytest

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                       "kill_trials.py")


@pytest.mark.timeout(240)
def test_random_kills_at_8_ranks_recover_by_shrink(capsys):
    spec = importlib.util.spec_from_file_location("kill_trials", _SCRIPT)
    assert spec is not None and spec.loader is not None
    kill_trials = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kill_trials)
    trials = os.environ.get("KILL_TRIALS", "4")
    rc = kill_trials.main(["--trials", trials, "-n", "8", "--seed", "7"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{trials}/{trials} trials passed" in out, out
