#!/usr/bin/env bash
# All-to-all benchmark table; adds --compare mpi when mpi4py is installed.
# Extra arguments go to `dpa-offload bench alltoall`, e.g.
#   scripts/bench_alltoall.sh -n 8 --sizes 64K,1M --json results.json
# PYTHON selects the interpreter (default: the repo's .venv, else python3).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
[[ -x "$py" ]] || py="$(command -v python3)"
compare=()
if "$py" -c 'import mpi4py' 2>/dev/null; then
    compare=(--compare mpi)
else
    echo "bench_alltoall.sh: mpi4py not found, running without --compare mpi" \
         "(pip install dpa-offload[mpi])" >&2
fi
exec "$py" -m offload_lib.cli bench alltoall "${compare[@]}" "$@"
