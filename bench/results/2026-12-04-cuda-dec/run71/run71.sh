#!/bin/sh
# issue #25, sitting 71 (session q).  p71 = main + the gate's own chunk sums (33-64 tokens) with their x q loaded
# before the gate's wait for the projection (kv after it, every load of a warp's chunks at once); p68 = main
# (6a1fae9); b60 = a9758fb.  test_cuda's W = 5120 fixture on p71 (where the chunk sums run), tests/test_apply.sh
# (cuda), then the decode rows of b60, p68, p71 in turn, three times.
# Built on the development VM as run67.sh says; carry [".gpubin/p71", ".gpubin/p68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r71}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_WIDTH=5120 timeout 150 .gpubin/p71/test_cuda > $R/test_cuda_p71.txt 2>&1; rc=$?; echo "test_cuda p71 (W = 5120) rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_p71.txt | head -8; grep -E "decode apply \(wsd\)" $R/test_cuda_p71.txt | cut -c1-220; tail -1 $R/test_cuda_p71.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p71/engram .gpubin/p71/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 100 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
for i in 1 2 3; do
  for b in b60 p68 p71; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 >= 32 {printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
