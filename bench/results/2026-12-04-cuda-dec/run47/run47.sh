#!/bin/sh
# issue #25, sitting 47 (2026-12-05, session l).  Variants, built on the development VM from main 3314848 plus
# bench_cuda's new knobs (BENCH_CUDA_PREFILL_ONLY, BENCH_CUDA_PREFILL_ONCE=bf16, 30 reps on the prefill rows):
#   g47 = main's kernels; dc = -DDEC16_CVT=1 (decode16_kernel through cvt.rn.f16x2.e4m3x2);
#   gA = -DGATEB_THREADS=640 -DGATEB_KC=1 -DGATEB_MINB=1; gB = the same with GATEB_MINB=2 (the prefill gate's shape);
#   p46 / p4_46 = run 46's WSD_L2PF = 8 / 4 on 01c34d3 (decode rows only).
# (1) ncu of one prefill apply's kernels (g47, F32 and BF16 residual): where its time goes and why;
# (2) per-kernel durations of every variant under ncu; (3) prefill rows alternating, three rounds;
# (4) decode rows alternating, two rounds; (5) dc's test_cuda whole, gA's and gB's quick.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r47; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
cat $R/machine.txt
t0=$(date +%s)
K='decode16|ws_gemm|gemv_list|gate_block'
# model file first (bench_cuda writes it on its first run)
BENCH_CUDA_PREFILL_ONCE=1 timeout 60 .gpubin/g47/bench_cuda > $R/first.txt 2>&1; echo "first rc=$? $(( $(date +%s) - t0 ))s"
for r in 1 bf16; do
  BENCH_CUDA_PREFILL_ONCE=$r timeout 100 ncu --clock-control none -k regex:'decode16|gemv_list|gate_block' --launch-skip 3 --launch-count 3 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
    .gpubin/g47/bench_cuda > $R/ncu_full_$r.txt 2>&1
  echo "ncu full $r rc=$? $(( $(date +%s) - t0 ))s"
  grep -E '^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall' $R/ncu_full_$r.txt | head -40 | cut -c1-150
done
tar czf $OUT/r47.tgz -C /tmp r47
for v in g47 dc gA gB; do for r in 1 bf16; do
  BENCH_CUDA_PREFILL_ONCE=$r timeout 60 ncu --clock-control none -k regex:"$K" --launch-skip 4 --launch-count 8 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum \
    .gpubin/$v/bench_cuda > $R/ncu_dur_${v}_$r.txt 2>&1
  echo "ncu dur $v $r rc=$? $(( $(date +%s) - t0 ))s: $(grep -E '^  [a-zA-Z_]|gpu__time_duration' $R/ncu_dur_${v}_$r.txt | awk '/gpu__time_duration/{printf "%s ", $NF; next}{n=$1; sub(/[<(].*/, "", n); printf "%s=", n}' | cut -c1-300)"
done; done
tar czf $OUT/r47.tgz -C /tmp r47
for round in 1 2 3; do for v in g47 dc gA gB; do
  f=$R/pre_${v}_$round.txt; BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | sed -E 's/ = [0-9]+ (TFLOP|tokens)\/s//; s/  +/ /g' | paste -sd'|' | cut -c1-260) $(( $(date +%s) - t0 ))s"
done; done
tar czf $OUT/r47.tgz -C /tmp r47
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"
        grep -E "^   1 \(" $3 | sed 's/^/    /' | cut -c1-140; }
for round in 1 2; do for v in g47 dc p46 p4_46; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r47.tgz -C /tmp r47
timeout 150 .gpubin/dc/test_cuda > $R/test_cuda_dc.txt 2>&1; echo "test_cuda (dc) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_dc.txt
for v in gA gB; do
  ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/$v/test_cuda > $R/test_cuda_quick_$v.txt 2>&1; echo "test_cuda quick ($v) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_quick_$v.txt
done
tar czf $OUT/r47.tgz -C /tmp r47
