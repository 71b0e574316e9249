"""cffi (API mode) build of offload_lib._native: the host API of offload_host.h and the
host <-> DPA contract of offload_abi.h, both read from the headers themselves.

The contract is not copied into Python: every constant (enum member and integer #define)
and every struct of offload_abi.h goes into the cdef, the constants as ``...`` so that the
C compiler supplies their values, the structs checked against the compiler's layout when
the module loads. Python then reads ``lib.OFFLOAD_*`` and ``ffi.offsetof("struct ...")``.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # build_defs.py: the build's flags (setup.py does the same)
from build_defs import lto  # noqa: E402
HEADER = ROOT / "host" / "include" / "offload_host.h"
ABI_HEADER = ROOT / "dpa_firmware" / "include" / "offload_abi.h"
ENGINE_HEADER = ROOT / "dpa_firmware" / "include" / "dpa_engine.h"  # the firmware's settings

_DEFINE = re.compile(r"^#define\s+(\w+)(\(?)\s*(.*)$")
_SUFFIX = re.compile(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]+\b")


def _cdef_section(text: str) -> str:
    start = text.index("/* cffi:begin */") + len("/* cffi:begin */")
    return text[start : text.index("/* cffi:end */")]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _value(expr: str, known: dict[str, int]) -> int | None:
    """An integer #define's value (literals, earlier names, + - * << | ( )), or None."""
    expr = _SUFFIX.sub(r"\1", expr.strip())
    expr = re.sub(r"\b0x[0-9a-fA-F]+\b", lambda m: str(int(m.group(0), 16)), expr)
    if not expr or not re.fullmatch(r"[\w\s()+\-*<>|]+", expr):
        return None
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(known.get(m.group(0), m.group(0))), expr)
    if re.search(r"[A-Za-z_]", expr):
        return None
    return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


def _inline_prototypes(text: str) -> str:
    """The header's static inline helpers (offsets, sizes) as plain prototypes: cffi's API
    mode compiles calls to them, so Python computes no offset by hand."""
    out: list[str] = []
    at = 0
    for m in re.finditer(r"static\s+inline\s+([^{;]*?\))\s*\{", text):
        if m.start() < at:
            continue
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[at:m.start()] + m.group(1) + ";")
        at = i
    return "".join(out) + text[at:]


def abi_cdef(text: str) -> tuple[str, dict[str, int]]:
    """The cdef of an offload_abi.h text, and its integer #defines as Python evaluates
    them (only to size struct arrays: the module takes every value from the compiler)."""
    known: dict[str, int] = {}
    defines: list[str] = []
    body: list[str] = []
    text = _inline_prototypes(_strip_comments(text))
    lines = text.replace("\\\n", " ").splitlines()  # macros' continuations
    skip_assert = False
    for line in lines:
        stripped = line.strip()
        if skip_assert or stripped.startswith("_Static_assert"):
            skip_assert = not stripped.endswith(";")
            continue
        m = _DEFINE.match(stripped)
        if m:
            name, function_like, expr = m.groups()
            value = None if function_like else _value(expr, known)
            if value is not None:
                known[name] = value
                defines.append(f"#define {name} ...")
            continue
        if stripped.startswith("#"):
            continue
        body.append(line)
    structs = "\n".join(body)
    # Array sizes: cffi wants numbers where C has names.
    for name in sorted(known, key=len, reverse=True):
        structs = re.sub(rf"\b{name}\b", str(known[name]), structs)
    structs = _SUFFIX.sub(r"\1", structs)
    return "\n".join(defines) + "\n" + structs, known


def make_ffi(abi_text: str, module: str, sources: str = "") -> FFI:
    """An FFI with the contract of abi_text (and, given sources, the host API)."""
    ffi = FFI()
    ffi.cdef(abi_cdef(abi_text)[0])
    if sources:
        ffi.cdef(sources)
    return ffi


ffibuilder = make_ffi(ABI_HEADER.read_text(), "offload_lib._native",
                      _cdef_section(ENGINE_HEADER.read_text()) +
                      _cdef_section(HEADER.read_text()))
# The bootstrap's allgather, called back by hardware backends (offload_lib/context.py).
ffibuilder.cdef('extern "Python" int offload_allgather(void *, const void *, uint32_t, void *);')
ffibuilder.set_source(
    "offload_lib._native",
    '#include "offload_abi.h"\n#include "offload_host.h"\n',
    include_dirs=[str(ROOT / "host" / "include"), str(ROOT / "dpa_firmware" / "include")],
    libraries=["dpaoffload_core", "pthread", "rt"],
    extra_link_args=lto()[1],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
