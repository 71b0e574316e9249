"""Exploration finds planted bugs (slow: builds the simulator twice). In a scratch copy of
the firmware, remove the ready handshake's wait, or let a receiver complete before its
source's done signal: the explorer must fail within 1,000 seeds (scripts/sim_planted.py
does the planting; the seed counts are printed for the record)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import sim_planted  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mutant", sorted(sim_planted.MUTANTS))
def test_explorer_finds_planted_bug(mutant, tmp_path):
    binary = sim_planted.build_mutant(mutant, tmp_path)
    seed, ran, err = sim_planted.first_failure(binary, 0, 999)
    print(f"{mutant}: first failing seed {seed} after {ran} seeds: {err}")
    assert seed is not None and ran <= 1000
