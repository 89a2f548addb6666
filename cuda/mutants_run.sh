#!/bin/sh
# mutants_run.sh DIR - runs each mutant test_cuda kept by
# `MUT_COLLECT=DIR tools/mutate-checks.py cuda/engram_cuda.cu ...` (those the
# no-GPU run here did not catch) on a GPU machine, W = 64 only
# (ENGRAM_TEST_CUDA_QUICK), each under a time limit (MUT_LIMIT seconds,
# default 120); prints one line per mutant and a count.  A mutant is caught
# when test_cuda fails or hangs.
set -u
DIR=$1
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
caught=0
survived=0
for m in "$DIR"/test_cuda.L*; do
    ENGRAM_TEST_CUDA_QUICK=1 timeout ${MUT_LIMIT:-120} "$m" > /tmp/mutant.out 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then
        caught=$((caught + 1))
        echo "caught   $(basename "$m") (rc $rc): $(grep -m1 'FAIL\|failed' /tmp/mutant.out | cut -c1-150)"
    else
        survived=$((survived + 1))
        echo "survived $(basename "$m"): $(tail -1 /tmp/mutant.out)"
    fi
done
echo "mutants on the GPU: $caught caught, $survived survived"
