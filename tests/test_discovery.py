"""Backend selection over fake device lists and fake libraries: no card needed."""
from __future__ import annotations

import json
import re
import types

import pytest

from offload_lib import cli, discovery
from offload_lib.config import Config
from offload_lib.discovery import Library, Probe, RdmaDevice, decide, probe
from offload_lib.errors import OffloadError

BF3 = (0x15B3, 0xA2DC)
CX6DX = (0x15B3, 0x101D)
CX7 = (0x15B3, 0x1021)


class _Attr:
    """pyverbs' DeviceAttr as rdma-core defines it: the firmware is fw_version, a str."""

    def __init__(self, vendor: int, part: int) -> None:
        self.vendor_id, self.vendor_part_id, self.fw_version = vendor, part, "32.41.1000"


def fake_verbs(devices: dict[str, tuple[int, int]] | None, fail_list: Exception | None = None,
               fail_open: bool = False) -> types.SimpleNamespace:
    """A stand-in for pyverbs.device with the given {name: (vendor, part)}."""

    class Context:
        def __init__(self, name: str) -> None:
            if fail_open:
                raise PermissionError(f"cannot open {name}")
            self.ids = (devices or {})[name]

        def __enter__(self) -> Context:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def query_device(self) -> _Attr:
            return _Attr(*self.ids)

    def get_device_list() -> list[types.SimpleNamespace]:
        if fail_list is not None:
            raise fail_list
        return [types.SimpleNamespace(name=n.encode()) for n in devices or {}]

    return types.SimpleNamespace(__file__="/fake/pyverbs/device.py", Context=Context,
                                 get_device_list=get_device_list)


def loader(loadable: set[str]):
    def load(name: str, path: str | None) -> Library:
        if path is None:
            return Library(name, None, False, "not found")
        if name in loadable:
            return Library(name, path, True)
        return Library(name, path, False, f"{path}: cannot open shared object file")
    return load


def look(verbs=None, libs=("libflexio",), backend_built=False, import_error=None,
         tmp_path=None) -> Probe:
    def import_verbs():
        if import_error is not None:
            raise import_error
        return verbs

    backend = "/nonexistent/libdpaoffload_flexio.so"
    if backend_built:
        assert tmp_path is not None
        backend = str(tmp_path / "libdpaoffload_flexio.so")
        open(backend, "w").close()
    loadable = set(libs) | ({"libdpaoffload_flexio.so"} if backend_built else set())
    return probe(import_verbs=import_verbs,
                 find_library=lambda short: f"/usr/lib/lib{short}.so" if f"lib{short}" in libs else None,
                 load=loader(loadable), backend_path=backend)


def test_no_pyverbs_falls_back_and_says_how_to_get_it():
    p = look(import_error=ImportError("No module named 'pyverbs'"))
    backend, why = decide("auto", p)
    assert backend == "emulator"
    assert "pyverbs is not installed" in why and "dpa-offload[hw]" in why
    with pytest.raises(OffloadError, match=r"flexio.*pyverbs is not installed.*emulator"):
        decide("flexio", p)


def test_broken_pyverbs_is_named():
    p = look(import_error=OSError("libibverbs.so.1: version IBVERBS_PRIVATE_59 not found"))
    assert decide("auto", p) == ("emulator", discovery._why_not_flexio(p))
    assert "IBVERBS_PRIVATE_59" in decide("auto", p)[1]


def test_kernel_without_rdma_like_this_machine():
    # What Debian's pyverbs does on a kernel with no InfiniBand support.
    p = look(fake_verbs(None, fail_list=RuntimeError("Failed to get devices list")))
    backend, why = decide("auto", p)
    assert backend == "emulator"
    assert "no RDMA device found" in why and "Failed to get devices list" in why


def test_empty_device_list():
    assert "the kernel lists none" in decide("auto", look(fake_verbs({})))[1]


