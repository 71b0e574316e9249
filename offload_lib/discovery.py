"""Which backend to use: a BlueField DPA through FlexIO when one is usable, else the emulator.

``probe()`` looks (RDMA devices through pyverbs, the DOCA FlexIO runtime, dpa-offload's own
FlexIO backend library); ``decide()`` turns what it saw into a backend and one sentence
saying why. Both are plain functions over plain data, so tests feed them fake devices and
fake libraries. pyverbs is optional and imported lazily; every "not available" names what
is missing and how to get it.

With ``flexio_runtime: model`` the flexio backend runs on the FlexIO model (the vendor
runtime emulated beneath the same binding, offload_lib.flexio_runtime) and nothing is
probed: the model is the device.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from offload_lib.config import Config, load_config
from offload_lib.errors import OffloadError

__all__ = ["RdmaDevice", "Library", "Probe", "probe", "decide", "describe", "select_backend",
           "backend_library_path"]

MELLANOX_VENDOR_ID = 0x15B3
# PCI device ids (ibv_device_attr.vendor_part_id) of NVIDIA/Mellanox adapters: (model, has DPA).
# The DPA is on BlueField-3 and on the ConnectX-8 SuperNIC; earlier parts have none.
KNOWN_PARTS: dict[int, tuple[str, bool]] = {
    0x1017: ("ConnectX-5", False),
    0x1019: ("ConnectX-5 Ex", False),
    0x101B: ("ConnectX-6", False),
    0x101D: ("ConnectX-6 Dx", False),
    0x101F: ("ConnectX-6 Lx", False),
    0x1021: ("ConnectX-7", False),
    0x1023: ("ConnectX-8", True),
    0xA2D2: ("BlueField", False),
    0xA2D6: ("BlueField-2", False),
    0xA2DC: ("BlueField-3", True),
}
# Host runtimes that can load DPA code: the FlexIO SDK (what our backend uses) and DOCA DPA.
RUNTIMES = (("flexio", "libflexio"), ("doca_dpa", "libdoca_dpa"))
# Where DOCA installs FlexIO when ldconfig does not list it (DOCA-Host packages).
FLEXIO_LIB_DIRS = ("/opt/mellanox/flexio/lib", "/opt/mellanox/doca/lib/x86_64-linux-gnu",
                   "/opt/mellanox/doca/lib/aarch64-linux-gnu")
BACKEND_LIBRARY = "libdpaoffload_flexio.so"
PYVERBS_HINT = "pip install 'dpa-offload[hw]', or Debian's python3-pyverbs"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    vendor_id: int | None = None
    part_id: int | None = None
    fw_ver: str = ""

    @property
    def model(self) -> str:
        if self.vendor_id not in (None, MELLANOX_VENDOR_ID):
            return f"vendor 0x{self.vendor_id:04x} part 0x{self.part_id or 0:04x}"
        if self.part_id is None:
            return "unknown model"
        known = KNOWN_PARTS.get(self.part_id)
        return known[0] if known else f"mlx5 part 0x{self.part_id:04x}"

    @property
    def has_dpa(self) -> bool:
        if self.vendor_id not in (None, MELLANOX_VENDOR_ID) or self.part_id is None:
            return False
        known = KNOWN_PARTS.get(self.part_id)
        return bool(known and known[1])

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model": self.model, "dpa": self.has_dpa}


@dataclass(frozen=True)
class Library:
    name: str
    path: str | None = None     # what was (or would be) loaded
    loaded: bool = False
    error: str = ""             # why it could not be loaded


@dataclass
class Probe:
    pyverbs: str | None = None  # the module's file, None when it cannot be imported
    pyverbs_error: str = ""
    devices: list[RdmaDevice] = field(default_factory=list)
    device_error: str = ""      # why there is no device list
    runtimes: list[Library] = field(default_factory=list)
    backend: Library = field(default_factory=lambda: Library(BACKEND_LIBRARY))


# ---------------------------------------------------------------------------------------------
# looking


def _sysfs_ids(name: str) -> tuple[int | None, int | None]:
    base = Path("/sys/class/infiniband") / name / "device"
    ids: list[int | None] = []
    for what in ("vendor", "device"):
        try:
            ids.append(int((base / what).read_text().strip(), 16))
        except (OSError, ValueError):
            ids.append(None)
    return ids[0], ids[1]


def _device(verbs: Any, dev: Any) -> RdmaDevice:
    raw = getattr(dev, "name", b"?")
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        with verbs.Context(name=name) as ctx:
            attr = ctx.query_device()
            # pyverbs exposes ibv_device_attr.fw_ver as DeviceAttr.fw_version, a str
            # (rdma-core pyverbs/device.pyx); it has no fw_ver attribute.
            return RdmaDevice(name, int(attr.vendor_id), int(attr.vendor_part_id),
                              str(attr.fw_version))
    except Exception:  # no permission to open it: sysfs still has the PCI ids
        vendor, part = _sysfs_ids(name)
        return RdmaDevice(name, vendor, part)


def _load_library(name: str, path: str | None) -> Library:
    if path is None:
        return Library(name, None, False, "not found")
    try:
        ctypes.CDLL(path)
    except OSError as e:
        return Library(name, path, False, str(e))
    return Library(name, path, True)


def _elf_runpath(path: str) -> list[str]:
    """The DT_RUNPATH (or DT_RPATH) directories of an ELF shared object, $ORIGIN expanded;
    [] for anything it cannot read."""
    import struct

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:   # 64-bit little endian
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    for _, kind, _, _, off, size, link, _, _, entsize in sections:
        if kind != 6 or not entsize:   # SHT_DYNAMIC
            continue
        strtab_off = sections[link][4]
        found = {}
        for i in range(size // entsize):
            tag, val = struct.unpack_from("<qQ", data, off + i * entsize)
            if tag in (15, 29):   # DT_RPATH, DT_RUNPATH
                end = data.index(b"\0", strtab_off + val)
                found[tag] = data[strtab_off + val:end].decode(errors="replace")
        raw = found.get(29, found.get(15, ""))
        origin = os.path.dirname(os.path.abspath(path))
        return [d.replace("$ORIGIN", origin) for d in raw.split(":") if d]
    return []


def find_libflexio(backend_path: str | None = None,
                   find_library: Callable[[str], str | None] = ctypes.util.find_library,
                   dirs: tuple[str, ...] = FLEXIO_LIB_DIRS) -> tuple[str | None, str]:
    """(path, how it was found) of the libflexio the backend would load: the backend
    library's own rpath first (what the dynamic linker uses), then DOCA's install
    directories, then ldconfig's list; (None, where it looked) if none has it."""
    looked: list[str] = []
    for how, candidates in (("the backend's rpath", _elf_runpath(backend_path) if backend_path
                             else []), ("DOCA's install directory", list(dirs))):
        for d in candidates:
            looked.append(d)
            for name in ("libflexio.so", "libflexio.so.1"):
                p = os.path.join(d, name)
                if os.path.exists(p):
                    return os.path.realpath(p), f"{how} {d}"
    found = find_library("flexio")
    if found:
        return found, "ldconfig"
    return None, f"looked in {', '.join(looked) or 'no directory'} and ldconfig's list"


