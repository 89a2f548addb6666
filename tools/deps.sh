#!/bin/sh
# deps.sh [--build] - makes sure what building (and, without --build,
# testing) engram needs is here.  As root it installs missing Debian packages
# itself; otherwise it prints the exact apt-get line and fails.  For tests it
# then installs the pinned npm reference clients (tools/node/package-lock.json).
set -u
cd "$(dirname "$0")/.." || exit 1

need=""
want() { # want COMMAND PACKAGE...
    command -v "$1" >/dev/null 2>&1 || need="$need $2"
}
build_only=0
[ "${1:-}" = "--build" ] && build_only=1
want cc gcc
want make make
[ -f /usr/include/stdio.h ] || need="$need libc6-dev"
[ -f /usr/include/liburing.h ] || need="$need liburing-dev"
[ -f /usr/include/utf8proc.h ] || need="$need libutf8proc-dev"
[ -f /usr/include/jansson.h ] || need="$need libjansson-dev"
if [ "$build_only" -eq 0 ]; then
want node nodejs
want npm npm
want clang clang
[ -x /usr/bin/python3 ] || need="$need python3"
/usr/bin/python3 -c "import numpy" 2>/dev/null || need="$need python3-numpy"  # quantizer reference (tests/quant_ref.py)
# the Python binding (make python, tests/python): Debian's Python 3 headers,
# pytest, PyTorch (CPU) for the DLPack and example tests, setuptools and pip
# for `pip install ./python`
[ -f /usr/include/python3.11/Python.h ] || ls /usr/include/python3*/Python.h >/dev/null 2>&1 || need="$need python3-dev"
/usr/bin/python3 -c "import pytest" 2>/dev/null || need="$need python3-pytest"
/usr/bin/python3 -c "import torch" 2>/dev/null || need="$need python3-torch"
/usr/bin/python3 -c "import setuptools" 2>/dev/null || need="$need python3-setuptools"
/usr/bin/python3 -m pip --version >/dev/null 2>&1 || need="$need python3-pip"
# libFuzzer and the sanitizer runtimes for clang (make fuzz)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need="$need libclang-rt-14-dev"
want fio fio   # the device's limit in engram bench io
# OpenBLAS: the comparator of the projection (tests/test_blas.c, bench_apply; loaded at run time)
dpkg -s libopenblas-dev >/dev/null 2>&1 || need="$need libopenblas-dev"
want pgrep procps # run.sh's interrupt, test_run_mpi_faults.sh
# Open MPI: libengram-mpi (built when mpicc is found) and its test under mpirun
want mpicc libopenmpi-dev
want mpirun openmpi-bin
fi

if [ -n "$need" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "deps: installing$need" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq $need >/dev/null || {
            echo "deps: apt-get install$need failed" >&2; exit 1; }
    else
        echo "deps: missing packages; run:  sudo apt-get install -y$need" >&2
        exit 1
    fi
fi

if [ "$build_only" -eq 0 ] && [ ! -f tools/node/node_modules/@huggingface/gguf/package.json ]; then
    echo "deps: installing the npm reference clients (tools/node)" >&2
    (cd tools/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || {
        echo "deps: npm ci in tools/node failed" >&2; exit 1; }
fi
exit 0
