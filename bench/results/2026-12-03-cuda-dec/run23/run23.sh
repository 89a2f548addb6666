#!/bin/sh
# issue #25, sitting 23: bench_cuda with cuBLAS's F16 GEMM alone beside every decode row (same B, same
# shapes, the layer's weights), twice, whole (prefill and staging too)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r23; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do
  f=$R/bench_cuda_$round.txt; timeout 200 .gpubin/b/bench_cuda > $f 2>&1; echo "round $round rc=$? $(( $(date +%s) - t0 ))s"
done
tar czf $OUT/r23.tgz -C /tmp r23
cat $R/bench_cuda_1.txt; grep -E -A15 '^   B ' $R/bench_cuda_2.txt
