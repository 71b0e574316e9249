"""The FlexIO hardware binding on the FlexIO model (emulator/flexio_model): the binding's
device and host sources built unchanged against the model's SDK, and run over its emulated
queues. Each defect the model found in the binding has a test here that failed before its
fix (docs/hardware.md lists them with the commits)."""
from __future__ import annotations

import pytest

from offload_lib.flexio_runtime import build_model, model_backend, model_sdk


@pytest.fixture(scope="session")
def built_model():
    return build_model()


@pytest.mark.timeout(600)
def test_binding_builds_unchanged_against_the_model(built_model):
    """scripts/build_flexio.sh with DOCA_DIR = the model's SDK: dpacc compiles the device
    binding, gcc the host backend; nothing in the binding knows it is the model."""
    assert built_model == model_backend() and built_model.exists()
    assert (model_sdk() / "lib" / "libfxm-model.so").exists()


@pytest.mark.timeout(120)
def test_dpa_process_is_created_and_answers_its_rpc(built_model):
    """Bring-up steps 1-3 on the model: the device, the DPA process (the app loads), the
    query RPC (the image's ABI matches)."""
    from offload_lib.bringup import backend_probe

    for stage in (1, 2, 3):
        rc, report = backend_probe(str(built_model), stage)
        assert rc == 0, f"stage {stage}: {report}"
    assert "ABI" in report
