#!/bin/sh
# issue #25, sitting 50 (2026-12-05, session l): where the prefill apply's time above its kernels' goes.
# l50 = run 49's l49 + bench_cuda's BENCH_CUDA_DIST rows: the F32 apply from a CUDA graph and 8 back to back.
# Three runs of the prefill rows.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r50; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
t0=$(date +%s)
for round in 1 2 3; do
  f=$R/pre_l50_$round.txt; BENCH_CUDA_DIST=1 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/l50/bench_cuda > $f 2>&1
  echo "l50.$round rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^    \[|engram|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | cut -c1-130
done
tar czf $OUT/r50.tgz -C /tmp r50
