"""Helpers of the simulator tests: run dpa-sim, parse its JSON lines."""
from __future__ import annotations

import json
import subprocess
from typing import Any

from offload_lib import sim_model


def sim(*args: str, timeout: float = 120, check: bool = True) -> list[dict[str, Any]]:
    """dpa-sim with these arguments; its JSON lines (the last is the summary)."""
    proc = subprocess.run([str(sim_model.binary()), *args], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode not in (0, 1):
        raise AssertionError(f"dpa-sim {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