def test_devices_without_a_dpa_are_named_with_their_model():
    p = look(fake_verbs({"mlx5_0": CX6DX, "mlx5_1": CX7}))
    backend, why = decide("auto", p)
    assert backend == "emulator"
    assert "mlx5_0 (ConnectX-6 Dx)" in why and "mlx5_1 (ConnectX-7)" in why
    assert "BlueField-3" in why
    assert [d.has_dpa for d in p.devices] == [False, False]


def test_dpa_without_the_flexio_runtime():
    p = look(fake_verbs({"mlx5_0": CX6DX, "mlx5_2": BF3}), libs=())
    backend, why = decide("auto", p)
    assert backend == "emulator"
    assert "mlx5_2 (BlueField-3) has a DPA" in why and "libflexio" in why and "DOCA" in why
    with pytest.raises(OffloadError, match="libflexio cannot be loaded"):
        decide("flexio", p)


def test_dpa_and_runtime_but_backend_not_built():
    p = look(fake_verbs({"mlx5_0": BF3}))
    backend, why = decide("auto", p)
    assert backend == "emulator"
    assert "scripts/build_flexio.sh" in why and "not built" in why


def test_everything_present_selects_flexio(tmp_path):
    p = look(fake_verbs({"mlx5_0": BF3}), backend_built=True, tmp_path=tmp_path)
    backend, why = decide("auto", p)
    assert backend == "flexio" and "mlx5_0 (BlueField-3)" in why
    assert decide("flexio", p)[0] == "flexio"
    assert decide("emulator", p) == ("emulator", "requested by config (backend: emulator)")


def test_device_that_cannot_be_opened_is_identified_from_sysfs(monkeypatch):
    monkeypatch.setattr(discovery, "_sysfs_ids", lambda name: BF3)
    p = look(fake_verbs({"mlx5_0": CX6DX}, fail_open=True))
    assert p.devices == [RdmaDevice("mlx5_0", *BF3)]
    assert p.devices[0].model == "BlueField-3"


def test_unknown_parts_and_vendors():
    assert RdmaDevice("x", 0x15B3, 0x9999).model == "mlx5 part 0x9999"
    assert not RdmaDevice("x", 0x15B3, 0x9999).has_dpa
    other = RdmaDevice("rxe0", 0x1234, 0xA2DC)
    assert not other.has_dpa and other.model.startswith("vendor 0x1234")
    assert not RdmaDevice("y").has_dpa


def test_emulator_requested_looks_at_nothing(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("probed although backend: emulator")
    monkeypatch.setattr(discovery, "probe", boom)
    assert discovery.select_backend(Config(backend="emulator"))[0] == "emulator"


def test_info_prints_the_reason_first_and_a_device_table(monkeypatch, capsys):
    seen = look(fake_verbs({"mlx5_0": CX6DX, "mlx5_1": BF3}), libs=())
    monkeypatch.setattr(discovery, "probe", lambda: seen)
    monkeypatch.delenv("OFFLOAD_BACKEND", raising=False)
    monkeypatch.delenv("OFFLOAD_CONFIG", raising=False)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"backend: emulator \u2014 mlx5_1 \(BlueField-3\) has a DPA", out[0]), out[0]
    table = "\n".join(out)
    assert re.search(r"mlx5_0\s+ConnectX-6 Dx\s+0x101d\s+no", table), table
    assert re.search(r"mlx5_1\s+BlueField-3\s+0xa2dc\s+yes", table), table
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backend"] == "emulator"
    assert [d["dpa"] for d in info["devices"]] == [False, True]
    monkeypatch.setenv("OFFLOAD_BACKEND", "flexio")
    assert cli.main(["info"]) == 1
    assert "libflexio" in capsys.readouterr().out


