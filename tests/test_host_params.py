"""One versioned parameter struct (offload_host.h's struct host_ctx_params, io_uring_params
style): filled once from the config, passed by pointer to host setup, the backend and, its
engine part as it is, the firmware; a struct of another size or version is refused."""
from __future__ import annotations

import errno

import pytest

import offload_lib as ol
from offload_lib import context as context_mod
from offload_lib._native import ffi, lib
from offload_lib.errors import OffloadError

from _mp import run_ranks

# chunk_size is read by the firmware alone (p2p.c writes each block in chunk_size pieces):
# the writes it counts show the value reached the engine.
CHUNKS = r'''
cfg = {"chunk_size": CHUNK, "eager_max": 0}
ctx = ol.init(cfg)
n = ctx.size
block = 256 * 1024
src = np.full(block * n // 8, rank, np.int64)
dst = np.zeros_like(src)
before = ctx.stats()["writes"]
for _ in range(4):
    ctx.world.alltoall(src, dst).wait(timeout=20)
writes = ctx.stats()["writes"] - before
check_equal(dst[::block // 8], np.arange(n), "all-to-all")
# 4 ops, a 256 KiB block to each rank (its own too: a loopback write) in CHUNK pieces
# (the protocol's signals are counted apart)
assert writes == 4 * n * (block // CHUNK), f"chunk_size CHUNK: {writes} writes"
ctx.close()
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunk", [64 * 1024, 256 * 1024])
def test_a_config_key_reaches_the_engine(chunk):
    run_ranks(2, CHUNKS.replace("CHUNK", str(chunk)), timeout=90)


def _params(**over: int):
    p = ffi.new("struct host_ctx_params *")
    p.struct_size = ffi.sizeof("struct host_ctx_params")
    p.version = lib.HOST_CTX_PARAMS_VERSION
    for k, v in over.items():
        setattr(p, k, v)
    return p


@pytest.mark.parametrize("field, delta", [("version", 1), ("version", -1), ("struct_size", -8),
                                          ("struct_size", 8)])
def test_another_layout_is_refused_before_anything_opens(field, delta):
    good = _params()
    p = _params(**{field: getattr(good, field) + delta})
    out = ffi.new("struct host_ctx **")
    assert lib.host_ctx_open(p, out) == -errno.EPROTONOSUPPORT
    assert out[0] == ffi.NULL
    # The header right and the rest zero: refused for the contents instead.
    assert lib.host_ctx_open(good, out) == -errno.EINVAL


def test_python_names_the_mismatch(monkeypatch):
    class OtherHeaders:
        """The native module as if built from headers of another params version."""

        def __getattr__(self, name):
            return getattr(lib, name)

        @staticmethod
        def host_ctx_open(params, out):
            params.version = lib.HOST_CTX_PARAMS_VERSION + 1
            return lib.host_ctx_open(params, out)

    monkeypatch.setattr(context_mod, "lib", OtherHeaders())
    with pytest.raises(OffloadError, match=r"struct host_ctx_params version \d+, not the \d+ "
                                           r"bytes of version \d+ given: .*reinstall"):
        ol.init({"backend": "emulator"})
