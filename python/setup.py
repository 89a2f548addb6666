"""Builds engram._engram (and engram._engram_cuda where the CUDA part is
built) for `pip install ./python`.

The C library is built by the repository's Makefile (`make lib`, into a
build directory of its own under build/pip/), with the project's flags (no
fast-math, run-time SIMD dispatch), and linked in statically: at run time
the module needs liburing only.  The module uses CPython's limited API of
3.8 (abi3): one wheel serves every Python >= 3.8.
"""
import os
import re
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.join(ROOT, "build", "pip")


def version():
    with open(os.path.join(ROOT, "include", "engram.h")) as f:
        return re.search(r'#define ENGRAM_VERSION "([^"]+)"', f.read()).group(1)


class BuildWithLibrary(build_ext):
    """Runs `make lib` first, so that libengram.a exists to link."""

    def run(self):
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["make", "-C", ROOT, "-j" + jobs, "BUILD=" + BUILD, "CUDA=0",
                               os.path.join(BUILD, "libengram.a")])
        super().run()


SRC = sorted(os.path.join("src", f) for f in os.listdir(os.path.join(HERE, "src"))
             if f.endswith(".c") and f != "cuda.c")

setup(
    version=version(),
    ext_modules=[Extension(
        "engram._engram",
        sources=SRC,
        include_dirs=[os.path.join(ROOT, "include"), os.path.join(HERE, "src")],
        define_macros=[("Py_LIMITED_API", "0x03080000"), ("_GNU_SOURCE", None)],
        extra_compile_args=["-std=c11", "-fno-fast-math", "-ffp-contract=off", "-fvisibility=hidden"],
        extra_objects=[os.path.join(BUILD, "libengram.a")],
        libraries=["uring", "pthread", "m"],
        # libengram's symbols stay inside the module (another libengram in
        # the process, an engine's, is not interposed)
        extra_link_args=["-Wl,--exclude-libs,ALL"],
        py_limited_api=True,
    )],
    cmdclass={"build_ext": BuildWithLibrary},
    # setuptools' own build tree beside the library's, not in python/
    options={"bdist_wheel": {"py_limited_api": "cp38"},
             "build": {"build_base": os.path.join(BUILD, "setuptools")}},
)
