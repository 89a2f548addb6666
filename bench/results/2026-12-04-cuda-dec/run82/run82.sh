#!/bin/sh
# issue #25, sitting 82 (session t).  e1 = main at 0f8b562 plus: every launch of apply / project checked by its own
# launch call's result (cuda/host_err.cuh's launch(), no cudaGetLastError), cuda_err clearing the library's own
# error; test_cuda's errors() (a caller's pending error kept, each launch refused in turn) and a launch refused
# inside a plan's capture; test_ple_cuda's pending-error lines.  h0 = main at 0f8b562 (bench only).
# test_cuda W = 64 (quick) on e1 (first GPU run of 421db33's and 0f8b562's test changes too); test_ple_cuda;
# the decode rows of h0 and e1 in turn, twice; the paired prefill of e1; test_apply.sh (cuda); test_cuda every fixture.
# carry [".gpubin/h0", ".gpubin/e1"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r82}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 90 .gpubin/e1/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda e1 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; grep -E "errors|W=64 plan" $R/test_cuda_quick.txt | cut -c1-260; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 120 .gpubin/e1/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda e1 rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|pending|:[0-9]+: " $R/test_ple_cuda.txt | head -24; tail -2 $R/test_ple_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in h0 e1; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s | ", $1, $2, $3, $11} END {print ""}' | cut -c1-200
    grep -E "a plan\)|CUDA graph\)|32 direct|host's side" $f | cut -c1-220
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
f=$R/paired_e1.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/e1/bench_cuda > $f 2>&1
echo "paired e1 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-150
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/e1/engram .gpubin/e1/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 60 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 260 .gpubin/e1/test_cuda > $R/test_cuda_e1.txt 2>&1; echo "test_cuda e1 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_e1.txt | head -8; tail -1 $R/test_cuda_e1.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
