#!/bin/sh
# issue #25 / session w's note, sitting 91 (session aa): the layer's open cleared a caller's pending CUDA error
# (ws_gemm.cuh's set-up called cudaGetLastError() after calls that had succeeded).  f1 = main at babe5c7 plus the
# fix (ws_quiet: an error cleared only by the call that set it) and test_cuda's check of an open and a close under
# a pending error; test_cuda_oldlib = the same test program linked with main's library before the fix (it must
# fail that check and only that one).
# carry [".gpubin/f1"]
set -u
t0=$(date +%s)
RUN=${RUN:-r91}
R=/tmp/$RUN; mkdir -p $R
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
for b in test_cuda test_cuda_oldlib; do
  ENGRAM_TEST_CUDA_QUICK=1 timeout 100 .gpubin/f1/$b > $R/${b}_quick.txt 2>&1; echo "$b quick rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "pending error: opened|FAIL|:[0-9]+: " $R/${b}_quick.txt | head -6; tail -1 $R/${b}_quick.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 120 .gpubin/f1/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_ple_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
