"""A 4-rank all-to-all on the emulated DPU, checked against numpy.

    dpa-offload run -n 4 -- python examples/alltoall_demo.py
"""
import time

import numpy as np

import offload_lib as ol

with ol.init() as ctx:
    n, me = ctx.size, ctx.rank
    per_peer = 256 * 1024  # float32 elements: 1 MiB to each peer
    # Registered job-shared memory: peers' DPA threads copy straight into it.
    src = ctx.empty(n * per_peer, np.float32)
    dst = ctx.empty(n * per_peer, np.float32)
    src[:] = np.repeat(me * 1000 + np.arange(n, dtype=np.float32), per_peer)

    ctx.world.alltoall(src, dst).wait()  # first touch maps the peers' buffers

    # The op timed below is the first after the warm-up: on a shared 2-core VM it takes
    # 1.2-1.8x what the ops after it take (docs/performance.md, "the first op after warm-up").
    # Stats before the barrier: between it and the post, a rank's first stats() call
    # (~60 us) would delay its part of everyone's op.
    before = ctx.stats()
    ctx.world.barrier().wait()
    t0, cpu0 = time.perf_counter(), time.thread_time()
    request = ctx.world.alltoall(src, dst)
    # On a card the calling thread sleeps while the DPA moves the data. On the emulator, where
    # the ranks outnumber the cores, it takes over its rank's copies (cooperative progress;
    # `progress: threads` leaves them to the DPA threads and the host CPU below near zero).
    request.wait()
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    # Check only once every rank's op is over: where ranks share cores, a rank's check
    # would otherwise run beside another's op and slow it (2-3x at n=4 on 2 cores).
    ctx.world.barrier().wait()

    expected = np.repeat(np.arange(n, dtype=np.float32) * 1000 + me, per_peer)
    assert np.array_equal(dst, expected), "all-to-all delivered wrong data"
    stats = ctx.stats()
    ctx.world.barrier().wait()
    wrote, writes = stats["bytes"] - before["bytes"], stats["chunks"] - before["chunks"]
    print(
        f"rank {me}/{n}: all-to-all of {src.nbytes >> 20} MiB correct in {elapsed * 1e6:.0f} us "
        f"({cpu * 1e6:.0f} us of host CPU) on the {ctx.backend} with {ctx.dpa_threads} DPA "
        f"thread(s); for it the DPA wrote {wrote / 2**20:g} MiB in {writes} RDMA writes"
    )
