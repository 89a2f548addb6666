#!/bin/sh
# issue #25, sitting 51 (2026-12-05, session l): decode16 gave a nonzero block of scale < 3 its exact value where
# SPEC section 7 rounds to BF16 (helper-60's finding; reachable when the token's largest scale is 7..23).
# tq = main 8ef0736's kernels + test_cuda's new case (mixed3: scales < 3 beside one of 7), quick (W = 64): it must
# fail; l51 = the fix (such tokens take the GEMV's sums) + the case: test_cuda whole; then l51's prefill rows with
# run 50's spread rows (the F32 apply from a graph and 8 back to back), if time is left.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r51; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
t0=$(date +%s)
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/tq/test_cuda > $R/test_cuda_quick_tq.txt 2>&1; echo "test_cuda quick (tq, before the fix) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "scales < 3 beside" $R/test_cuda_quick_tq.txt | cut -c1-200; grep -E "failed:" $R/test_cuda_quick_tq.txt | head -4 | cut -c1-200; tail -1 $R/test_cuda_quick_tq.txt
tar czf $OUT/r51.tgz -C /tmp r51
timeout 220 .gpubin/l51/test_cuda > $R/test_cuda_l51.txt 2>&1; echo "test_cuda (l51) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "scales < 3 beside" $R/test_cuda_l51.txt | cut -c1-200; tail -1 $R/test_cuda_l51.txt
tar czf $OUT/r51.tgz -C /tmp r51
f=$R/pre_l51.txt; BENCH_CUDA_DIST=1 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/l51/bench_cuda > $f 2>&1
echo "pre l51 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^    \[|engram|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | cut -c1-130
tar czf $OUT/r51.tgz -C /tmp r51
