"""dpa-offload: collectives offloaded to a DPU's Data Path Accelerator (or its emulator).

    import offload_lib as ol
    with ol.init() as ctx:
        ctx.world.alltoall(src, dst).wait()
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

from offload_lib.errors import (
    Canceled,
    ConfigError,
    InvalidArgument,
    OffloadError,
    PeerClosed,
    PeerFailure,
    RemoteAccessError,
    Timeout,
    Unsupported,
)

if TYPE_CHECKING:
    from offload_lib.context import Context

__all__ = [
    "init", "Context", "Team", "Request", "PersistentRequest", "McastStats", "moe",
    "OffloadError", "InvalidArgument", "PeerFailure", "PeerClosed", "Timeout",
    "RemoteAccessError", "ConfigError",
    "Canceled", "Unsupported",
]


def init(config: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> "Context":
    """Bootstrap this rank and open its DPA. Under `dpa-offload run` or mpirun all ranks
    must call it; alone, it makes a one-rank world."""
    from offload_lib.bootstrap import discover
    from offload_lib.config import load_config
    from offload_lib.context import Context
    from offload_lib.discovery import select_backend

    cfg = load_config(config)
    backend, _reason = select_backend(cfg)
    # The emulator and the FlexIO model connect their ranks within one machine.
    world = discover(one_host=backend == "emulator" or cfg.flexio_runtime == "model")
    return Context.from_world(cfg, world, backend)


def __getattr__(name: str) -> Any:
    # The native classes load lazily so that config/launcher work before the build.
    if name in ("Context", "Team"):
        from offload_lib import context

        return getattr(context, name)
    if name in ("Request", "PersistentRequest", "McastStats"):
        from offload_lib import request

        return getattr(request, name)
    if name == "moe":
        import importlib

        return importlib.import_module("offload_lib.moe")
    raise AttributeError(f"module 'offload_lib' has no attribute {name!r}")
