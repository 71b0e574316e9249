"""First contact with a DPA, step by step (``dpa-offload bringup``).

Each step runs in a child process with a time bound (a step that hangs or crashes cannot
take the others with it) and prints one line: what it checked and what it found, or why
it failed and what to check next. Steps below the public API call the FlexIO backend's
``dpaoffload_flexio_probe(stage)``; the rest use the public API on one rank and on two.
"""
from __future__ import annotations

import subprocess
import sys

__all__ = ["backend_probe"]

_PROBE = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
buf = ctypes.create_string_buffer(1024)
rc = lib.dpaoffload_flexio_probe(int(sys.argv[2]), buf, len(buf))
print(rc)
print(buf.value.decode(errors="replace"))
'''


def backend_probe(library: str, stage: int, timeout: float = 60.0) -> tuple[int, str]:
    """(0, what was found) or (-failed stage, why) from the backend's probe at ``stage``
    (1 device, 2 DPA process, 3 RPC), run in a child process."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, library, str(stage)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -stage, f"no answer within {timeout:g} s"
    lines = r.stdout.splitlines()
    if r.returncode or len(lines) < 2:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return -stage, f"the probe process failed: {why}"
    return int(lines[0]), lines[1]
