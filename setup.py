"""Build: the C core (firmware + emulator + host) as a static library with strict warnings,
linked into the cffi extension offload_lib._native; and the same core as the public shared
library libdpaoffload.so (the C API of host/include/dpa_offload.h, nothing else exported)
with its header and pkg-config file, for C programs and the MPI library. Sources and flags:
build_defs.py."""
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_defs import INCLUDES, SIM_INCLUDES, STRICT, library, lto, sources  # noqa: E402

SONAME = "libdpaoffload.so.1"
CORE_SOURCES = sources("core")

PC_TEMPLATE = """prefix=${pcfiledir}/..
libdir=${prefix}
includedir=${prefix}/include

Name: dpa-offload
Description: offload collectives to a DPU's Data Path Accelerator (C API, dpa_offload.h)
Version: 1.0.0
Libs: -L${libdir} -Wl,-rpath,${libdir} -ldpaoffload
Cflags: -I${includedir}
"""


def compile_on_every_core(compiler, sources: list[str], **kwargs) -> list[str]:
    """compiler.compile() with one share of the sources per core (the same compiler object
    from several threads, as build_ext --parallel does): the core is compiled three times
    (the static library, the shared one, the simulator) and CI has 2 cores."""
    jobs = max(1, min(os.cpu_count() or 1, len(sources)))
    shares = [sources[i::jobs] for i in range(jobs)]
    with ThreadPoolExecutor(jobs) as pool:
        done = list(pool.map(lambda share: compiler.compile(share, **kwargs), shares))
    by_source = {src: obj for share, objs in zip(shares, done) for src, obj in zip(share, objs)}
    return [by_source[src] for src in sources]


class BuildCLibraryOnEveryCore(build_clib):
    """build_clib, its compile step spread over the cores."""

    def build_libraries(self, libraries) -> None:
        for name, info in libraries:
            objects = compile_on_every_core(
                self.compiler, list(info["sources"]), output_dir=self.build_temp,
                include_dirs=info.get("include_dirs"), extra_postargs=info.get("cflags"),
                debug=self.debug)
            self.compiler.create_static_lib(objects, name, output_dir=self.build_clib,
                                            debug=self.debug)


class BuildWithCLibrary(build_ext):
    """build_ext, then libdpaoffload.so + include/dpa_offload.h + pkgconfig/dpa-offload.pc
    next to the extension (the package directory, so that an installed or editable
    package carries them)."""

    def run(self) -> None:
        super().run()
        pkg = os.path.join("offload_lib") if self.inplace else os.path.join(self.build_lib, "offload_lib")
        os.makedirs(pkg, exist_ok=True)
        objects = compile_on_every_core(
            self.compiler, CORE_SOURCES, output_dir=os.path.join(self.build_temp, "shared"),
            include_dirs=INCLUDES, extra_postargs=[*STRICT, "-fPIC", *lto()[0]])
        target = os.path.join(pkg, "libdpaoffload.so")
        self.compiler.link_shared_object(
            objects, target, libraries=["pthread", "rt", "dl", "m"],
            extra_postargs=[f"-Wl,-soname,{SONAME}", "-Wl,--no-undefined", *lto()[1]])
        # the soname's link, for programs linked against it (a copy: wheels carry no links)
        shutil.copyfile(target, os.path.join(pkg, SONAME))
        os.makedirs(os.path.join(pkg, "include"), exist_ok=True)
        shutil.copyfile("host/include/dpa_offload.h", os.path.join(pkg, "include", "dpa_offload.h"))
        os.makedirs(os.path.join(pkg, "pkgconfig"), exist_ok=True)
        with open(os.path.join(pkg, "pkgconfig", "dpa-offload.pc"), "w") as f:
            f.write(PC_TEMPLATE)
        # the simulator (dpa-offload sim): its own executable, so that its copy of the
        # firmware and its dpa_hal_* never meet the emulator's in one process
        sim_objects = compile_on_every_core(
            self.compiler, sources("sim"), output_dir=os.path.join(self.build_temp, "sim"),
            include_dirs=INCLUDES + SIM_INCLUDES, extra_postargs=STRICT)
        self.compiler.link_executable(sim_objects, "dpa-sim", output_dir=pkg)
        # the MPI library's sources: built on demand against the MPI found at run time
        mpi_dir = os.path.join(pkg, "mpi_src")
        os.makedirs(mpi_dir, exist_ok=True)
        for src in sources("mpi"):
            shutil.copyfile(src, os.path.join(mpi_dir, os.path.basename(src)))


# offload_lib._fast: a small op's request in C; it calls the library through _native's
# function pointers, so it links none of the core.
FAST = Extension("offload_lib._fast", sources("pyext"), include_dirs=INCLUDES,
                 extra_compile_args=STRICT, py_limited_api=False)

setup(libraries=[library()], cffi_modules=["offload_lib/_build.py:ffibuilder"], ext_modules=[FAST],
      cmdclass={"build_clib": BuildCLibraryOnEveryCore, "build_ext": BuildWithCLibrary})
