"""The host <-> DPA contract reaches Python from offload_abi.h itself, never as a copy.

offload_lib/_build.py puts every constant and struct of the header into the cffi cdef; these
tests check that the built module holds every one with the value the C compiler gives it now,
that a changed header value reaches a module built from it, and that no Python source writes
an ABI value (or an errno) as a literal of its own.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from offload_lib._build import ABI_HEADER, abi_cdef, make_ffi
from offload_lib._native import ffi, lib

ROOT = Path(__file__).resolve().parent.parent
_ENUM_MEMBER = re.compile(r"^\s*(OFFLOAD_\w+)\s*=", re.M)
_OBJECT_DEFINE = re.compile(r"^#define\s+(OFFLOAD_\w+)\s+\S", re.M)


def _abi_names(text: str) -> list[str]:
    """Every enum member and object-like integer #define of offload_abi.h."""
    _, defines = abi_cdef(text)
    return sorted(set(_ENUM_MEMBER.findall(text)) | set(defines))


def _compiler_values(tmp: Path, names: list[str]) -> dict[str, int]:
    """What the C compiler makes of each name in today's header."""
    prints = "\n".join(f'\tprintf("{n} %lld\\n", (long long)({n}));' for n in names)
    src = tmp / "abi_values.c"
    src.write_text(f'#include <stdio.h>\n#include "offload_abi.h"\nint main(void)\n{{\n{prints}\n'
                   "\treturn 0;\n}\n")
    exe = tmp / "abi_values"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{ABI_HEADER.parent}", str(src),
                    "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {n: int(v) for n, v in (line.split() for line in out.splitlines())}


def test_every_abi_constant_reaches_python_with_the_compilers_value(tmp_path):
    names = _abi_names(ABI_HEADER.read_text())
    assert len(names) > 60, names  # the statuses, opcodes, flags, limits, FlexIO words
    missing = [n for n in names if not hasattr(lib, n)]
    assert not missing, f"offload_abi.h names these, the cffi module lacks them: {missing}"
    want = _compiler_values(tmp_path, names)
    # The header as compiled now, against the module as built: a stale build fails here.
    stale = {n: (getattr(lib, n), v) for n, v in want.items()
             if getattr(lib, n) & (2**64 - 1) != v & (2**64 - 1)}
    assert not stale, f"rebuild offload_lib._native (pip install -e .): {stale}"


def test_abi_structs_are_the_compilers_layout():
    # API mode checks every struct of the cdef against the compiler when the module
    # loads; these are the ones Python reads word by word.
    assert ffi.sizeof("struct offload_alltoallv_args") == 64  # the header; arrays after it
    assert lib.offload_a2av_args_bytes(65) == 64 + 24 * 65
    assert ffi.sizeof("struct offload_thread_stats") == 128
    assert ffi.offsetof("struct offload_cmd", "root") == 60
    assert ffi.sizeof("struct offload_team_desc") == 16
    assert lib.offload_team_desc_bytes(4096) == 16 + 16 * 4096


