"""offload_lib.bench: parsing, aggregation, the table, and real runs with the launcher and mpirun."""
from __future__ import annotations

import argparse
import importlib.util
import json

import numpy as np
import pytest

from offload_lib import bench, cli
from offload_lib.bench import machine as bench_machine
from offload_lib.bench import moe as bench_moe
from offload_lib.bench import runner

SMALL = ["--sizes", "1K,64K", "--iters", "3", "--warmup", "1"]


def data_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def mpi_missing() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install dpa-offload[mpi])"
    if bench.find_mpirun() is None:
        return "no mpirun next to sys.executable or on PATH"
    return None


# -- parsing ------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_parse_sizes():
    assert bench.parse_sizes("1K,4K,64K,256K,1M,4M") == [
        1024, 4096, 65536, 262144, 1 << 20, 4 << 20]
    assert bench.parse_sizes(" 8, 2k ,1MiB,") == [8, 2048, 1 << 20]
    assert bench.parse_sizes("0") == [0]
    for bad in ("", ",", "1Q", "-4", "1.5K"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_sizes(bad)


@pytest.mark.timeout(120)
def test_parse_args_defaults_and_options():
    a = bench.parse_args(["alltoall"])
    assert (a.collective, a.nranks, a.iters, a.warmup) == ("alltoall", 4, 20, 5)
    assert a.sizes == [1024, 4096, 65536, 262144, 1 << 20, 4 << 20]
    assert (a.buffers, a.dtype, a.compare, a.persistent) == ("numpy", np.float32, None, False)
    assert (a.json, a.config, a.timeout, a.worker) == (None, None, 600.0, False)
    assert (a.background_load, a.fixed_layout) == (False, False)

    a = bench.parse_args(["alltoall", "-n", "3", "--sizes", "2K", "--iters", "7", "--warmup", "0",
                          "--buffers", "shared", "--dtype", "int16", "--compare", "mpi",
                          "--persistent", "--json", "out.json", "--config", "c.yaml",
                          "--timeout", "30"])
    assert (a.nranks, a.sizes, a.iters, a.warmup, a.buffers) == (3, [2048], 7, 0, "shared")
    assert (a.dtype, a.compare, a.persistent, a.json) == (np.int16, "mpi", True, "out.json")
    assert (a.config, a.timeout) == ("c.yaml", 30.0)
    assert bench.parse_args(["alltoall", "--nranks", "5"]).nranks == 5


@pytest.mark.timeout(120)
def test_parse_args_moe_options():
    a = bench.parse_args(["moe"])
    assert (a.tokens, a.hidden, a.topk, a.experts, a.dtype) == (4096, 2048, 2, 8, np.float32)
    assert a.given == set()
    a = bench.parse_args(["moe", "--tokens", "7", "--hidden", "3", "--topk", "1",
                          "--experts", "4", "--dtype", "float16"])
    assert (a.tokens, a.hidden, a.topk, a.experts, a.dtype) == (7, 3, 1, 4, np.float16)
    assert a.given == {"tokens", "hidden", "topk", "experts"}
    assert bench.parse_args(["alltoallv", "--sizes", "1K"]).given == {"sizes"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", [
    ["alltoall", "-n", "0"], ["alltoall", "--iters", "0"], ["alltoall", "--warmup", "-1"],
    ["alltoall", "--buffers", "gpu"], ["alltoall", "--dtype", "object"],
    ["alltoall", "--dtype", "nope"], ["alltoall", "--compare", "nccl"],
    ["alltoall", "--timeout", "0"], ["alltoall", "--sizes", "1X"], [],
    ["moe", "--tokens", "0"], ["moe", "--topk", "x"], ["moe", "--experts", "-8"],
])
def test_bad_options_return_2(argv, capsys):
    assert bench.main(argv) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_help_returns_0(capsys):
    assert bench.main(["-h"]) == 0
    assert "--compare" in capsys.readouterr().out


