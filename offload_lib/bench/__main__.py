"""``python -m offload_lib.bench``: the benchmark's ranks (``--worker``) and its parent."""
import sys

from offload_lib.bench.runner import main

sys.exit(main(sys.argv[1:]))