def backend_library_path(config: Config | None = None) -> str:
    """Where dpa-offload's FlexIO backend is looked for. On the FlexIO model: the one built
    against it (offload_lib.flexio_runtime). Else OFFLOAD_FLEXIO_LIB, else what
    scripts/build_flexio.sh builds (build/flexio/ of the source tree), else next to the
    package."""
    if config is not None and config.flexio_runtime == "model":
        from offload_lib.flexio_runtime import model_backend

        return str(model_backend())
    env = os.environ.get("OFFLOAD_FLEXIO_LIB")
    if env:
        return env
    pkg = Path(__file__).resolve().parent
    for candidate in (pkg.parent / "build" / "flexio" / BACKEND_LIBRARY, pkg / BACKEND_LIBRARY):
        if candidate.exists():
            return str(candidate)
    return str(pkg.parent / "build" / "flexio" / BACKEND_LIBRARY)


def probe(import_verbs: Callable[[], Any] | None = None,
          find_library: Callable[[str], str | None] = ctypes.util.find_library,
          load: Callable[[str, str | None], Library] = _load_library,
          backend_path: str | None = None) -> Probe:
    """Look at this machine; the arguments let tests substitute what is looked at."""
    p = Probe()
    try:
        if import_verbs is None:
            import pyverbs.device as verbs  # type: ignore[import-not-found, unused-ignore]
        else:
            verbs = import_verbs()
        p.pyverbs = str(getattr(verbs, "__file__", "?"))
    except ImportError:
        p.pyverbs_error = f"pyverbs is not installed ({PYVERBS_HINT})"
    except Exception as e:  # a broken install, e.g. a libibverbs ABI mismatch
        p.pyverbs_error = f"pyverbs failed to import: {e}"
    if p.pyverbs is not None:
        try:
            p.devices = [_device(verbs, d) for d in verbs.get_device_list()]
        except Exception as e:  # pyverbs raises when the kernel has no RDMA support
            p.device_error = f"listing RDMA devices failed ({e})"
    path = backend_path if backend_path is not None else backend_library_path()
    flexio_path, _how = find_libflexio(path if os.path.exists(path) else None, find_library)
    p.runtimes = [load(lib, flexio_path if short == "flexio" else find_library(short))
                  for short, lib in RUNTIMES]
    p.backend = (load(BACKEND_LIBRARY, path) if os.path.exists(path) else
                 Library(BACKEND_LIBRARY, path, False, "not built"))
    return p


# ---------------------------------------------------------------------------------------------
# deciding


