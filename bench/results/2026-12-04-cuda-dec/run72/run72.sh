#!/bin/sh
# issue #25, sitting 72 (session q).  p71 = main's library as landed (6602e93; the same code as HEAD's), with
# session q's test_cuda: every fixture of test_cuda, tests/test_apply.sh with cuda-fma (FMA_ONLY takes the gate's
# own chunk sums), then the stamps of sp68 (6a1fae9) and sp71 (6602e93), -DENGRAM_CUDA_STAMPS, 20 calls a sequence
# (one- and 64-token calls).  Built on the development VM as run67.sh says;
# carry [".gpubin/p71", ".gpubin/sp68", ".gpubin/sp71"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r72}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 280 .gpubin/p71/test_cuda > $R/test_cuda_p71.txt 2>&1; rc=$?; echo "test_cuda p71 rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_p71.txt | head -8; tail -1 $R/test_cuda_p71.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p71/engram .gpubin/p71/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda-fma PY=python3 timeout 100 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda-fma.txt" 2>&1
echo "test_apply.sh (cuda-fma) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda-fma.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for b in sp68 sp71; do
  BENCH_CUDA_STAMPS_DEC=20 BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $R/stamps_$b.txt 2>&1
  echo "stamps $b rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp apply 64 idle" $R/stamps_$b.txt | awk 'NR%10==5' | cut -c1-230
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
