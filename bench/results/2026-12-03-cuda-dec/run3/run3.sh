#!/bin/sh
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $OUT/machine.txt 2>&1
echo "== test_cuda"; timeout 240 $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$?"
grep -E "FAIL|batch-inv|graph|checks" $OUT/test_cuda.txt | head -20
echo "== bench_cuda"; timeout 120 $B/bench_cuda > $OUT/bench_cuda.txt 2>&1; echo "rc=$?"; head -36 $OUT/bench_cuda.txt | tail -30
for v in mb1 up4 w4 w4mb3; do
  BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/mmv/$v/bench_cuda > $OUT/var_$v.txt 2>&1
  echo "== variant $v rc=$?"; grep -A12 "^   B" $OUT/var_$v.txt | cut -c1-52
done
mkdir -p /tmp/b && cp $B/engram $B/engram-cuda.so /tmp/b/
for dev in cuda cuda-fma; do
  ENGRAM_DEVICE=$dev PY=python3 timeout 200 sh tests/test_apply.sh /tmp/b > "$OUT/test_apply_$dev.txt" 2>&1
  echo "test_apply.sh ($dev) rc=$?"; tail -1 $OUT/test_apply_$dev.txt
done
echo "== bench_ds4"; timeout 150 $B/bench_ds4 > $OUT/bench_ds4.txt 2>&1; echo "rc=$?"; tail -12 $OUT/bench_ds4.txt
