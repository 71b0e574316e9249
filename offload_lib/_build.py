"""cffi (API mode) build of offload_lib._native from host/include/offload_host.h."""
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "host" / "include" / "offload_host.h"


def _cdef_section(text: str) -> str:
    start = text.index("/* cffi:begin */") + len("/* cffi:begin */")
    return text[start : text.index("/* cffi:end */")]


ffibuilder = FFI()
ffibuilder.cdef(_cdef_section(HEADER.read_text()))
# The bootstrap's allgather, called back by hardware backends (offload_lib/context.py).
ffibuilder.cdef('extern "Python" int offload_allgather(void *, const void *, uint32_t, void *);')
ffibuilder.set_source(
    "offload_lib._native",
    '#include "offload_host.h"\n',
    include_dirs=[str(ROOT / "host" / "include"), str(ROOT / "dpa_firmware" / "include")],
    libraries=["dpaoffload_core", "pthread", "rt"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
