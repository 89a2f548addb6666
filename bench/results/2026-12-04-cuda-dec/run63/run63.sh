#!/bin/sh
# issue #25, sitting 63 (session p).  p63 = the gate's sums in wsd_kernel's epilogue (the working tree after
# 6541621, built plainly), s63 the same with -DENGRAM_CUDA_STAMPS; b60 = a9758fb's bench_cuda (the library before).
# First main's GPU checks on p63 (test_cuda, test_apply.sh with cuda and cuda-fma), then the decode rows of b60 and
# p63 in turn, twice, then p63's stamps.
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r63}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 240 .gpubin/p63/test_cuda > $R/test_cuda.txt 2>&1; echo "test_cuda rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|DIFFER|lacks|:[0-9]+: " $R/test_cuda.txt | head -12; grep "decode apply" $R/test_cuda.txt | cut -c1-200; tail -1 $R/test_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p63/engram .gpubin/p63/engram-cuda.so /tmp/b/
for d in cuda cuda-fma; do
  ENGRAM_DEVICE=$d PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_$d.txt" 2>&1
  echo "test_apply.sh ($d) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_$d.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p63; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "floor for|^ +1 |^ +2 |^ +8 |^ +16 |^ +64 |against the" $f | grep -v FMA_ONLY | cut -c1-170
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
BENCH_CUDA_STAMPS_DEC=60 BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/s63/bench_cuda > $R/stamps.txt 2>&1
echo "stamps rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp" $R/stamps.txt | awk 'NR%15==3' | cut -c1-230
tar czf $OUT/$RUN.tgz -C /tmp $RUN