def _why_not_flexio(p: Probe) -> str | None:
    """What keeps the FlexIO backend from running here, as a clause; None if nothing."""
    if p.pyverbs is None:
        return f"no DPA to use: RDMA devices cannot be listed because {p.pyverbs_error}"
    if p.device_error or not p.devices:
        why = p.device_error or "the kernel lists none"
        return f"no DPA to use: no RDMA device found ({why})"
    dpa = [d for d in p.devices if d.has_dpa]
    if not dpa:
        seen = ", ".join(f"{d.name} ({d.model})" for d in p.devices)
        return f"no DPA to use: found {seen}, none with a DPA (BlueField-3 or ConnectX-8)"
    flexio = next((r for r in p.runtimes if r.name == "libflexio"), None)
    if flexio is None or not flexio.loaded:
        why = flexio.error if flexio else "not looked for"
        return (f"{dpa[0].name} ({dpa[0].model}) has a DPA, but the DOCA FlexIO runtime "
                f"libflexio cannot be loaded ({why}); install DOCA (doca-runtime)")
    if not p.backend.loaded:
        return (f"{dpa[0].name} ({dpa[0].model}) has a DPA and libflexio loads, but "
                f"dpa-offload's FlexIO backend {p.backend.path} is {p.backend.error}; build it "
                "with scripts/build_flexio.sh (needs dpacc from DOCA)")
    return None


MODEL_REASON = ("flexio_runtime: model: the FlexIO binding runs on the FlexIO model "
                "(emulated DPA queues and NIC, emulator/flexio_model), not on a card")


def decide(requested: str, p: Probe, runtime: str = "vendor") -> tuple[str, str]:
    """(backend, reason). Raises OffloadError when 'flexio' is requested but not usable."""
    if requested == "emulator":
        return "emulator", "requested by config (backend: emulator)"
    if runtime == "model":
        return "flexio", MODEL_REASON
    missing = _why_not_flexio(p)
    if missing is None:
        dev = next(d for d in p.devices if d.has_dpa)
        return "flexio", f"{dev.name} ({dev.model}) has a DPA and the FlexIO runtime loads"
    if requested == "flexio":
        raise OffloadError(
            f"backend 'flexio' was requested but cannot be used: {missing}. Set backend to "
            "'auto' or 'emulator' (e.g. OFFLOAD_BACKEND=emulator) to run on the emulator"
        )
    return "emulator", missing


def select_backend(config: Config | None = None, seen: Probe | None = None) -> tuple[str, str]:
    """(backend, reason); raises OffloadError when 'flexio' is requested but unavailable."""
    cfg = config if isinstance(config, Config) else load_config(config)
    if cfg.backend == "emulator" or cfg.flexio_runtime == "model":
        return decide(cfg.backend, Probe(), cfg.flexio_runtime)
    return decide(cfg.backend, probe() if seen is None else seen)


def describe(config: Config | None = None, seen: Probe | None = None) -> dict[str, Any]:
    """What was found and which backend would be used, for ``dpa-offload info``."""
    cfg = config if isinstance(config, Config) else load_config(config)
    if cfg.flexio_runtime == "model":
        return _describe_model(cfg)
    p = probe() if seen is None else seen
    try:
        backend, reason = decide(cfg.backend, p)
    except OffloadError as e:
        backend, reason = "none", str(e)
    flexio = next((r for r in p.runtimes if r.name == "libflexio"), None)
    return {
        "backend": backend,
        "reason": reason,
        "requested": cfg.backend,
        "flexio runtime": ("vendor: " + (flexio.path if flexio and flexio.loaded else
                                         "libflexio not found")),
        "devices": [d.as_dict() for d in p.devices],
        "details": {
            "pyverbs": p.pyverbs or p.pyverbs_error,
            **{r.name: r.path if r.loaded else f"not loadable: {r.error}" for r in p.runtimes},
            "backend library": (p.backend.path if p.backend.loaded else
                                f"{p.backend.path}: {p.backend.error}"),
        },
    }


def _describe_model(cfg: Config) -> dict[str, Any]:
    from offload_lib.flexio_runtime import model_backend, model_is_current, model_sdk

    backend, reason = decide(cfg.backend, Probe(), "model")
    built = model_backend()
    state = ("built" if model_is_current() else "stale: rebuilt on first use") if built.exists() \
        else "not built yet: built on first use (python -m offload_lib.flexio_runtime build)"
    return {
        "backend": backend,
        "reason": reason,
        "requested": cfg.backend,
        "flexio runtime": f"model ({model_sdk() / 'lib' / 'libfxm-model.so'}), requested by "
                          "flexio_runtime: model (OFFLOAD_FLEXIO_RUNTIME)",
        "devices": [RdmaDevice("mlx5_0", MELLANOX_VENDOR_ID, 0xA2DC,
                               "FlexIO model (no card)").as_dict()],
        "details": {"backend library": f"{built} ({state})"},
    }