# -- registry -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_unknown_collective_returns_2(capsys):
    assert bench.main(["foo", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "unknown collective 'foo'" in err and "alltoall" in err
    assert cli.main(["bench", "foo"]) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["broadcast", "allgather"])
def test_multicast_benchmarks_show_injected_bytes(name, capsys):
    assert bench.main([name, "-n", "4", "--sizes", "64K,1M", "--iters", "3", "--warmup", "1",
                       "--loss", "0.05"]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[0] for r in rows] == ["65536", "1048576"]
    assert "injected" in out and "loss 0.05" in out and "loss/none" in out
    for r in rows:
        size, injected, ring = int(r[0]), float(r[6]), float(r[7])
        # each iteration also timed loss-free: its time and the throughput ratio
        no_loss, ratio = float(r[8]), float(r[9])
        assert no_loss > 0 and abs(ratio - no_loss / float(r[2])) < 0.01 * ratio + 0.01, r
        # all-gather: each rank injects its own block once, S/n, against (n-1)/n*S for a ring
        want = size // 4 if name == "allgather" else size
        assert injected == want, (name, r)
        assert ring == (size * 3 / 4 if name == "allgather" else size), (name, r)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, needle", [
    (["alltoallv", "--persistent"], "alltoallv has no persistent form"),
    (["alltoall", "--loss", "0.1"], "only broadcast and allgather"),
    (["allgather", "-n", "4", "--sizes", "6"], "not multiples of 4 ranks"),
    (["alltoall", "--tokens", "64"], "--tokens: only the moe benchmark"),
    (["alltoallv", "--hidden", "8", "--topk", "1"], "--hidden, --topk: only the moe benchmark"),
    (["moe", "--sizes", "1K"], "moe takes --tokens/--hidden/--topk/--experts, not --sizes"),
    (["moe", "--persistent"], "moe has no persistent form"),
    (["moe", "--dtype", "int32"], "not int32"),
    (["moe", "-n", "3"], "--experts 8 does not split evenly over 3 ranks"),
    (["moe", "--topk", "9"], "--topk 9 is more than --experts 8"),
])
def test_options_that_do_not_fit_return_2(argv, needle, capsys):
    assert bench.main([*argv, "-n", "2"] if "-n" not in argv else argv) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and captured.out == ""


