#!/bin/sh
# issue #25, sitting 24: which kernels cuBLAS runs for the decode shapes (25600 x 6144 weights, B tokens),
# their grids, times and DRAM throughput (it reads the weights at 1.15-1.23x the floor for every B <= 64)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r24; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for b in 1 8 16 32 64; do
  BENCH_CUDA_GEMM_ONCE=$b timeout 120 ncu --clock-control none -k regex:'gemm|gemv|nvjet|xmma|cutlass|splitK|Kernel|reduce|sm90' --launch-skip 3 --launch-count 4 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    .gpubin/b/bench_cuda > $R/ncu_gemm_$b.txt 2>&1
  echo "== B=$b rc=$? $(( $(date +%s) - t0 ))s"
  grep -E '^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Grid Size|Block Size|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Waves Per SM|Cluster Size|Achieved Occupancy' $R/ncu_gemm_$b.txt | sed 's/  */ /g' | cut -c1-200
done
echo "end $(( $(date +%s) - t0 ))s"
tar czf $OUT/r24.tgz -C /tmp r24
