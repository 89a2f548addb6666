#!/bin/sh
# issue #25, sitting 76 (session r).  Run 75 found the k-tiles by plain bulk copies (k75) near main at one token and
# 1-2 us faster at 40-64, with evict_first on those copies (e75) 1.1-1.6 us faster at one token and 4-5 us at 32-64,
# but the prefill's GEMM ~2% slower on the k-tiles.  h76 = main (a5e6a7a) + evict_first on wsd_kernel's weights
# through its tensor map (branch wip-hint: no layout change, the prefill untouched).  The decode rows of m75, h76,
# e75 in turn four times; the stamps (BENCH_CUDA_STAMPS_DEC=20) of sm75, sh76 (h76 with -DENGRAM_CUDA_STAMPS) and
# se76 (e75 with it); test_cuda every fixture and tests/test_apply.sh (cuda) on h76.
# carry [".gpubin/m75", ".gpubin/h76", ".gpubin/e75", ".gpubin/sm75", ".gpubin/sh76", ".gpubin/se76"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r76}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2 3 4; do
  for b in m75 h76 e75; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 32 {printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
for b in sm75 sh76 se76; do
  BENCH_CUDA_STAMPS_DEC=20 BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $R/stamps_$b.txt 2>&1; echo "stamps $b rc=$? $(( $(date +%s) - t0 ))s"
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 240 .gpubin/h76/test_cuda > $R/test_cuda_h76.txt 2>&1; echo "test_cuda h76 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_h76.txt | head -8; tail -1 $R/test_cuda_h76.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/h76/engram .gpubin/h76/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 80 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
