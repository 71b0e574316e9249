"""Which backend to use: look for an RDMA device with a DPA, else fall back to the emulator.

pyverbs is optional and imported lazily; every "not available" answer names what is missing.
"""
from __future__ import annotations

import ctypes.util
from dataclasses import dataclass, field
from typing import Any

from offload_lib.config import Config, load_config
from offload_lib.errors import OffloadError

__all__ = ["describe", "select_backend"]

# The FlexIO / DOCA DPA host runtimes; either one can load our firmware.
_DPA_RUNTIMES = ("flexio", "doca_dpa")


@dataclass
class _Probe:
    dpa_device: str | None  # name of a usable DPA-capable device, None if there is none
    reason: str             # why that device was picked, or what is missing
    devices: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _device_info(dev: Any) -> dict[str, Any]:
    name = getattr(dev, "name", b"?")
    info: dict[str, Any] = {"name": name.decode() if isinstance(name, bytes) else str(name)}
    for attr in ("node_type", "transport_type", "guid"):
        try:
            info[attr] = getattr(dev, attr)
        except Exception:  # pyverbs properties may raise on odd devices; the name is enough
            pass
    return info


def _probe() -> _Probe:
    try:
        import pyverbs.device as verbs_device  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return _Probe(None, "pyverbs is not installed", details={"pyverbs": None})
    except Exception as e:  # a broken install, e.g. a libibverbs ABI mismatch
        return _Probe(None, f"pyverbs failed to import: {e}", details={"pyverbs": None})

    details: dict[str, Any] = {"pyverbs": getattr(verbs_device, "__file__", "?")}
    try:
        devices = [_device_info(d) for d in verbs_device.get_device_list()]
    except Exception as e:
        return _Probe(None, f"no RDMA devices found: {e}", details=details)
    if not devices:
        return _Probe(None, "no RDMA devices found", details=details)

    runtimes = {lib: ctypes.util.find_library(lib) for lib in _DPA_RUNTIMES}
    details["dpa_runtime"] = {k: v for k, v in runtimes.items() if v}
    names = ", ".join(d["name"] for d in devices)
    # Only mlx5 devices (ConnectX-7 / BlueField-3) carry a DPA.
    mlx5 = [d["name"] for d in devices if d["name"].startswith("mlx5")]
    if not mlx5:
        return _Probe(None, f"no DPA-capable device (found {names}; need an mlx5 device)",
                      devices, details)
    if not details["dpa_runtime"]:
        return _Probe(None, f"no DPA-capable device usable: found {', '.join(mlx5)} but neither "
                            "libflexio nor libdoca_dpa (DOCA) is installed", devices, details)
    return _Probe(mlx5[0], f"DPA-capable device {mlx5[0]}", devices, details)


def _select(cfg: Config, probe: _Probe | None) -> tuple[str, str]:
    if cfg.backend == "emulator":
        return "emulator", "requested by config (backend: emulator)"
    probe = _probe() if probe is None else probe
    if probe.dpa_device is not None:
        return "flexio", probe.reason
    if cfg.backend == "flexio":
        raise OffloadError(
            f"backend 'flexio' was requested but is not available: {probe.reason}; "
            "set backend to 'auto' or 'emulator' (e.g. OFFLOAD_BACKEND=emulator) "
            "to use the emulator"
        )
    return "emulator", probe.reason


def select_backend(config: Config | None = None) -> tuple[str, str]:
    """(backend, reason); raises OffloadError when 'flexio' is requested but unavailable."""
    return _select(config if isinstance(config, Config) else load_config(config), None)


def describe(config: Config | None = None) -> dict[str, Any]:
    """What hardware was found and which backend would be used, for ``dpa-offload info``."""
    cfg = config if isinstance(config, Config) else load_config(config)
    probe = _probe()
    try:
        backend, reason = _select(cfg, probe)
    except OffloadError as e:
        backend, reason = "none", str(e)
    return {
        "backend": backend,
        "reason": reason,
        "requested": cfg.backend,
        "devices": probe.devices,
        "details": probe.details,
    }
