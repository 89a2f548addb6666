#!/bin/sh
# issue #25, sitting 79 (session s).  p78 as in run 78 with test_cuda's plan check mended (the mmv layer's reference
# call now starts from the same residual as its plan's run).  test_cuda W = 64 (quick) on p78; the decode rows of m75
# and p78 in turn, twice; the prefill apply and cuBLAS in turn (BENCH_CUDA_PAIRED=4) of m75 and p78.
# carry [".gpubin/m75", ".gpubin/p78"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r79}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/p78/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda p78 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; grep -E "W=64 plan" $R/test_cuda_quick.txt | cut -c1-60,190-; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in m75 p78; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s | ", $1, $2, $3, $11} END {print ""}' | cut -c1-200
    grep -E "a plan\)|CUDA graph\)|32 direct|host's side" $f | cut -c1-220
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
for b in m75 p78; do
  f=$R/paired_${b}.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
  echo "paired $b rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-150
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