def test_this_machine_says_emulator_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv("OFFLOAD_BACKEND", raising=False)
    monkeypatch.delenv("OFFLOAD_CONFIG", raising=False)
    assert cli.main(["info"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("backend: emulator \u2014 no DPA to use: "), first


def test_flexio_backend_library_that_does_not_load(monkeypatch, tmp_path):
    """Forcing the flexio backend past discovery: the host names the library and why."""
    from offload_lib.bootstrap import World
    from offload_lib.context import Context

    monkeypatch.setenv("OFFLOAD_FLEXIO_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(OffloadError, match=r"loading the backend library .*missing\.so"):
        Context(Config(), World(0, 1, "dpaoff-test-flexio", "single"), "flexio")
    monkeypatch.setenv("OFFLOAD_FLEXIO_LIB", "libm.so.6")   # loads, but is not our backend
    with pytest.raises(OffloadError, match="dpaoffload_flexio_ops"):
        Context(Config(), World(0, 1, "dpaoff-test-flexio", "single"), "flexio")


ALLGATHER = r'''
from offload_lib._native import ffi, lib
from offload_lib.bootstrap import allgather

ctx = ol.init()
# the bootstrap's own channel, twice (rounds must not mix)
for rnd in range(2):
    got = allgather(ctx._world, f"r{rank}-{rnd}".encode(), 10)
    assert got == [f"r{p}-{rnd}".encode() for p in range(size)], got
# through the C callback a hardware backend calls
mine = ffi.new("uint64_t *", 1000 + rank)
out = ffi.new("uint64_t[]", size)
assert lib.offload_allgather(ctx._self_handle, mine, 8, out) == 0
assert list(out) == [1000 + p for p in range(size)]
ctx.close()
'''


@pytest.mark.timeout(60)
def test_bootstrap_allgather_for_hardware_backends():
    from _mp import run_ranks

    run_ranks(3, ALLGATHER, timeout=45)


def test_firmware_version_comes_from_pyverbs_fw_version():
    p = look(fake_verbs({"mlx5_0": BF3}))
    assert p.devices == [RdmaDevice("mlx5_0", *BF3, "32.41.1000")]


def _shared_object(tmp_path, name: str, rpath: str | None = None) -> str:
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "empty.c"
    src.write_text("int dpaoffload_test_symbol;\n")
    out = tmp_path / name
    cmd = [cc, "-shared", "-fPIC", "-o", str(out), str(src)]
    if rpath is not None:
        cmd.append(f"-Wl,-rpath,{rpath}")
    subprocess.run(cmd, check=True)
    return str(out)


def test_libflexio_is_found_where_the_backend_was_linked_against_it(tmp_path):
    """An SDK outside ldconfig's list (DOCA puts FlexIO in /opt/mellanox/flexio/lib): the
    backend's own rpath ($ORIGIN expanded) is looked at first, then DOCA's directories."""
    sdk = tmp_path / "sdk" / "lib"
    sdk.mkdir(parents=True)
    (sdk / "libflexio.so").write_bytes(b"")
    (tmp_path / "b").mkdir()
    backend = _shared_object(tmp_path / "b", "libdpaoffload_flexio.so", "$ORIGIN/../sdk/lib")
    assert discovery._elf_runpath(backend) == [str(tmp_path / "b" / ".." / "sdk" / "lib")]
    path, how = discovery.find_libflexio(backend, find_library=lambda s: None, dirs=())
    assert path == str((sdk / "libflexio.so").resolve()) and "rpath" in how

    doca = tmp_path / "opt"
    doca.mkdir()
    (doca / "libflexio.so.1").write_bytes(b"")
    bare = _shared_object(tmp_path, "bare.so")
    path, how = discovery.find_libflexio(bare, find_library=lambda s: None, dirs=(str(doca),))
    assert path == str(doca / "libflexio.so.1") and "DOCA" in how
    path, how = discovery.find_libflexio(bare, find_library=lambda s: None, dirs=("/nowhere",))
    assert path is None and "/nowhere" in how and "ldconfig" in how
    assert discovery.find_libflexio(None, find_library=lambda s: "/l/libflexio.so",
                                    dirs=()) == ("/l/libflexio.so", "ldconfig")
    assert "/opt/mellanox/flexio/lib" in discovery.FLEXIO_LIB_DIRS
