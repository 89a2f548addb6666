#!/bin/sh
# issue #25, sitting 18: mmw with stages sized by NT (10 stages at 1 n-tile ... 6 at 8), 4 blocks a wait up to NT 4.
# m: default (mmw from NT 2); b0: run 17's build with -DMMW_MIN_NT=99 (mmv_staged); m1: mmw for every n; cl1: no clusters.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r18; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
S=$R/summary.txt
echo "== decode rows, apply/floor and projection/floor per B" >> $S
for round in 1 2; do for v in b0 m m1 cl1; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')" >> $S
done; done
echo "== ncu: mmw at 1 token (m1) and 64 (m); mmv_staged at 64 (b0) $(( $(date +%s) - t0 ))s" >> $S
for x in "m1 1" "m 64" "b0 64"; do set -- $x
BENCH_CUDA_DECODE_ONCE=$2 timeout 100 ncu --clock-control none -k regex:'mmw_kernel|mmv_staged|mmv_kernel' --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis .gpubin/$1/bench_cuda > $R/ncu_$1_$2.txt 2>&1
echo "$1 B=$2 rc=$?" >> $S; grep -E 'Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued' $R/ncu_$1_$2.txt | head -12 >> $S
done
echo "end $(( $(date +%s) - t0 ))s" >> $S
tar czf $OUT/r18.tgz -C /tmp r18
cat $S
