#!/bin/sh
# issue #25, sitting 46 (2026-12-05, session j): wsd_kernel's producer also prefetches the next WSD_L2PF
# k-tiles of its weights into L2 before it waits for decode16_kernel (p46: 8, p4_46: 4) against d44 (main at
# 01c34d3, 0); decode rows, three rounds alternating; p46's test_cuda (ENGRAM_TEST_CUDA_QUICK=1: W = 64).
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r46; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"
        grep -E "^   1 \(" $3 | sed 's/^/    /' | cut -c1-140; }
for round in 1 2 3; do for v in d44 p46 p4_46; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r46.tgz -C /tmp r46
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/p46/test_cuda > $R/test_cuda_quick_p46.txt 2>&1; echo "test_cuda quick (p46) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_quick_p46.txt
tar czf $OUT/r46.tgz -C /tmp r46
