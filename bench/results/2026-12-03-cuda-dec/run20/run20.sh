#!/bin/sh
# issue #25, sitting 20: does the weights' layout decide mmv's distance to the read kernel?  b: HEAD
# (row-major W, each warp reads 32 rows x 256 B a round, rows 12 KB apart); t: the same kernels with the
# addresses of a [N/32][K/64][32][64] layout (each warp's part of K one contiguous 196 KB; values wrong,
# bytes read the same)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r20; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in b t; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"
done; done
for v in b t; do
BENCH_CUDA_DECODE_ONCE=1 timeout 100 ncu --clock-control none -k regex:'mmv' --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis .gpubin/$v/bench_cuda > $R/ncu1_$v.txt 2>&1
echo "ncu1 $v rc=$? $(grep -E 'Duration|DRAM Throughput|Memory Throughput' $R/ncu1_$v.txt | awk '{printf "%s ", $0}')"
done
echo "end $(( $(date +%s) - t0 ))s"
tar czf $OUT/r20.tgz -C /tmp r20
