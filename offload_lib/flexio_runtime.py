"""Which FlexIO runtime the flexio backend runs on: NVIDIA's (``vendor``: DOCA's libflexio
and a BlueField's DPA) or the FlexIO model (``model``: emulator/flexio_model, the vendor
runtime emulated beneath the very same binding, queues and all).

The model is built on demand into ``build/flexio_model`` of the source tree (or
``OFFLOAD_FLEXIO_MODEL_DIR``): emulator/flexio_model/build.sh makes an SDK tree (headers,
libfxm-model.so named as libflexio/libibverbs/libmlx5, the model's dpacc), and
scripts/build_flexio.sh builds the hardware binding against it, unchanged. Concurrent
builders (the ranks of a job) take turns on a file lock; a build is redone when a source
is newer than its output.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from offload_lib.errors import OffloadError

__all__ = ["ROOT", "model_dir", "model_backend", "model_sdk", "build_model", "model_is_current",
           "main"]

ROOT = Path(__file__).resolve().parent.parent
BACKEND_LIBRARY = "libdpaoffload_flexio.so"
_SOURCES = ("emulator/flexio_model", "dpa_firmware", "host/src/flexio", "host/include",
            "scripts/build_flexio.sh", "build_defs.py")


def model_dir() -> Path:
    env = os.environ.get("OFFLOAD_FLEXIO_MODEL_DIR")
    return Path(env) if env else ROOT / "build" / "flexio_model"


def model_sdk() -> Path:
    return model_dir() / "sdk"


def model_backend() -> Path:
    return model_dir() / "backend" / BACKEND_LIBRARY


def _newest_source() -> float:
    newest = 0.0
    for rel in _SOURCES:
        path = ROOT / rel
        if path.is_file():
            newest = max(newest, path.stat().st_mtime)
            continue
        for p in path.rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                newest = max(newest, p.stat().st_mtime)
    return newest


def model_is_current() -> bool:
    out = model_backend()
    return out.exists() and out.stat().st_mtime >= _newest_source()


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise OffloadError(f"building {what} failed ({' '.join(cmd)}):\n{tail}")


def build_model(force: bool = False) -> Path:
    """The model-built backend library, (re)built first if needed; OffloadError says what
    failed to build."""
    if not (ROOT / "emulator" / "flexio_model" / "build.sh").exists():
        raise OffloadError(f"the FlexIO model's sources are not here ({ROOT}/emulator/"
                           "flexio_model): it runs from a source checkout")
    out = model_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and model_is_current():
            return model_backend()
        env = dict(os.environ)
        _run(["sh", "emulator/flexio_model/build.sh", str(out)], env, "the FlexIO model")
        sdk = str(model_sdk())
        env.update(DOCA_DIR=sdk, FLEXIO_DIR=sdk, OUT_DIR=str(out / "backend"),
                   PYTHON=sys.executable)
        env.pop("DPACC", None)
        _run(["sh", "scripts/build_flexio.sh"], env, "the FlexIO binding against the model")
    return model_backend()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["build"] or len(args) > 2 or (len(args) == 2 and args[1] != "--force"):
        print("usage: python -m offload_lib.flexio_runtime build [--force]", file=sys.stderr)
        return 2
    try:
        print(build_model(force=len(args) == 2))
    except OffloadError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
