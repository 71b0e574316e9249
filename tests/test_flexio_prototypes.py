"""The FlexIO model's headers declare every vendor function the binding calls exactly as the
vendor's headers do. The facts (each declaration and where it was checked) are in
emulator/flexio_model/prototypes.txt; this test holds the model's headers to them, by text
and by C type, and the binding to calling nothing unlisted. No SDK or card needed."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "emulator" / "flexio_model"
INCLUDE = MODEL / "include"
FACTS = MODEL / "prototypes.txt"
BINDING = [*sorted((ROOT / "host" / "src" / "flexio").glob("*.[ch]")),
           *sorted((ROOT / "dpa_firmware" / "hal" / "flexio").glob("*.[ch]"))]
HOST_HEADERS = ["libflexio/flexio.h", "infiniband/verbs.h"]
DEV_HEADERS = ["libflexio-dev/flexio_dev.h", "libflexio-dev/flexio_dev_err.h",
               "libflexio-dev/flexio_dev_queue_access.h", "libflexio-dev/flexio_dev_queue_types.h",
               "dpaintrin.h"]


@dataclass
class Fact:
    kind: str
    side: str
    decl: str
    source: str

    @property
    def name(self) -> str:
        if self.kind == "layout":
            return self.decl.split(":")[0].rsplit(" ", 1)[0]
        head = self.decl.split("(")[0] if self.kind == "fn" else self.decl
        return re.findall(r"[A-Za-z_]\w*", head)[-1 if self.kind == "fn" else 0]


def load_facts() -> tuple[list[Fact], dict[str, str]]:
    facts, sources = [], {}
    for line in FACTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("@"):
            key, text = line.split("=", 1)
            sources[key.strip()] = text.strip()
            continue
        kind, side, decl, source = (p.strip() for p in line.split("|"))
        facts.append(Fact(kind, side, decl, source))
    return facts, sources


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def norm(text: str) -> str:
    """One spelling per declaration: single spaces, none beside * ( ) , ;"""
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"\s*([*(),;])\s*", r"\1", text)


QUALIFIERS = re.compile(r"\b(FLEXIO_DEV_ALWAYS_INLINE|FLEXIO_DEV_EXPERIMENTAL|FLEXIO_DEV_STABLE|"
                        r"static|inline|extern)\b|__attribute__\s*\(\(.*?\)\)")


def model_declarations(name: str, side: str) -> list[str]:
    """Every declaration or definition head of `name` in the model's headers of that side,
    qualifiers and attributes dropped."""
    found = []
    for header in HOST_HEADERS if side == "host" else DEV_HEADERS:
        text = strip_comments((INCLUDE / header).read_text())
        for m in re.finditer(rf"(?<![\w.>]){re.escape(name)}\s*\(", text):
            start = max(text.rfind(c, 0, m.start()) for c in ";{}")
            line_start = text.rfind("\n#", 0, m.start())
            if line_start > start:   # a preprocessor line in between: start after it
                start = text.index("\n", line_start + 1)
            head = text[start + 1:m.start()]
            if "=" in head or re.search(r"\breturn\b", head) or "#define" in head or \
                    "(" in QUALIFIERS.sub("", head):
                continue   # a call or a macro body, not a declaration
            depth, i = 0, m.end() - 1
            while True:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            found.append(norm(QUALIFIERS.sub("", text[start + 1:i + 1])))
    return found


def binding_calls() -> set[str]:
    calls: set[str] = set()
    for path in BINDING:
        text = strip_comments(path.read_text())
        calls |= set(re.findall(r"\b((?:flexio|ibv)_\w+|__dpa_\w+)\s*\(", text))
    defined = {m for path in BINDING
               for m in re.findall(r"^\w[\w\s\*]*?\b(\w+)\s*\([^;]*\)\s*\{",
                                   strip_comments(path.read_text()), flags=re.M)}
    return calls - defined


def test_every_fact_names_its_source():
    facts, sources = load_facts()
    assert facts
    for f in facts:
        assert f.kind in ("fn", "macro", "layout") and f.side in ("host", "dev"), f
        assert f.source in sources, f"{f.name}: unknown source {f.source}"


def test_the_binding_calls_only_listed_vendor_functions():
    facts, _ = load_facts()
    listed = {f.name for f in facts if f.kind != "layout"}
    unlisted = sorted(binding_calls() - listed)
    assert not unlisted, f"the binding calls vendor functions prototypes.txt does not list: {unlisted}"


def test_model_headers_spell_each_declaration_as_the_vendor_does():
    facts, _ = load_facts()
    wrong = []
    for f in facts:
        if f.kind != "fn":
            continue
        decls = model_declarations(f.name, f.side)
        if norm(f.decl) not in decls:
            wrong.append(f"{f.name}:\n  vendor: {norm(f.decl)}\n  model:  {decls or 'none'}")
    assert not wrong, "\n".join(wrong)


def _compile(side: str, body: str, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    if side == "host":
        pre = ("#include <libflexio/flexio_ver.h>\n#define FLEXIO_VER_USED FLEXIO_VER(24, 10, 0)\n"
               + "".join(f"#include <{h}>\n" for h in HOST_HEADERS) + "#include <stddef.h>\n")
    else:   # as dpa_firmware/hal/flexio/flexio_hal_dev.h includes them
        pre = ("#define FLEXIO_DEV_ALLOW_EXPERIMENTAL_API 1\n"   # build_flexio.sh passes it
               "#include <libflexio-dev/flexio_dev_ver.h>\n"
               "#define FLEXIO_DEV_VER_USED FLEXIO_DEV_VER(24, 10, 0)\n"
               + "".join(f"#include <{h}>\n" for h in DEV_HEADERS) + "#include <stddef.h>\n")
    src = tmp_path / f"{side}.c"
    src.write_text(pre + body)
    r = subprocess.run([cc, "-std=gnu11", "-fsyntax-only", "-Werror", "-Wall", "-I", str(INCLUDE),
                        str(src)], capture_output=True, text=True)
    assert r.returncode == 0, f"{side} declarations differ from the model's:\n{r.stderr}"


@pytest.mark.parametrize("side", ["host", "dev"])
def test_model_headers_declare_each_function_with_the_vendor_types(side, tmp_path):
    """Each fact redeclared after the model's headers: C rejects a redeclaration whose type
    differs (a parameter, a pointer's const, the return type). The reference before it makes
    sure the model declared the name itself."""
    facts, _ = load_facts()
    lines = []
    for i, f in enumerate(x for x in facts if x.side == side):
        if f.kind == "fn":
            decl = f.decl.replace(f" {f.name}(", f" ({f.name})(").replace(f"*{f.name}(",
                                                                           f"*({f.name})(")
            lines.append(f"static void *const fxm_ref_{i} __attribute__((unused)) = "
                         f"(void *)&({f.name});\n{decl};\n")
        elif f.kind == "layout":
            head, fields = f.decl.split(":", 1)
            tag, size = head.rsplit(" ", 1)
            lines.append(f"_Static_assert(sizeof({tag}) == {size}, \"{tag} size\");\n")
            for field in filter(None, (x.strip() for x in fields.split(","))):
                member, off = field.split()
                lines.append(f"_Static_assert(offsetof({tag}, {member}) == {off}, "
                             f"\"{tag}.{member}\");\n")
    _compile(side, "".join(lines), tmp_path)


def test_dpaintrin_macros_expand_as_the_vendor_header_defines_them(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "intrin.c"
    src.write_text("#include <dpaintrin.h>\n")
    out = subprocess.run([cc, "-E", "-dM", "-I", str(INCLUDE), str(src)], capture_output=True,
                         text=True, check=True).stdout
    defined = {}
    for line in out.splitlines():
        m = re.match(r"#define (\w+)(\([^)]*\))? ?(.*)", line)
        if m:
            defined[m.group(1)] = norm((m.group(2) or "") + " " + m.group(3))
    facts, _ = load_facts()
    for f in facts:
        if f.kind == "macro":
            m = re.match(r"(\w+)(\([^)]*\))\s*(.*)", f.decl)
            assert m, f.decl
            assert defined.get(m.group(1)) == norm(m.group(2) + " " + m.group(3)), \
                (f.name, defined.get(m.group(1)))
