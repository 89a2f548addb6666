#!/bin/sh
# issue #25, sitting 78 (session s).  p78 = main at 26364f1 (session r's kernels) plus plans: engram_cuda_plan_open
# captures one decode call into a graph the library instantiates, engram_cuda_plan_run launches it (one submission).
# m75 = main before session r (a5e6a7a).  test_cuda W = 64 (quick) on p78; the decode rows of m75 and p78 in turn,
# twice (p78's rows have the plan column and the plan's B = 1 rows); the prefill apply and cuBLAS in turn
# (BENCH_CUDA_PAIRED=4) of m75 and p78; test_cuda every fixture and tests/test_apply.sh (cuda) on p78.
# carry [".gpubin/m75", ".gpubin/p78"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r78}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/p78/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda p78 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; grep -E "plan" $R/test_cuda_quick.txt | cut -c1-160; tail -1 $R/test_cuda_quick.txt
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
timeout 240 .gpubin/p78/test_cuda > $R/test_cuda_p78.txt 2>&1; echo "test_cuda p78 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_p78.txt | head -8; tail -1 $R/test_cuda_p78.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p78/engram .gpubin/p78/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 60 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
