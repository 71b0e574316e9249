#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, run the GPU tests and a small benchmark,
# and write the results (with the date and the GPU) where docs/ can take them. Installs
# nothing; finishes in under 5 minutes.
#
#   scripts/gpu_check.sh [OUTDIR]      (default: docs/results)
#
# Needs python3 with torch (CUDA build) and/or cupy, numpy, pyyaml, pytest, pytest-timeout,
# cffi and a C compiler. Without the built extension it builds it in place (setup.py
# build_ext --inplace); a missing module is named and the script exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/results}
mkdir -p "$out"
py=${PYTHON:-python3}

for mod in cffi numpy yaml pytest pytest_timeout; do
	"$py" -c "import $mod" 2>/dev/null || { echo "gpu_check: python module '$mod' is missing" >&2; exit 2; }
done
"$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null ||
	{ echo "gpu_check: torch sees no CUDA device: run this on a GPU machine" >&2; exit 2; }
if ! "$py" -c "import offload_lib._native" 2>/dev/null; then
	"$py" setup.py -q build_ext --inplace >/dev/null
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)
stamp=$(date +%Y-%m-%d)
log="$out/gpu_check_$stamp.txt"
{
	echo "# scripts/gpu_check.sh on $(hostname), $stamp; GPU: $gpu"
	"$py" -c "import torch; print('# torch', torch.__version__, 'cuda', torch.version.cuda)" 2>/dev/null || true
	"$py" -c "import cupy; print('# cupy', cupy.__version__)" 2>/dev/null || true
} >"$log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
set +e
timeout 200 "$py" -m pytest -q -p no:cacheprovider tests/test_gpu_cuda.py tests/test_gpu.py \
	tests/test_torch_backend.py 2>&1 | tee -a "$log"
tests=${PIPESTATUS[0]}
timeout 80 "$py" -m offload_lib.cli run -n 2 -- "$py" scripts/bench_gpu.py --sizes 64K,1M,16M \
	2>&1 | grep -v '^\[1\]' | sed 's/^\[0\] //' | tee -a "$log"
bench=${PIPESTATUS[0]}
set -e
echo "gpu_check: tests exit $tests, benchmark exit $bench; log in $log"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