@pytest.mark.timeout(120)
def test_size_not_a_multiple_of_dtype(capsys):
    assert bench.main(["alltoall", "-n", "2", "--sizes", "1K,6", "--dtype", "float64"]) == 2
    assert "[6]" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_bad_config_returns_2(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dpa_thread: 4\n")
    assert bench.main(["alltoall", "-n", "2", "--config", str(cfg)]) == 2
    assert "dpa_threads" in capsys.readouterr().err


# -- aggregation and the table -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_summarize_is_median_of_per_iteration_max():
    # iteration maxima: 2, 5, 4 -> median 4
    assert bench.summarize([[1.0, 5.0, 3.0], [2.0, 1.0, 4.0]]) == 4.0
    assert bench.summarize([[7.0]]) == 7.0


@pytest.mark.timeout(120)
def test_compared_libraries_take_turns_every_iteration():
    log: list[str] = []
    runs = [(lambda: log.append("ours"), lambda: log.append("ours barrier")),
            (lambda: log.append("mpi"), lambda: log.append("mpi barrier"))]
    (ours_wall, ours_cpu), (mpi_wall, mpi_cpu) = runner._taking_turns(runs, 1, 3)
    assert log == ["ours barrier", "ours", "mpi barrier", "mpi"] * 4
    assert len(ours_wall) == len(ours_cpu) == len(mpi_wall) == len(mpi_cpu) == 3
    assert min(ours_wall + mpi_wall) >= 0


@pytest.mark.timeout(120)
def test_make_row_bandwidths():
    row = bench.make_row(1 << 20, 1 << 18, 4, 3 / 4, 1e-3, 20e-6)
    assert row["time_us"] == pytest.approx(1000.0)
    assert row["algbw"] == pytest.approx(4 * (1 << 20) / 1e-3 / 1e9)
    assert row["busbw"] == pytest.approx(row["algbw"] * 0.75)
    assert row["cpu_us"] == pytest.approx(20.0)
    assert "mpi_time_us" not in row

    row = bench.make_row(1 << 20, 1 << 18, 4, 3 / 4, 1e-3, 20e-6, 2e-3, 1e-3)
    assert row["mpi_busbw"] == pytest.approx(row["busbw"] / 2)
    assert row["ratio"] == pytest.approx(2.0)
    assert row["mpi_cpu_us"] == pytest.approx(1000.0)
    # one rank: busbw is 0, the ratio still means something
    assert bench.make_row(1024, 256, 1, 0.0, 1e-5, 0, 2e-5, 0)["ratio"] == pytest.approx(2.0)


META = {"command": "dpa-offload bench alltoall -n 4", "date": "2026-11-29T12:00:00+00:00",
        "host": "box", "cpus": 8, "collective": "alltoall", "nranks": 4, "backend": "emulator",
        "config": {"dpa_threads": 2, "chunk_size": 262144}, "buffers": "numpy",
        "dtype": "float32", "persistent": False, "iters": 20, "warmup": 5,
        "launcher": "dpa-offload", "mpi": "Open MPI v5", "mpi4py": "4.1"}


@pytest.mark.timeout(120)
def test_format_table_offload_only():
    rows = [bench.make_row(1024, 256, 4, 0.75, 10e-6, 3e-6),
            bench.make_row(1 << 20, 1 << 18, 4, 0.75, 1e-3, 20e-6)]
    text = bench.format_table(META, rows)
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert head[0] == "# dpa-offload bench alltoall -n 4"
    for needle in ("2026-11-29", "box (8 CPUs)", "n: 4", "backend: emulator", "dpa_threads: 2",
                   "chunk_size: 262144", "buffers: numpy"):
        assert needle in text
    cols = next(line for line in head if "time_us" in line).lstrip("#").split()
    assert cols == ["size", "count", "time_us", "algbw", "busbw", "cpu_us"]
    rows_out = data_rows(text)
    assert rows_out == [["1024", "256", "10.0", "0.41", "0.31", "3.0"],
                        ["1048576", "262144", "1000.0", "4.19", "3.15", "20.0"]]
    assert "mpi" not in " ".join(cols)


@pytest.mark.timeout(120)
def test_format_table_with_mpi():
    rows = [bench.make_row(65536, 16384, 4, 0.75, 100e-6, 5e-6, 50e-6, 40e-6)]
    text = bench.format_table(dict(META, launcher="mpi"), rows)
    cols = next(line for line in text.splitlines() if "time_us" in line).lstrip("#").split()
    assert cols[-4:] == ["mpi_time_us", "mpi_busbw", "mpi_cpu_us", "ratio"]
    (row,) = data_rows(text)
    assert len(row) == len(cols)
    got = dict(zip(cols, row))
    assert got["mpi_time_us"] == "50.0" and got["ratio"] == "0.50" and got["mpi_cpu_us"] == "40.0"
    assert float(got["busbw"]) == pytest.approx(float(got["mpi_busbw"]) / 2, abs=0.01)
    assert "Open MPI v5" in text


@pytest.mark.timeout(120)
def test_aggregate_uses_slowest_rank_and_rank0_cpu():
    def rank(times, cpu):
        return {"results": [{"size": 4096, "count": 1024, "offload_s": times,
                             "offload_cpu_s": cpu}]}

    per_rank = [rank([1e-3, 3e-3, 2e-3], [1e-6, 2e-6, 3e-6]), rank([4e-3, 1e-3, 1e-3], [9, 9, 9])]
    (row,) = bench.aggregate(bench.COLLECTIVES["alltoall"], 2, per_rank)
    assert row["time_us"] == pytest.approx(3000.0)  # maxima 4, 3, 2 ms
    assert row["cpu_us"] == pytest.approx(2.0)  # rank 0's median


# -- data patterns and the correctness check -------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "uint8", "int64",
                                   "complex64", "bool"])
