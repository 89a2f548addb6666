#!/bin/sh
# issue #25, sitting 80 (session s).  p80 = p78 after helper-75's review: the plan made with the thread's capture mode
# relaxed, every failure clearing the runtime's last error, close without the layer; test_cuda's plan checks
# stronger (wrapped failures set a real last error; streams and graphs counted; a global capture of the same thread
# beside the open; the run held on a non-blocking stream; the legacy stream).  test_cuda W = 64 (quick) on p80;
# the decode rows of m75 and p80, once each.
# carry [".gpubin/m75", ".gpubin/p80"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r80}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/p80/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda p80 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; grep -E "W=64 plan" $R/test_cuda_quick.txt | cut -c1-40,150-; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for b in m75 p80; do
  f=$R/bench_${b}_1.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
  echo "bench $b rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s | ", $1, $2, $3, $11} END {print ""}' | cut -c1-200
  grep -E "a plan\)|CUDA graph\)|32 direct|host's side" $f | cut -c1-220
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
