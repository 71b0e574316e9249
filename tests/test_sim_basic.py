"""Exact results in the simulator, real bytes: every collective (all-to-all, all-to-all-v in
each mode, barrier, broadcast, all-gather, reduce-scatter, allreduce) at every world size
2..64, each result compared byte for byte (guards past every destination too)."""
from __future__ import annotations

import pytest

from _sim import sim


@pytest.mark.timeout(240)
def test_every_collective_exact_at_n_2_to_64():
    out = sim("check", "n=2..64", "threads=4", timeout=230)
    assert out[-1] == {"worlds": 63, "failures": 0}, out[:-1]


@pytest.mark.timeout(120)
def test_one_thread_per_rank_exact():
    out = sim("check", "n=2..12", "threads=1")
    assert out[-1] == {"worlds": 11, "failures": 0}, out[:-1]


@pytest.mark.parametrize("coll", ["alltoall", "alltoallv", "allgather", "broadcast", "barrier"])
def test_run_reports_a_time(coll):
    res = sim("run", f"coll={coll}", "n=16", "size=4096", "threads=4")[-1]
    assert res["ok"] and res["time_ps"] > 0 and res["events"] > 0