def test_patterns_are_exact_and_poison_differs(dtype):
    dt = np.dtype(dtype)
    a = bench.block_pattern(dt, 2, 3, 5000)
    assert a.dtype == dt and a.size == 5000
    assert np.array_equal((a.real if dt.kind == "c" else a).astype(np.int64).astype(dt), a)
    assert not np.any(bench._poison(a) == a)
    if dt.kind != "b":
        assert not np.array_equal(a, bench.block_pattern(dt, 3, 2, 5000))


class _FakeTeam:
    rank, size = 1, 2


@pytest.mark.timeout(120)
def test_check_fails_loudly():
    case = bench._AlltoallCase.__new__(bench._AlltoallCase)
    case.team, case.count = _FakeTeam(), 4
    case.expected = np.arange(8, dtype=np.float32)
    case.dst = case.expected.copy()
    case.check("offload")
    case.dst[6] = -1
    with pytest.raises(bench.WrongResult, match=r"WRONG RESULT on rank 1/2.*rank 1, element 2"):
        case.check("offload")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 256, 262144])
def test_alltoallv_counts_are_uneven_around_count(n, count):
    m = bench.alltoallv_counts(n, count)
    assert m.shape == (n, n) and m.dtype == np.int64 and (m >= 0).all()
    # every rank sends and receives about n * count (the factors average exactly 1)
    assert np.all(np.abs(m.sum(axis=1) - n * count) <= n)
    assert np.all(np.abs(m.sum(axis=0) - n * count) <= n)
    assert np.all(m <= np.rint(1.5 * count)) and np.all(m >= np.rint(0.5 * count))
    if n > 1 and count >= 256:
        assert len(set(m[0].tolist())) == n  # uneven: every peer gets a different count
    assert np.array_equal(m, bench.alltoallv_counts(n, count))  # the same on every rank


@pytest.mark.timeout(120)
def test_make_row_uses_bytes_sent_when_given():
    row = bench.make_row(1 << 20, 1 << 18, 4, 0.75, 1e-3, 0, nbytes=3_000_000)
    assert row["algbw"] == pytest.approx(3.0)
    assert row["busbw"] == pytest.approx(2.25)


class _FakeTeam3:
    rank, size = 1, 3


@pytest.mark.timeout(120)
def test_alltoallv_check_fails_loudly():
    case = bench._AlltoallvCase.__new__(bench._AlltoallvCase)
    case.team, case.count = _FakeTeam3(), 4
    case.recvs = np.array([2, 0, 3], np.int64)
    case.expected = np.arange(5, dtype=np.float32)
    case.dst = case.expected.copy()
    case.got_counts = {"offload": np.array([2, 0, 3], np.int64)}
    case.check("offload")
    case.dst[3] = -1
    with pytest.raises(bench.WrongResult,
                       match=r"WRONG RESULT on rank 1/3.*index 3 \(block from rank 2, element 1\)"):
        case.check("offload")
    case.dst[3] = 3
    case.got_counts["offload"] = np.array([2, 1, 2], np.int64)
    with pytest.raises(bench.WrongResult, match=r"receive counts \[2, 1, 2\], expected \[2, 0, 3\]"):
        case.check("offload")


# -- moe: inputs, reference, aggregation, table ---------------------------------------------------


