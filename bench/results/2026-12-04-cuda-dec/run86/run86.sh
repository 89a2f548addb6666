#!/bin/sh
# issue #25, sitting 86 (session u).  u2 = run 85's u1 (engram_cuda_apply's graphs of decode calls) with bench_cuda
# also timing the host's side of a first and a second sighting (the graph made and uploaded), and test_cuda's
# graphs() line naming its cases as they are, and cuda/host_err.cuh's quiet() (a cleanup's or a query's own error
# cleared, one helper instead of the same two lines at each place; the layers' close clearing its own errors);
# h1 = main at 3aedd3e (bench only).  The decode rows of h1 and u2 in turn, twice (on whatever card comes: run 85
# was an H200, this is for an H100); test_cuda W = 64 and test_ple_cuda on u2.
# carry [".gpubin/h1", ".gpubin/u2"]
set -u
t0=$(date +%s)
RUN=${RUN:-r86}
R=/tmp/$RUN; mkdir -p $R
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2; do
  for b in h1 u2; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s %s | ", $1, $2, $3, $11, $13} END {print ""}' | cut -c1-220
    grep -E "a plan\)|32 direct|host's side|NO_GRAPH\)|changing|new arguments" $f | cut -c1-260
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
ENGRAM_TEST_CUDA_QUICK=1 timeout 100 .gpubin/u2/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda u2 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|:[0-9]+: " $R/test_cuda_quick.txt | head -8; grep -E "graphs \(" $R/test_cuda_quick.txt | cut -c1-300; tail -1 $R/test_cuda_quick.txt
timeout 100 .gpubin/u2/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda u2 rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_ple_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
