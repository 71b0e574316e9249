"""The FlexIO model's own semantics, through the FlexIO API alone (no binding): a DPA
program built by the model's dpacc and a host program linked against the model's
libflexio (tests/c/fxm_model_dev.c, tests/c/fxm_model_test.c). Event handlers as NVIDIA
documents them: run() arms without invoking, a CQE on the armed CQ invokes, never two
invocations of one handler at once, an event before run() is lost; windows that reach exactly
the registration whose key they were given."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from offload_lib.flexio_runtime import build_model, model_sdk

ROOT = Path(__file__).resolve().parent.parent
C = ROOT / "tests" / "c"


@pytest.mark.timeout(300)
def test_event_handlers_run_as_documented(tmp_path):
    build_model()
    sdk = model_sdk()
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    blob = tmp_path / "attr.blob"
    subprocess.run([str(sdk / "tools" / "dpa-app-attributes2blob"),
                    str(ROOT / "dpa_firmware" / "hal" / "flexio" / "dpa_app_attributes.yaml"),
                    str(blob)], check=True)
    archive = tmp_path / "fxm_test_app.a"
    subprocess.run([str(sdk / "tools" / "dpacc"), str(C / "fxm_model_dev.c"), "-o", str(archive),
                    f"-hostcc={cc}", "-hostcc-options=-fPIC -O2",
                    f"--devicecc-options=-O2 -Wall -Werror -DFLEXIO_DEV_ALLOW_EXPERIMENTAL_API "
                    f"-I{C}", "--app-name=fxm_test_app", "-mcpu=nv-dpa-bf3",
                    f"--dpa-proc-attr={blob}"], check=True)
    exe = tmp_path / "fxm_model_test"
    lib = sdk / "lib"
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Werror", "-I", str(sdk / "include"),
                    "-I", str(C), str(C / "fxm_model_test.c"), str(archive), "-L", str(lib),
                    f"-Wl,-rpath,{lib}", "-lflexio", "-libverbs", "-lpthread", "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "FXM_IGNORE_MEMLOCK": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 5, r.stdout
