"""First contact with a DPA, step by step (``dpa-offload bringup``).

The steps run in order, each in a child process with a time bound (a step that hangs or
crashes cannot take the others with it), and each prints one line: what it checked and
what it found, or why it failed and what to check next. The first failure stops the run;
the steps after it are listed as not run. Steps 3-5 call the FlexIO backend's
``dpaoffload_flexio_probe(stage)``; 6 and 7 use the public API on one rank and on two.

  1 runtime      which FlexIO runtime (a card's or the model) and the backend built for it
  2 permissions  RDMA device files, the locked-memory limit registrations count against
  3 device       the RDMA device opens, its port is up, a GID a router forwards
  4 partition    where DPU mode needs one, a DPA EU partition for this function (a note)
  5 DPA process  the app loads into a DPA process (API version set, image found)
  6 RPC          the process answers: the image's ABI and sizes match the host's
  7 one rank     a DPA thread runs, reaches the ring through its window, writes to itself
  8 two ranks    QPs connect between two ranks; every DPA thread starts
"""
from __future__ import annotations

import glob
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from offload_lib.config import Config, load_config
from offload_lib.errors import OffloadError

__all__ = ["backend_probe", "run_bringup", "STEPS"]

_PROBE = r'''
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
buf = ctypes.create_string_buffer(1024)
rc = lib.dpaoffload_flexio_probe(int(sys.argv[2]), buf, len(buf))
print(rc)
print(buf.value.decode(errors="replace"))
'''


