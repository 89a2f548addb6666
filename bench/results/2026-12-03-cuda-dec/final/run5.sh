#!/bin/sh
# the final build of this stop on the H200: the GPU checks and the benchmarks (issue #25)
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $OUT/machine.txt 2>&1
echo "== test_cuda"; timeout 200 $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "test_cuda rc=$?"; grep -E "FAIL|NO\b" $OUT/test_cuda.txt | head; tail -1 $OUT/test_cuda.txt
echo "== bench_cuda"; timeout 90 $B/bench_cuda > $OUT/bench_cuda.txt 2>&1; echo "rc=$?"; head -22 $OUT/bench_cuda.txt | tail -18
echo "== bench_ds4"; timeout 100 $B/bench_ds4 > $OUT/bench_ds4.txt 2>&1; echo "rc=$?"; tail -11 $OUT/bench_ds4.txt | cut -c1-60
mkdir -p /tmp/b && cp $B/engram $B/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 100 sh tests/test_apply.sh /tmp/b > "$OUT/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$?"; tail -1 $OUT/test_apply_cuda.txt
echo "== python"; mkdir -p $OUT/py; timeout 150 sh python/cuda_device_run.sh $B $OUT/py > $OUT/py/run.txt 2>&1; echo "rc=$?"; tail -3 $OUT/py/run.txt
