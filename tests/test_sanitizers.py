"""The C core under sanitizers, with gcc, no Python in the data path.

- The firmware fuzz harness (tests/c/fuzz_main.c and its parts: the real engine over an
  in-process test HAL, fed random and mutated command rings) built with AddressSanitizer +
  UndefinedBehaviorSanitizer, run for a bounded time with a fixed seed. Targets, sources and
  flags: build_defs.py (``python3 build_defs.py build fuzz_main out`` builds one by hand).
- tests/c/multirank.c (N rank processes on the emulator through host/'s C API, every element
  checked) with ASan + UBSan at 2 ranks and at 4 (two rails, the first failing mid-run), at
  65 (-scale: a job past 64 ranks), and with ThreadSanitizer at 2 ranks (same rails).

A failure prints the sanitizer's report; the fuzz driver also prints the failing input in hex
and saves it, so that ``fuzz_main <file>`` replays it (see tests/c/fuzz_main.c). A test is
skipped only when gcc or the sanitizer's runtime is missing, which a tiny program decides.
Environment: OFFLOAD_FUZZ_SECONDS (default 20) and OFFLOAD_FUZZ_SEED (default 1).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import build_defs

ROOT = build_defs.ROOT
CC = shutil.which("gcc")

FUZZ_SECONDS = float(os.environ.get("OFFLOAD_FUZZ_SECONDS", "20"))
FUZZ_SEED = int(os.environ.get("OFFLOAD_FUZZ_SEED", "1"))

_TINY = r"""
#include <pthread.h>
#include <stdlib.h>
static void *run(void *p) { return p; }
int main(void)
{
	pthread_t t;
	char *p = malloc(16);

	if (pthread_create(&t, NULL, run, p) || pthread_join(t, NULL))
		return 1;
	p[0] = 1;
	free(p);
	return 0;
}
"""

_usable: dict[tuple[str, ...], str | None] = {}


def _sanitizer_missing(flags: list[str], tmp: Path) -> str | None:
    """Why these sanitizer flags can't be used here (None: they can): compile and run a tiny
    program with them."""
    key = tuple(flags)
    if key not in _usable:
        if CC is None:
            _usable[key] = "gcc is not installed"
        else:
            src, exe = tmp / "tiny.c", tmp / "tiny"
            src.write_text(_TINY)
            build = subprocess.run([CC, *flags, str(src), "-lpthread", "-o", str(exe)],
                                   capture_output=True, text=True)
            if build.returncode:
                _usable[key] = f"gcc cannot link {' '.join(flags)}: {build.stderr.strip()[-500:]}"
            else:
                run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
                _usable[key] = (None if run.returncode == 0 else
                                f"the {' '.join(flags)} runtime does not run here: "
                                f"{run.stderr.strip()[-500:]}")
    return _usable[key]


def _build(tmp: Path, target: str) -> Path:
    """A target of build_defs.py, built into tmp (skipped where its sanitizer is missing)."""
    spec = build_defs.targets()[target]
    reason = _sanitizer_missing(spec.flags, tmp)
    if reason:
        pytest.skip(reason)
    exe = tmp / target
    result = spec.build(CC, exe)
    assert result.returncode == 0, f"build failed:\n{' '.join(result.args)}\n{result.stderr}"
    return exe


def _text(data: str | bytes | None) -> str:
    # TimeoutExpired carries bytes even when the run asked for text.
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    for key in ("OFFLOAD_RANK", "OFFLOAD_SIZE", "OFFLOAD_JOB", "OFFLOAD_LOCAL_RANK"):
        full_env.pop(key, None)
    full_env.update(env or {})
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=cwd)
    except subprocess.TimeoutExpired as e:
        out, err = (_text(x) for x in (e.stdout, e.stderr))
        pytest.fail(f"{' '.join(cmd)} ran past {timeout} s\n--- stdout\n{out[-4000:]}\n"
                    f"--- stderr\n{err[-8000:]}", pytrace=False)


def _clip(text: str, head: int, tail: int) -> str:
    """The start (where a sanitizer's report is) and the end (the saved reproducer)."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


def _report(what: str, result: subprocess.CompletedProcess[str]) -> str:
    return (f"{what} exited {result.returncode}\n--- stdout\n{_clip(result.stdout, 2000, 2000)}\n"
            f"--- stderr\n{_clip(result.stderr, 10000, 1500)}")


@pytest.mark.timeout(int(FUZZ_SECONDS) + 120)
def test_fuzz_engine_asan_ubsan(tmp_path: Path) -> None:
    """Random and mutated command rings never crash the engine, never make it write outside
    what it owns, and every command gets exactly one well-formed completion."""
    exe = _build(tmp_path, "fuzz_main")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    result = _run([str(exe), f"-seed={FUZZ_SEED}", f"-max_total_time={FUZZ_SECONDS:g}",
                   f"-artifact_prefix={artifacts}/"], timeout=FUZZ_SECONDS + 90, cwd=tmp_path)
    print(result.stdout)
    assert result.returncode == 0, _report("fuzz_main", result)
    # Not vacuous: the harness ran many inputs and some collectives completed successfully.
    summary = result.stdout
    iterations = int(summary.split("iterations=")[1].split()[0])
    ok = int(summary.split("ok_collectives=")[1].split()[0])
    assert iterations >= 100 and ok > 0, f"the fuzz run did too little:\n{summary}"


@pytest.fixture(scope="module")
def multirank_asan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("multirank-asan")
    return _build(tmp, "multirank_asan")


# Two rails of which the first fails once a rank sent 1 MB through it: the failover path too.
FAILOVER = ["-rails", "2", "-rail0_down_after", "1000000"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,extra", [(2, []), (4, FAILOVER), (3, ["-staged"]),
                                     (3, ["-threads-only"])],
                         ids=["2", "4-failover", "3-staged", "3-threads-only"])