def backend_probe(library: str, stage: int, timeout: float = 60.0,
                  env: dict[str, str] | None = None) -> tuple[int, str]:
    """(0, what was found) or (-failed stage, why) from the backend's probe at ``stage``
    (1 device, 2 DPA process, 3 RPC), run in a child process."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, library, str(stage)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return -stage, f"no answer within {timeout:g} s"
    lines = r.stdout.splitlines()
    if r.returncode or len(lines) < 2:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return -stage, f"the probe process failed: {why}"
    return int(lines[0]), lines[1]


@dataclass
class Result:
    ok: bool
    found: str
    next: str = ""    # what to check next, on failure
    label: str = ""   # instead of ok: "note" (not checked, said), "n/a"


@dataclass
class Env:
    config: Config
    config_path: str | None
    library: str
    timeout: float

    def child_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, OFFLOAD_BACKEND="flexio",
                   OFFLOAD_FLEXIO_RUNTIME=self.config.flexio_runtime, **extra)
        if self.config_path:
            env["OFFLOAD_CONFIG"] = self.config_path
        return env


def _runtime(e: Env) -> Result:
    if e.config.flexio_runtime == "model":
        from offload_lib.flexio_runtime import build_model

        try:
            lib = build_model()
        except OffloadError as err:
            return Result(False, f"the FlexIO model does not build: {err}",
                          "python -m offload_lib.flexio_runtime build shows the build log")
        e.library = str(lib)
        return Result(True, f"the FlexIO model (flexio_runtime: model), backend {lib}")
    from offload_lib import discovery

    seen = discovery.probe(backend_path=e.library)
    why = discovery._why_not_flexio(seen)
    if why is not None:
        return Result(False, why, "dpa-offload info lists what was found; with "
                                  "OFFLOAD_FLEXIO_RUNTIME=model these steps run on the FlexIO model")
    flexio, how = discovery.find_libflexio(e.library)
    dev = next(d for d in seen.devices if d.has_dpa)
    return Result(True, f"{dev.name} ({dev.model}, firmware {dev.fw_ver or '?'}), libflexio "
                        f"{flexio} (from {how}), backend {e.library}")


def _memlock() -> tuple[int, str]:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return -1, "unlimited"
    return soft, f"{soft >> 10} KiB"


def _permissions(e: Env) -> Result:
    found = []
    if e.config.flexio_runtime != "model":
        nodes = sorted(glob.glob("/dev/infiniband/uverbs*"))
        if not nodes:
            return Result(False, "no /dev/infiniband/uverbs* device files",
                          "load the RDMA modules (mlx5_ib, ib_uverbs): modprobe ib_uverbs")
        closed = [n for n in nodes if not os.access(n, os.R_OK | os.W_OK)]
        if closed:
            return Result(False, f"{', '.join(closed)} not readable and writable by this user",
                          "add the user to the group owning them, or run as root")
        found.append(f"{len(nodes)} uverbs device file(s) open to this user")
    limit, text = _memlock()
    if os.geteuid() == 0:
        found.append(f"locked memory {text} (root: not enforced)")
    elif limit != -1 and limit < 64 << 20:
        return Result(False, f"locked-memory limit {text}: every registered buffer is pinned "
                             "against it, so registrations beyond it fail (ENOMEM)",
                      "raise it: ulimit -l unlimited, or memlock in /etc/security/limits.conf")
    else:
        found.append(f"locked memory {text}")
    return Result(True, "; ".join(found))


DPAEUMGMT_DOC = "https://docs.nvidia.com/doca/sdk/NVIDIA+DOCA+DPA+Execution+Unit+Management+Tool"


def _partition(e: Env) -> Result:
    """Not checked, said: NVIDIA's DPA EU management tool documents that a function other
    than the partition manager (the ECPF on a BlueField-3, i.e. the DPU's Arm) runs DPA
    threads only once an EU partition is created and associated with it; a host PF of a
    BlueField-3 in DPU mode is such a function. Nothing the host can query says whether it
    has one, so step 5 is the test; this line says where to look if it fails."""
    if e.config.flexio_runtime == "model":
        return Result(True, "the model has no EU partitions: every EU is this process's",
                      label="n/a")
    tool = shutil.which("dpaeumgmt") or next(
        (p for p in ("/opt/mellanox/doca/tools/dpaeumgmt",) if os.path.exists(p)), None)
    where = f"dpaeumgmt is {tool}" if tool else "dpaeumgmt (DOCA tools) is not installed here"
    return Result(True, "not checkable from here: in DPU mode a host PF runs DPA threads only "
                        f"with an EU partition made for it on the DPU ({where}; {DPAEUMGMT_DOC})",
                  label="note")


def _probe_step(stage: int, hint: str) -> Callable[[Env], Result]:
    def step(e: Env) -> Result:
        rc, report = backend_probe(e.library, stage, e.timeout, e.child_env())
        return Result(rc == 0, report, "" if rc == 0 else hint)
    return step


_ONE_RANK = r'''
import numpy as np, offload_lib as ol
ctx = ol.init()
assert ctx.backend == "flexio", ctx.backend
ctx.world.barrier().wait(timeout=T)
src = np.arange(1 << 16, dtype=np.int64)
dst = np.zeros_like(src)
ctx.world.alltoall(src, dst).wait(timeout=T)
assert (dst == src).all(), "the all-to-all moved the wrong bytes"
print(f"barrier and a 512 KiB all-to-all to itself exact, {ctx.dpa_threads} DPA thread(s)")
ctx.close()
'''

_TWO_RANKS = r'''
import numpy as np, offload_lib as ol
ctx = ol.init()
w, n, r = ctx.world, ctx.size, ctx.rank
w.barrier().wait(timeout=T)
src = np.arange(4096 * n, dtype=np.int64) + 1_000_000 * r
dst = np.zeros_like(src)
w.alltoall(src, dst).wait(timeout=T)
want = np.concatenate([np.arange(4096 * r, 4096 * (r + 1)) + 1_000_000 * p for p in range(n)])
assert (dst == want).all(), "the all-to-all moved the wrong bytes"
busy = [t["writes"] for t in ctx.stats()["threads"]]
assert all(busy), f"DPA threads that never ran: {[i for i, b in enumerate(busy) if not b]}"
if r == 0:
    print(f"barrier and all-to-all between 2 ranks exact; all {len(busy)} DPA threads ran")
ctx.close()
'''


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _one_rank(e: Env) -> Result:
    code = _ONE_RANK.replace("timeout=T", f"timeout={e.timeout}")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=e.timeout + 30, env=e.child_env())
    except subprocess.TimeoutExpired:
        return Result(False, f"no result within {e.timeout + 30:g} s",
                      "a DPA thread that never runs: check flexio_err_status and the crash data")
    if r.returncode:
        return Result(False, _last_line(r.stderr) or f"exit status {r.returncode}",
                      "the window (ring, stats, control words) or the loopback QP: see the "
                      "error above; FXM_VERBOSE=1 on the model logs every queue error")
    return Result(True, _last_line(r.stdout))


def _two_ranks(e: Env) -> Result:
    # At least two DPA threads a rank: thread 1 must start too (it once never did).
    threads = e.config.dpa_threads if isinstance(e.config.dpa_threads, int) else 2
    threads = max(2, threads)
    code = _TWO_RANKS.replace("timeout=T", f"timeout={e.timeout}")
    cmd = [sys.executable, "-m", "offload_lib.cli", "run", "-n", "2", "--timeout",
           str(e.timeout + 30), "--", sys.executable, "-c", code]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=e.timeout + 60,
                           env=e.child_env(OFFLOAD_DPA_THREADS=str(threads)))
    except subprocess.TimeoutExpired:
        return Result(False, f"no result within {e.timeout + 60:g} s",
                      "the ranks' QPs: GIDs and routes between the ports (dpa-offload info)")
    if r.returncode:
        return Result(False, _last_line(r.stderr) or f"exit status {r.returncode}",
                      "the ranks' QPs: OFFLOAD_FLEXIO_GID_INDEX / OFFLOAD_FLEXIO_NETDEV pick "
                      "the address; the kernel's route and neighbour tables give the next hop")
    line = _last_line(r.stdout)
    return Result(True, line.split("] ", 1)[1] if line.startswith("[") else line)


STEPS: list[tuple[str, Callable[[Env], Result]]] = [
    ("runtime", _runtime),
    ("permissions", _permissions),
    ("device", _probe_step(1, "ibv_devinfo shows the port; OFFLOAD_FLEXIO_DEVICE picks the "
                              "device, OFFLOAD_FLEXIO_GID_INDEX the GID")),
    ("partition", _partition),
    ("DPA process", _probe_step(2, "in DPU mode, an EU partition for this PF (step 4); that "
                                   "the image was built by this DOCA's dpacc "
                                   "(scripts/build_flexio.sh); the crash data named above")),
    ("RPC", _probe_step(3, "rebuild the backend (scripts/build_flexio.sh): image and host "
                           "were built from different headers")),
    ("one rank", _one_rank),
    ("two ranks", _two_ranks),
]


def run_bringup(config_path: str | None = None, timeout: float = 30.0,
                out: Callable[[str], None] = print) -> int:
    """Run the steps in order; 0 if all passed, else the number of the failed step."""
    from offload_lib.discovery import backend_library_path

    try:
        cfg = load_config(config_path)
    except OffloadError as err:
        out(f"config: {err}")
        return 1
    e = Env(cfg, config_path, backend_library_path(cfg), timeout)
    width = max(len(name) for name, _ in STEPS)
    for i, (name, step) in enumerate(STEPS, 1):
        try:
            res = step(e)
        except Exception as err:  # a step must not end the report
            res = Result(False, f"{type(err).__name__}: {err}", "report this as a bug")
        label = res.label or ("ok" if res.ok else "FAIL")
        out(f"{i} {name:<{width}}  {label:<4}  {res.found}")
        if not res.ok:
            if res.next:
                out(f"  {' ' * width}        next: {res.next}")
            for j, (later, _) in enumerate(STEPS[i:], i + 1):
                out(f"{j} {later:<{width}}  -     not run")
            return i
    return 0
