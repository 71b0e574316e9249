"""``dpa-offload sim``: the table, the model listing and its sources, YAML overrides, the
sweep's CSV and PNG (matplotlib: the test extra), the Chrome trace, errors that say
what to fix, a job too large for the memory refused, and a simulator killed named by its signal."""
from __future__ import annotations

import csv
import functools
import json
import resource
import subprocess

import pytest

from _sim import sim
from offload_lib import cli, sim_cli, sim_model


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["sim", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_columns(capsys):
    rc, out, _ = _run(capsys, "alltoall", "-n", "4", "--size", "16K", "--threads", "2")
    assert rc == 0
    for col in ("time_us", "algbw", "busbw", "inj/rank", "link_max", "dpa_busy", "passes"):
        assert col in out
    row = [line for line in out.splitlines() if not line.startswith("#")]
    assert len(row) == 1 and row[0].split()[:2] == ["16384", "4"]


def test_every_parameter_has_a_source(capsys):
    names = sim_model.defaults()
    assert set(names) == set(sim_model.SOURCES), "a model parameter without a source, or a stale one"
    rc, out, _ = _run(capsys, "model", "--markdown")
    assert rc == 0 and out.count("\n") >= len(names) + 1


def test_yaml_override_changes_the_prediction(tmp_path, capsys):
    slow = tmp_path / "slow.yaml"
    slow.write_text("link_gbps: 100\n")
    base = sim_model.defaults()
    assert sim_model.load_overrides(str(slow), base) == {"link_gbps": 100}
    rc, out_fast, _ = _run(capsys, "alltoall", "-n", "4", "--size", "4M", "--json")
    rc2, out_slow, _ = _run(capsys, "alltoall", "-n", "4", "--size", "4M", "--json", "--model", str(slow))
    assert rc == rc2 == 0
    assert json.loads(out_slow)["time_ps"] > 3 * json.loads(out_fast)["time_ps"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("link_gbs: 100\n")
    rc, _, err = _run(capsys, "alltoall", "--model", str(bad))
    assert rc == 2 and "unknown parameter 'link_gbs'" in err and "link_gbps" in err


def test_sweep_writes_csv_and_plot(tmp_path, capsys):
    """The sweep's CSV has a row per n; the PNG is a PNG of the figure matplotlib drew from
    those rows: the simulated time, a ring's closed-form time and both injected-bytes series,
    each line holding the CSV's values, and pixels of the first line's colour in the image."""
    import matplotlib.image
    import numpy as np

    path, png = tmp_path / "ag.csv", tmp_path / "ag.png"
    rc, out, _ = _run(capsys, "allgather", "--size", "64K", "--threads", "2", "--sweep", "n=4..16",
                      "--mcast-roots", "16", "--csv", str(path), "--plot", str(png))
    assert rc == 0 and f"wrote {png}" in out
    rows = list(csv.DictReader(open(path)))
    assert [int(r["n"]) for r in rows] == [4, 8, 16]
    # multicast injects S/n per rank, a ring (n-1)/n x S
    for r in rows:
        n = int(r["n"])
        assert float(r["inj_mb"]) < float(r["ring_mb"]) / (n - 1) * 1.5
        assert float(r["ring_us"]) > 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1210, 462)  # figsize 11 x 4.2 at 110 dpi: the two-panel figure

    typed = [{k: float(v) for k, v in r.items()} for r in rows]
    for r in typed:
        r["n"] = int(r["n"])
    fig = sim_cli.build_figure("allgather", typed)
    time_ax, bytes_ax = fig.axes
    series = {line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()}
    assert len(time_ax.get_lines()) == 2 and len(bytes_ax.get_lines()) == 2
    assert series["allgather (simulated)"] == [r["time_us"] for r in typed]
    assert series["ring all-gather (closed form)"] == [r["ring_us"] for r in typed]
    assert series["multicast: injected per rank"] == [r["inj_mb"] for r in typed]
    assert series["ring: (n-1)/n x S per rank"] == [r["ring_mb"] for r in typed]
    # the saved image has the simulated line drawn in it (matplotlib's first colour, C0)
    img = matplotlib.image.imread(str(png))[:, :, :3]
    c0 = np.array([0x1f, 0x77, 0xb4]) / 255
    assert (np.abs(img - c0).max(axis=2) < 0.02).sum() > 200


def test_plot_without_matplotlib_says_so(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rc, _, err = _run(capsys, "allgather", "--sweep", "n=4..8", "--plot", str(tmp_path / "x.png"))
    assert rc == 2 and "needs matplotlib" in err


def test_trace_is_chrome_json(tmp_path, capsys):
    path = tmp_path / "t.json"
    rc, _, _ = _run(capsys, "alltoall", "-n", "4", "--size", "64K", "--trace", str(path))
    assert rc == 0
    events = json.load(open(path))["traceEvents"]
    assert {e["name"] for e in events} >= {"pass", "tx"}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


@pytest.mark.parametrize("argv, words", [
    (["alltoall", "-n", "4097"], "jobs hold 1..4096 ranks"),
    (["alltoall", "-n", "0"], "at least 1 rank"),
    (["allreduce", "-n", "4", "--size", "1M", "--payload", "phantom"], "phantom payload cannot"),
    (["alltoall", "-n", "8", "--size", "4"], "less than one byte per rank"),
    (["gather"], "want one of"),
    (["alltoall", "--topology", "ring"], "fattree:hosts_per_leaf"),
])
def test_errors_say_what_to_fix(capsys, argv, words):
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and words in err


def test_fat_tree_costs_more_than_a_switch(capsys):
    args = ["alltoall", "-n", "16", "--size", "1M", "--json"]
    _, one, _ = _run(capsys, *args)
    _, tree, _ = _run(capsys, *args, "--topology", "fattree:hosts_per_leaf=4,uplinks=1")
    assert json.loads(tree)["time_ps"] > json.loads(one)["time_ps"]


def _cap_address_space(limit: int):
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    return cap


def test_a_job_too_large_for_the_memory_limit_is_refused(capsys, monkeypatch):
    """dpa-sim sizes the job before it allocates: 64 ranks map ~1.2 GiB (the control
    regions), so under a 256 MiB RLIMIT_AS it refuses with exit 2 and says why, and the
    CLI prints that, not 'dpa-sim failed'."""
    cap = _cap_address_space(256 << 20)
    args = [str(sim_model.binary()), "run", "coll=barrier", "n=64", "threads=2"]
    proc = subprocess.run(args, capture_output=True, text=True, preexec_fn=cap, timeout=30)
    assert proc.returncode == 2 and not proc.stdout
    assert "n=64 maps ~" in proc.stderr and "RLIMIT_AS allows" in proc.stderr
    ran = subprocess.run
    monkeypatch.setattr(sim_cli.subprocess, "run", functools.partial(ran, preexec_fn=cap))
    rc, _, err = _run(capsys, "barrier", "-n", "64")
    assert rc == 2 and "RLIMIT_AS allows" in err and "dpa-sim failed" not in err


@pytest.mark.parametrize("coll,held", [
    ("alltoall", lambda s, n: 2 * s * n),
    ("allgather", lambda s, n: s + s * n),
    ("broadcast", lambda s, n: s),                 # one buffer under two keys
    ("allreduce", lambda s, n: 3 * s),             # src, dst and the scratch (aux)
    ("reduce_scatter", lambda s, n: s + s // n + s),
])
def test_the_memory_estimate_holds_every_buffer_an_op_allocates(coll, held):
    """The estimate the refusal above compares grows with an op's size by exactly the
    buffers dpa-sim allocates for it (on every rank, for every op of the window): a
    reduction's scratch too, which the estimate once left out."""
    n, window, size = 4, 2, 64 << 10

    def est(s: int) -> int:
        out = sim("run", f"coll={coll}", f"n={n}", f"size={s}", f"window={window}", "iters=1")
        assert out[-1]["ok"], out
        return out[-1]["mem_touched_est"]

    assert est(2 * size) - est(size) == n * window * held(size, n)


def test_a_killed_simulator_is_named_by_its_signal(capsys, monkeypatch, tmp_path):
    """As the OOM killer ends a job too large for the machine: the CLI names the signal."""
    fake = tmp_path / "dpa-sim"
    real = sim_model.binary()
    fake.write_text(f"#!/bin/sh\n[ \"$1\" = model ] && exec {real} model\n"
                    "echo 'allocating' >&2\nkill -KILL $$\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sim_model, "binary", lambda: fake)
    rc, _, err = _run(capsys, "broadcast", "-n", "8", "--size", "64K")
    assert rc == 2 and "killed by SIGKILL" in err and "OOM killer" in err
    assert "allocating" in err