@pytest.mark.timeout(120)
def test_moe_routing_is_seeded_and_valid():
    idx, w = bench_moe.routing(3, 500, 3, 12)
    assert idx.shape == (500, 3) and idx.dtype == np.int64 and w.dtype == np.float32
    assert ((idx >= 0) & (idx < 12)).all()
    assert all(len(set(row)) == 3 for row in idx.tolist())  # distinct experts per token
    assert np.isin(w, [0.25, 0.5, 0.75, 1.0]).all()
    again = bench_moe.routing(3, 500, 3, 12)
    assert np.array_equal(idx, again[0]) and np.array_equal(w, again[1])
    assert not np.array_equal(idx, bench_moe.routing(2, 500, 3, 12)[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_moe_reference_matches_the_dispatcher_semantics(dtype):
    """The reference against a direct single-process computation for 2 ranks."""
    dt = np.dtype(dtype)
    tokens, hidden, topk, experts, n = 50, 6, 2, 4, 2
    ref = bench_moe._Expected(1, n, tokens, hidden, topk, experts, dt)
    rows, idx_rows = [], []
    for r in range(n):
        idx, _ = bench_moe.routing(r, tokens, topk, experts)
        x = bench_moe.token_rows(r, np.arange(tokens), hidden, dt, topk)
        for t in range(tokens):
            if any(e // 2 == 1 for e in idx[t]):
                rows.append(x[t])
                idx_rows.append([e - 2 if e // 2 == 1 else -1 for e in idx[t]])
    assert np.array_equal(ref.x, np.array(rows, dt)) and ref.x.dtype == dt
    assert np.array_equal(ref.idx, np.array(idx_rows, np.int64))
    ref.check_dispatch("offload", ref.x.copy(), ref.idx.copy(), ref.w.copy())
    bad = ref.x.copy()
    bad[3, 2] += 1
    with pytest.raises(bench.WrongResult, match=r"recv_x differs in 1 places; first at \[3, 2\]"):
        ref.check_dispatch("offload", bad, ref.idx, ref.w)
    with pytest.raises(bench.WrongResult, match=r"recv_topk_idx is int32"):
        ref.check_dispatch("mpi", ref.x, ref.idx.astype(np.int32), ref.w)
    out = ref.out.astype(dt)
    ref.check_combine("offload", out)
    out[0, 0] = out[0, 0] * 2 + 1
    with pytest.raises(bench.WrongResult, match=r"combine gave a WRONG RESULT on rank 1/2"):
        ref.check_combine("offload", out)


def _moe_rank(d, c, md=None, mc=None):
    e = [{"phase": "dispatch", "rows": 10, "bytes": 4000, "offload_s": d, "offload_cpu_s": d},
         {"phase": "combine", "rows": 10, "bytes": 4000, "offload_s": c, "offload_cpu_s": c}]
    if md is not None:
        e[0].update(mpi_s=md, mpi_cpu_s=md)
        e[1].update(mpi_s=mc, mpi_cpu_s=mc)
    return {"results": e}


@pytest.mark.timeout(120)
def test_moe_aggregate_and_table():
    per_rank = [_moe_rank([1e-3, 2e-3, 3e-3], [1e-3] * 3, [2e-3] * 3, [4e-3] * 3),
                _moe_rank([4e-3, 1e-3, 1e-3], [2e-3] * 3, [2e-3] * 3, [1e-3] * 3)]
    per_rank[1]["results"][0]["bytes"] = 6000
    d, c = bench_moe.aggregate(2, per_rank)
    assert d["phase"] == "dispatch" and d["time_us"] == pytest.approx(3000.0)  # maxima 4, 2, 3
    assert d["bytes"] == 5000 and d["gbps"] == pytest.approx(5000 / 3e-3 / 1e9)
    assert d["ratio"] == pytest.approx(2e-3 / 3e-3) and c["ratio"] == pytest.approx(2.0)
    assert d["cpu_us"] == pytest.approx(2000.0)  # rank 0's median
    meta = dict(META, collective="moe", tokens=64, hidden=32, topk=2, experts=8)
    text = bench_moe.format_table(meta, [d, c])
    cols = next(line for line in text.splitlines() if "time_us" in line).lstrip("#").split()
    assert cols == ["phase", "rows", "bytes", "time_us", "GB/s", "cpu_us", "mpi_time_us",
                    "mpi_GB/s", "mpi_cpu_us", "ratio"]
    rows = data_rows(text)
    assert [r[0] for r in rows] == ["dispatch", "combine"] and all(len(r) == 10 for r in rows)
    assert rows[1][-1] == "2.00"
    assert "tokens: 64  hidden: 32  topk: 2  experts: 8" in text
    no_mpi = bench_moe.aggregate(2, [_moe_rank([1e-3], [1e-3]), _moe_rank([1e-3], [1e-3])])
    assert len(data_rows(bench_moe.format_table(meta, no_mpi))[0]) == 6


# -- real runs ------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_end_to_end_launcher(capsys):
    assert bench.main(["alltoall", "-n", "2", *SMALL]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[:2] for r in rows] == [["1024", "256"], ["65536", "16384"]]
    assert all(len(r) == 6 and float(r[2]) > 0 for r in rows)
    assert "n: 2" in out and "backend:" in out and "launcher: dpa-offload" in out


@pytest.mark.timeout(120)
def test_end_to_end_shared_persistent_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    argv = ["alltoall", "-n", "3", "--sizes", "4K", "--iters", "2", "--warmup", "0",
            "--buffers", "shared", "--persistent", "--dtype", "int8", "--json", str(path)]
    assert bench.main(argv) == 0
    assert len(data_rows(capsys.readouterr().out)) == 1
    doc = json.loads(path.read_text())
    assert doc["meta"]["buffers"] == "shared" and doc["meta"]["persistent"] is True
    assert [r["count"] for r in doc["rows"]] == [4096]
    assert len(doc["raw"]) == 3 and len(doc["raw"][0]["results"][0]["offload_s"]) == 2


def _layout_fixable() -> str | None:
    try:
        with bench_machine.fixed_layout(True):
            pass
    except bench_machine.LayoutError as e:
        return str(e)
    return None


@pytest.mark.timeout(120)
def test_fixed_layout_reaches_the_ranks_only(tmp_path, capsys):
    """--fixed-layout: the ranks ran with ASLR off and the table says so; this process keeps
    its own personality. Without it (where the kernel randomizes) the ranks' layouts were
    randomized and the table says nothing."""
    reason = _layout_fixable()
    if reason:
        pytest.skip(reason)
    with open("/proc/self/personality", encoding="ascii") as f:
        before = f.read()
    runs = {}
    for flag in (["--fixed-layout"], []):
        path = tmp_path / f"layout{len(flag)}.json"
        assert bench.main(["alltoall", "-n", "2", "--sizes", "1K", "--iters", "2", "--warmup",
                           "0", "--json", str(path), *flag]) == 0
        runs[bool(flag)] = (capsys.readouterr().out, json.loads(path.read_text())["meta"])
    with open("/proc/self/personality", encoding="ascii") as f:
        assert f.read() == before
    out, meta = runs[True]
    assert meta["layout_randomized"] is False and "# address layout: fixed" in out
    with open("/proc/sys/kernel/randomize_va_space", encoding="ascii") as f:
        randomizing = f.read().strip() != "0"
    out, meta = runs[False]
    assert meta["layout_randomized"] is randomizing
    assert ("address layout" in out) is not randomizing


def test_fixed_layout_refused_returns_2(monkeypatch, capsys):
    """A kernel (or a container's seccomp profile) that refuses the personality: a clear
    error before any rank starts."""
    def refuse(persona: int) -> int:
        raise bench_machine.LayoutError("personality() failed: Operation not permitted")

    monkeypatch.setattr(bench_machine, "_personality", refuse)
    assert bench.main(["alltoall", "-n", "2", "--sizes", "1K", "--fixed-layout"]) == 2
    err = capsys.readouterr().err
    assert "--fixed-layout: personality() failed" in err


@pytest.mark.timeout(120)
def test_end_to_end_compare_mpi(capsys):
    reason = mpi_missing()
    if reason:
        pytest.skip(reason)
    assert bench.main(["alltoall", "-n", "2", *SMALL, "--compare", "mpi"]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[:2] for r in rows] == [["1024", "256"], ["65536", "16384"]]
    assert all(len(r) == 10 and float(r[6]) > 0 for r in rows)
    assert "launcher: mpi" in out and "mpi_busbw" in out


@pytest.mark.timeout(120)
def test_timeout_stops_the_ranks(capsys):
    assert bench.main(["alltoall", "-n", "2", "--timeout", "0.05"]) == 1
    assert "timed out after 0.05 s" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_timeout_stops_mpirun(capsys):
    reason = mpi_missing()
    if reason:
        pytest.skip(reason)
    assert bench.main(["alltoall", "-n", "2", "--compare", "mpi", "--timeout", "0.05"]) == 1
    assert "timed out after 0.05 s" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_end_to_end_alltoallv(capsys):
    assert bench.main(["alltoallv", "-n", "2", "--sizes", "0,1K,64K,4104", "--iters", "3",
                       "--warmup", "1", "--dtype", "float64", "--buffers", "shared"]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[:2] for r in rows] == [["0", "0"], ["1024", "128"], ["65536", "8192"],
                                     ["4104", "513"]]
    assert all(len(r) == 6 for r in rows) and all(float(r[2]) > 0 for r in rows[1:])
    assert "collective: alltoallv" in out and "bytes per peer on average" in out


@pytest.mark.timeout(120)
def test_end_to_end_alltoallv_compare_mpi(tmp_path, capsys):
    reason = mpi_missing()
    if reason:
        pytest.skip(reason)
    path = tmp_path / "v.json"
    assert bench.main(["alltoallv", "-n", "2", *SMALL, "--compare", "mpi", "--dtype", "uint8",
                       "--json", str(path)]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[:2] for r in rows] == [["1024", "1024"], ["65536", "65536"]]
    assert all(len(r) == 10 and float(r[6]) > 0 for r in rows)
    assert "comm.Alltoall of the counts + comm.Alltoallv" in out
    doc = json.loads(path.read_text())
    # algbw from the bytes a rank really sends: the count matrix's average row
    m = bench.alltoallv_counts(2, 1024)
    assert doc["raw"][0]["results"][0]["bytes"] == m.sum() // 2
    assert doc["rows"][0]["algbw"] == pytest.approx(m.sum() / 2 / doc["rows"][0]["time_us"] / 1e3)


@pytest.mark.timeout(120)
def test_end_to_end_moe(capsys):
    argv = ["moe", "-n", "2", "--tokens", "64", "--hidden", "40", "--topk", "3", "--experts",
            "4", "--iters", "2", "--warmup", "1", "--dtype", "float16"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[0] for r in rows] == ["dispatch", "combine", "both"]
    assert all(len(r) == 6 and float(r[3]) > 0 for r in rows)
    assert float(rows[0][2]) == float(rows[0][1]) * 40 * 2  # bytes = rows * hidden * 2
    # both = dispatch + combine: rows and bytes add up, so does time (per iteration)
    assert float(rows[2][1]) == float(rows[0][1]) + float(rows[1][1])
    assert float(rows[2][3]) >= 0.9 * max(float(rows[0][3]), float(rows[1][3]))


@pytest.mark.timeout(120)
def test_end_to_end_moe_compare_mpi(capsys):
    reason = mpi_missing()
    if reason:
        pytest.skip(reason)
    assert bench.main(["moe", "-n", "3", "--tokens", "50", "--hidden", "16", "--experts", "6",
                       "--iters", "2", "--warmup", "0", "--compare", "mpi",
                       "--buffers", "shared"]) == 0
    out = capsys.readouterr().out
    rows = data_rows(out)
    assert [r[0] for r in rows] == ["dispatch", "combine", "both"]
    assert all(len(r) == 10 and float(r[6]) > 0 and float(r[9]) > 0 for r in rows)
    assert "Alltoall(counts) + Alltoallv(rows) + Alltoallv(metadata)" in out
