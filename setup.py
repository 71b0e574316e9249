"""Build: the C core (firmware + emulator + host) as a static library with strict warnings,
linked into the cffi extension offload_lib._native."""
from glob import glob

from setuptools import setup

STRICT = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC"]
INCLUDES = ["dpa_firmware/include", "host/include"]

core = (
    "dpaoffload_core",
    {
        "sources": sorted(glob("dpa_firmware/src/*.c") + glob("emulator/*.c") + glob("host/src/*.c")),
        "include_dirs": INCLUDES,
        "cflags": STRICT,
    },
)

setup(libraries=[core], cffi_modules=["offload_lib/_build.py:ffibuilder"])
