"""Agreement cost (docs/scale.md, "Agreement"): 300 agreements over the world (what
create_team and shrink run; the first 100 are warm-up), then create_team and shrink of the
world three times each; rank 0 prints the medians. Run as
``dpa-offload run -n 4 python scripts/agree_bench.py [PREFIX]``: with PREFIX, offload_lib
must be imported from under it (comparing two checkouts through PYTHONPATH)."""
import statistics
import sys
import time

import offload_lib as ol

assert len(sys.argv) < 2 or ol.__file__.startswith(sys.argv[1]), ol.__file__
ctx = ol.init()
w = ctx.world
w.barrier().wait()
t = []
for i in range(300):
    t0 = time.perf_counter()
    ctx._agree(w, ctx._gone_mask(), i, 7, "bench")
    t.append(time.perf_counter() - t0)
t = t[100:]
c = []
for i in range(6):
    t0 = time.perf_counter()
    team = ctx.create_team(list(range(ctx.size))) if i % 2 == 0 else ctx.shrink()
    c.append(time.perf_counter() - t0)
    team.barrier().wait()
if ctx.rank == 0:
    print(f"agree median {statistics.median(t) * 1e6:.1f} us; create_team/shrink median "
          f"{statistics.median(c) * 1e6:.1f} us", flush=True)
ctx.close()
