"""Build: the C core (firmware + emulator + host) as a static library with strict warnings,
linked into the cffi extension offload_lib._native. Sources and flags: build_defs.py."""
import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_defs import library  # noqa: E402

setup(libraries=[library()], cffi_modules=["offload_lib/_build.py:ffibuilder"])
