#!/bin/sh
# issue #25, sitting 70 (session q).  p69 = main with session q's test_cuda (the gate inside wsd_kernel of runs
# 68-69 taken out again: run69/gate-fin.diff); its library is p68's (6a1fae9).  test_cuda (every fixture), then the
# decode rows of b60 (a9758fb) and p68 in turn, twice (one more card for the one-token row).
# Built on the development VM as run67.sh says (p69: test_cuda only); carry [".gpubin/p69", ".gpubin/p68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r70}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 280 .gpubin/p69/test_cuda > $R/test_cuda_p69.txt 2>&1; rc=$?; echo "test_cuda p69 rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: |case [0-9]" $R/test_cuda_p69.txt | head -12; grep -E "one-token|replays of 1 |of 1 tokens" $R/test_cuda_p69.txt | grep "W=5120" | cut -c1-250; tail -1 $R/test_cuda_p69.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p68; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
    grep -E "floor for|against the|back to back\)|CUDA graph\)" $f | cut -c1-160
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