def test_multirank_asan_ubsan(multirank_asan: Path, n: int, extra: list[str]) -> None:
    """Every rank's all-to-all, all-to-all-v and barrier data is right, with no memory error,
    undefined behaviour or leak in firmware, emulator or host; small ops driven by the host
    threads (cooperative progress), or, with -threads-only, by the DPA threads alone."""
    result = _run([str(multirank_asan), "-n", str(n), *extra, "-timeout", "60"], timeout=90,
                  env={"ASAN_OPTIONS": "detect_leaks=1"})
    print(result.stdout)
    what = f"multirank -n {n} {' '.join(extra)} (ASan+UBSan)"
    assert result.returncode == 0, _report(what, result)


@pytest.mark.timeout(120)
def test_multirank_beyond_64_ranks(multirank_asan: Path) -> None:
    """A job of 65 ranks (past every 64-bit rank mask the ABI had before version 13): the
    barrier, all-to-all (eager-sized blocks take the ready path in a team this large), the
    same on a team in reverse order, all-to-all-v in each mode, a multicast all-gather
    and broadcast with loss, and an agreement over the world whose failed set holds rank 64
    (ABI 14), then the survivors' team, an all-to-all on it and an agreement among them,
    every element checked, under ASan + UBSan."""
    n = 65
    result = _run([str(multirank_asan), "-n", str(n), "-threads", "1", "-scale",
                   "-timeout", "90"], timeout=110, env={"ASAN_OPTIONS": "detect_leaks=1"})
    what = f"multirank -n {n} -scale (ASan+UBSan)"
    assert result.returncode == 0, _report(what, result)
    assert result.stdout.count("] ok") == n, _report(what, result)


@pytest.fixture(scope="module")
def multirank_tsan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("multirank-tsan")
    return _build(tmp, "multirank_tsan")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("extra", [[], ["-staged"]], ids=["direct", "staged"])
def test_multirank_tsan(multirank_tsan: Path, extra: list[str]) -> None:
    """No data race between the emulator's DPA threads, the host's threads (two post at
    once, and run the firmware themselves for small ops) and the firmware, with multicast
    placed by id or staged."""
    result = _run([str(multirank_tsan), "-n", "2", *FAILOVER, *extra, "-timeout", "60"],
                  timeout=90, env={"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"})
    print(result.stdout)
    what = f"multirank -n 2 {' '.join(FAILOVER + extra)} (TSan)"
    assert result.returncode == 0, _report(what, result)
