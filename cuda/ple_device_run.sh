#!/bin/sh
# ple_device_run.sh BIN OUT - the PLE GPU path's checks on a GPU machine:
# BIN/test_ple_cuda (against the CPU path) and BIN/bench_ple_cuda (decode
# against the weights' read time, prefill against cuBLAS), built elsewhere
# (cuda/README.md, "PLE"); cuBLAS from the machine.  Logs go to OUT; exits
# with test_ple_cuda's status.
set -u
BIN=$1
OUT=$2
mkdir -p "$OUT"
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{
    date -u; uname -r; nvidia-smi -L; nproc
    echo "cublas from: $lib"
} > "$OUT/ple_machine.txt" 2>&1
cat "$OUT/ple_machine.txt"
echo "== test_ple_cuda"
"$BIN/test_ple_cuda" > "$OUT/test_ple_cuda.txt" 2>&1
rc=$?
echo "test_ple_cuda rc=$rc"
cat "$OUT/test_ple_cuda.txt"
echo "== bench_ple_cuda"
"$BIN/bench_ple_cuda" > "$OUT/bench_ple_cuda.txt" 2>&1
echo "bench_ple_cuda rc=$?"
cat "$OUT/bench_ple_cuda.txt"
exit $rc
