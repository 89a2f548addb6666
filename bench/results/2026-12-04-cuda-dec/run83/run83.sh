#!/bin/sh
# issue #25, sitting 83 (session t), on run 82's machine (warm): the decode rows of h0 and e1 in turn, three times
# more (run 82's host-side medians of the direct call were 7.7 / 7.7 us (h0) against 8.2 / 10.9 (e1)).
# carry [".gpubin/h0", ".gpubin/e1"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r83}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 3 4 5; do
  for b in h0 e1; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s %s | ", $1, $2, $3, $11} END {print ""}' | cut -c1-200
    grep -E "a plan\)|host's side" $f | cut -c1-220
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
