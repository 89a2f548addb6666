#!/bin/sh
# issue #25, sitting 73 (session q): run 71's comparison on another card.  p71 = the landed library (6602e93),
# p68 = 6a1fae9, b60 = a9758fb; the decode rows in turn, three times.  The binaries of runs 71-72;
# carry [".gpubin/p71", ".gpubin/p68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r73}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2 3; do
  for b in b60 p68 p71; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 >= 32 {printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