def test_ctrl_layout_helpers():
    """The control region's layout (offload_abi.h's helpers, the only place that computes
    it): a team block holds its n members' words without overlap, blocks are W-strided and
    page aligned, the eager slots follow them; a small job's region does not grow with the
    ranks limit (its team blocks are a page or two)."""
    for w, n in [(1, 1), (4, 3), (65, 65), (4096, 64), (4096, 4096)]:
        stride = lib.offload_ctrl_stride(w)
        assert stride % 4096 == 0 and stride >= lib.offload_ctrl_team_bytes(n)
        ends = [lib.offload_ctrl_ready_in(n, 7, n - 1) + 32, lib.offload_ctrl_done_in(n, 7, n - 1) + 8,
                lib.offload_ctrl_count_in(n, 7, n - 1) + 16, lib.offload_ctrl_sig_in(n, 15, n - 1) + 32,
                lib.offload_ctrl_agree_dec_in(n, n - 1) + 32,
                lib.offload_ctrl_credit_in(n, 1, n - 1) + 8]
        starts = [0, lib.offload_ctrl_done_in(n, 0, 0), lib.offload_ctrl_count_in(n, 0, 0),
                  lib.offload_ctrl_sig_in(n, 0, 0), lib.offload_ctrl_agree_prop_in(n, 0),
                  lib.offload_ctrl_credit_in(n, 0, 0)]
        chunks = lib.offload_agree_chunks(n)  # agreement sets past 64 members (ABI 14)
        assert chunks == (0 if n <= 64 else -(-(n - 64) // lib.OFFLOAD_AGREE_CHUNK_RANKS))
        if chunks:
            starts.append(lib.offload_ctrl_agree_chunk_in(n, 0, 0, 0))
            ends.append(lib.offload_ctrl_agree_chunk_in(n, 1, n - 1, chunks - 1) + 32)
        assert all(e <= s for e, s in zip(ends, starts[1:])), (w, n, ends, starts)
        assert ends[-1] <= lib.offload_ctrl_team_bytes(n)
        assert lib.offload_ctrl_team_off(w, 15) + stride == lib.offload_ctrl_eager_off(w, 0, 0, 0)
        last = lib.offload_ctrl_eager_off(w, 15, lib.OFFLOAD_EAGER_MAX_TEAM - 1, 1)
        assert last + ffi.sizeof("struct offload_eager_slot") == lib.offload_ctrl_bytes(w)
    assert lib.offload_ctrl_stride(4) * 8 <= lib.offload_ctrl_stride(64)  # by W, not a maximum
    assert lib.OFFLOAD_RANKS_LIMIT >= 4096


@pytest.mark.timeout(120)
def test_a_changed_header_value_reaches_python(tmp_path):
    """Build a module from a header with other values: Python reads the new ones."""
    text = ABI_HEADER.read_text()
    changed = re.sub(r"OFFLOAD_OP_ALLTOALL = 3,", "OFFLOAD_OP_ALLTOALL = 42,", text)
    changed = re.sub(r"#define OFFLOAD_RANKS_LIMIT 65536u", "#define OFFLOAD_RANKS_LIMIT 32u", changed)
    changed = re.sub(r"#define OFFLOAD_OP_WINDOW   8u", "#define OFFLOAD_OP_WINDOW   4u", changed)
    changed = re.sub(r"#define OFFLOAD_CMD_F_SLOTS  \(1u << 2\)", "#define OFFLOAD_CMD_F_SLOTS (1u << 6)",
                     changed)
    assert changed.count("42,") and changed.count("32u") and changed.count("1u << 6")
    assert changed.count("OFFLOAD_OP_WINDOW   4u")
    # The changed header keeps its static asserts consistent: they scale with the window.
    (tmp_path / "offload_abi.h").write_text(changed)
    builder = make_ffi(changed, "abi_changed")
    builder.set_source("abi_changed", '#include "offload_abi.h"\n', include_dirs=[str(tmp_path)])
    built = builder.compile(tmpdir=str(tmp_path))
    spec = importlib.util.spec_from_file_location("abi_changed", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.lib.OFFLOAD_OP_ALLTOALL == 42
    assert module.lib.OFFLOAD_RANKS_LIMIT == 32
    assert module.lib.OFFLOAD_CMD_F_SLOTS == 1 << 6
    # The helpers are the header's own, compiled: the done words follow 4 slots of readies.
    assert module.lib.offload_ctrl_done_in(3, 0, 0) == 4 * 3 * 32
    assert lib.offload_ctrl_done_in(3, 0, 0) == 8 * 3 * 32
    assert module.lib.OFFLOAD_ERR_MISMATCH == lib.OFFLOAD_ERR_MISMATCH  # the rest as it was


def _abi_aliases() -> set[str]:
    """Names a hand copy of an ABI value would go by: OFFLOAD_OP_ALLTOALL, OP_ALLTOALL,
    ALLTOALL; OFFLOAD_CMD_F_SLOTS, CMD_F_SLOTS, F_SLOTS; ACCESS_LOCAL_READ, LOCAL_READ..."""
    out = set()
    for name in _abi_names(ABI_HEADER.read_text()):
        parts = name.split("_")[1:]
        for i in range(len(parts)):
            alias = "_".join(parts[i:])
            if "_" in alias or i == 0:  # one bare word (SIZE, OK) is too common a name
                out.add(alias)
        out.add(name)
    return out - {"WORDS"}


def _python_sources() -> list[Path]:
    return sorted((ROOT / "offload_lib").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py")) + \
        sorted((ROOT / "scripts").glob("*.py"))


def _literal_ints(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and type(n.value) is int for n in ast.walk(node))


def _negative_literal(node: ast.AST) -> bool:
    """-2, -110: a status or negative errno written as a number (-1 is too common)."""
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
        isinstance(node.operand, ast.Constant) and type(node.operand.value) is int and \
        node.operand.value > 1


def _table_copies(node: ast.AST, aliases: set[str], words: set[str]) -> list[str]:
    """Entries of a dict table that copy an ABI value: a name of one mapped to a literal
    ({"OP_ALLTOALL": 3}, dict(F_SLOTS=64)), a literal mapped to a name of one ({3: "OP_ALLTOALL"}),
    a status or errno as a literal key ({-7: Timeout}); bare words ({"alltoall": 3}) where
    two entries of a table read so (one alone, {"size": 4}, is too common)."""
    def named(n: ast.AST | None, names: set[str]) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str) and \
            n.value.upper().lstrip("_") in names

    def literal(n: ast.AST | None) -> bool:
        return n is not None and _literal_ints(n) and "lib." not in ast.unparse(n)

    def copies(k: ast.AST | None, v: ast.AST, names: set[str]) -> bool:
        return (named(k, names) and literal(v)) or (literal(k) and named(v, names))

    out, bare = [], []
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            entry = f"{ast.unparse(k) if k else '**'}: {ast.unparse(v)}"
            if copies(k, v, aliases) or (k is not None and _negative_literal(k)):
                out.append(entry)
            elif copies(k, v, words):
                bare.append(entry)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        for kw in node.keywords:
            if kw.arg and literal(kw.value):
                entry = f"{kw.arg}={ast.unparse(kw.value)}"
                if kw.arg.upper().lstrip("_") in aliases:
                    out.append(entry)
                elif kw.arg.upper() in words:
                    bare.append(entry)
    return out + (bare if len(bare) > 1 else [])


def _copies() -> list[str]:
    """Every place a Python source writes an ABI value or a negative errno as a literal."""
    aliases = _abi_aliases()
    # The enums Python keeps tables of, by their last word: opcodes, statuses, reduction ops
    # and types, mismatch kinds ({"alltoall": 3}, {"sum": 0}).
    words = {name.split("_", 2)[2] for name in _abi_names(ABI_HEADER.read_text())
             if name.startswith(("OFFLOAD_OP_", "OFFLOAD_ERR_", "OFFLOAD_RED_", "OFFLOAD_DT_",
                                 "OFFLOAD_MISMATCH_"))}
    found = []
    for path in _python_sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = [t for tgt in node.targets
                           for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id.lstrip("_") in aliases and \
                            _literal_ints(node.value) and "lib." not in ast.unparse(node.value):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            for where in _table_copies(node, aliases, words):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {where}")
            # A negative errno compared as a number (rc != -110) instead of -errno.ETIMEDOUT.
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    for n in (side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set))
                              else [side]):
                        if _negative_literal(n):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                                         f"{ast.unparse(node)}")
    return found


def test_no_python_source_copies_an_abi_value():
    found = _copies()
    assert not found, "ABI values or errnos written as literals (use lib.OFFLOAD_* / errno.E*):\n" \
        + "\n".join(found)


def test_the_scan_would_see_a_copy(tmp_path, monkeypatch):
    """The scan above fails on the copies this contract replaced."""
    fake = tmp_path / "offload_lib"
    fake.mkdir()
    (fake / "copy.py").write_text("OP_ALLTOALL = 3\n_LOCAL_READ, _LOCAL_WRITE = 1, 2\n"
                                  "def f(rc):\n    return rc != -110 or rc in (0, -2)\n"
                                  "OPS = {'alltoall': 3, 'BROADCAST': 4}\n"
                                  "NAMES = {3: 'OP_ALLTOALL'}\nERRS = {-7: TimeoutError}\n"
                                  "FLAGS = dict(F_SLOTS=64)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = "\n".join(_copies())
    for copy in ("OP_ALLTOALL = 3", "-110", "-2", "_LOCAL_READ", "'alltoall': 3", "'BROADCAST': 4",
                 "3: 'OP_ALLTOALL'", "-7: TimeoutError", "F_SLOTS=64"):
        assert copy in found, copy
