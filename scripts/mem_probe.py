"""One rank's memory after a few all-to-alls (docs/scale.md): run it on every rank,
``dpa-offload run -n 4 python scripts/mem_probe.py``. Prints the rank's VmRSS and VmHWM and
the job segment's size in /dev/shm (apparent, and allocated: the pages touched)."""
from __future__ import annotations

import glob
import os

import numpy as np

import offload_lib as ol


def main() -> None:
    ctx = ol.init()
    src = np.arange(ctx.size * 16384, dtype=np.float32)  # 64 KiB per peer
    dst = np.empty_like(src)
    for _ in range(20):
        ctx.world.alltoall(src, dst)
    ctx.world.barrier()
    with open("/proc/self/status") as f:
        vm = " ".join(" ".join(line.split()) for line in f if line.startswith(("VmRSS", "VmHWM")))
    job = os.environ.get("OFFLOAD_JOB", "")
    seg = ""
    for path in glob.glob(f"/dev/shm/{job}*") if job else []:
        st = os.stat(path)
        if st.st_size > 1 << 20:  # the job segment (ctx.empty() segments are others)
            seg = f"segment apparent {st.st_size} allocated {st.st_blocks * 512}"
    print(f"rank {ctx.rank}: {vm} {seg}", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
