#!/bin/sh
# cuda_device_run.sh [BIN [OUT]] - engram.cuda's tests on a GPU machine, in
# one call: finds the Python that holds PyTorch with CUDA (a 3.12 venv on
# this workplace's machines), libcublas.so.13, builds the test models with
# BIN/engram, imports the abi3 modules built elsewhere (BIN/python: engram
# with _engram and _engram_cuda, built against 3.11's headers, limited API
# 3.8) and runs tests/python/test_cuda.py (pytest if that Python has it,
# else as a script).  BIN defaults to .gpubin, OUT to $OUT; logs go there.
set -u
BIN=${1:-.gpubin}
OUT=${2:-${OUT:-/tmp/engram_cuda_out}}
mkdir -p "$OUT"
PY=
for p in /opt/torch/.venv/bin/python3 $(command -v python3) \
         $(find / -name 'python3.12' -path '*bin*' 2>/dev/null | head -5); do
    if [ -x "$p" ] && "$p" -c 'import torch, sys; assert torch.cuda.is_available()' 2>/dev/null; then
        PY=$p
        break
    fi
done
if [ -z "$PY" ]; then
    echo "no Python with torch and CUDA found"; exit 1
fi
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$BIN/python" PYTHONUNBUFFERED=1
{
    date -u; uname -r; nvidia-smi -L; nproc
    echo "python: $PY"; echo "cublas from: $lib"
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
    "$PY" -m pytest --version 2>&1
    "$PY" -c 'import engram, engram.cuda; print("engram", engram.version(), "from", engram.__file__); print("engram.cuda available:", engram.cuda.available(), "why:", engram.cuda.why())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
M=/tmp/engram_models
mkdir -p $M
"$BIN/engram" build $M/m64.gguf --base 20000 --width 64 --fill normal --seed 5 > "$OUT/build.txt" 2>&1 &&
"$BIN/engram" build $M/m5120.gguf --base 5000 --width 5120 --fill normal --seed 5 >> "$OUT/build.txt" 2>&1 &&
"$BIN/engram" build $M/ple.gguf --arch qwen4exp --base 20011 --width 64 --fill normal --seed 3 >> "$OUT/build.txt" 2>&1
echo "models rc=$?"; cat "$OUT/build.txt"
export ENGRAM_TEST_M64=$M/m64.gguf ENGRAM_TEST_M5120=$M/m5120.gguf ENGRAM_TEST_PLE=$M/ple.gguf
if "$PY" -c 'import pytest' 2>/dev/null; then
    "$PY" -m pytest -v -s -p no:cacheprovider tests/python/test_cuda.py > "$OUT/test_cuda.txt" 2>&1
else
    "$PY" tests/python/test_cuda.py > "$OUT/test_cuda.txt" 2>&1
fi
rc=$?
echo "test_cuda rc=$rc"
grep -E "W=|PASS|FAIL|SKIP|passed|failed|Error|assert" "$OUT/test_cuda.txt" | head -80
exit $rc
