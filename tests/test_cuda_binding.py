"""offload_lib/_cuda.py against the CUDA toolkit's cuda.h, where the toolkit is installed.

The driver binding only runs on a GPU machine, so a misspelt entry point, a wrong constant or
a field out of order would go unseen in CI: these checks read the header instead.
"""
from __future__ import annotations

import os
import re

import pytest

from offload_lib import _cuda

HEADER = next((p for p in (os.environ.get("CUDA_HOME", "") + "/include/cuda.h",
                           "/usr/local/cuda/include/cuda.h", "/usr/include/cuda.h")
               if os.path.exists(p)), None)
pytestmark = pytest.mark.skipif(HEADER is None, reason="no CUDA toolkit header (cuda.h) here")


@pytest.fixture(scope="module")
def header() -> str:
    assert HEADER is not None
    with open(HEADER, encoding="utf-8", errors="replace") as f:
        return f.read()


def _entry_points() -> list[str]:
    with open(_cuda.__file__, encoding="utf-8") as f:
        src = f.read()
    return sorted(set(re.findall(r'"(cu[A-Z]\w+)"', src)) |
                  set(re.findall(r"self\._lib\.(cu\w+)", src)))


def test_every_entry_point_is_exported_by_that_name(header):
    names = _entry_points()
    assert len(names) > 20, names
    for name in names:
        declared = re.search(rf"CUresult CUDAAPI {name}\(", header)
        # cuda.h declares cuFoo and maps it to the exported cuFoo_v2 with a #define
        mapped = re.search(rf"#define\s+\w+\s+(?:__CUDA_API_PT\w+\()?{name}\)?\s*$", header, re.M)
        assert declared or mapped, f"{name} is neither declared nor the target of a #define"


@pytest.mark.parametrize("name", [
    "CU_POINTER_ATTRIBUTE_CONTEXT", "CU_POINTER_ATTRIBUTE_MEMORY_TYPE",
    "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL", "CU_MEMORYTYPE_HOST", "CU_MEMORYTYPE_DEVICE",
    "CU_MEMORYTYPE_UNIFIED", "CU_STREAM_NON_BLOCKING", "CU_EVENT_DISABLE_TIMING",
    "CU_STREAM_WAIT_VALUE_GEQ", "CU_STREAM_WRITE_VALUE_DEFAULT", "CU_MEMHOSTREGISTER_PORTABLE",
    "CUDA_ERROR_NOT_READY", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    "CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD", "CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX",
    "CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER",
])
def test_constants_match_the_header(header, name):
    m = re.search(rf"^\s*(?:#define\s+)?{name}\s*=?\s*\(?\s*(0x[0-9a-fA-F]+|\d+)", header, re.M)
    assert m, f"{name} not found in {HEADER}"
    assert getattr(_cuda, name) == int(m.group(1), 0), name


def test_memcpy2d_fields_are_in_header_order(header):
    body = re.search(r"typedef struct CUDA_MEMCPY2D_st \{(.*?)\} CUDA_MEMCPY2D_v2;", header, re.S)
    assert body
    fields = re.findall(r"\b(\w+);", re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S))
    assert [f for f, _ in _cuda._Memcpy2D._fields_] == fields
