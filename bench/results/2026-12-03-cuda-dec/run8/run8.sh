#!/bin/sh
# issue #25, sitting 8: staged operands (burst) variants, then the default build's checks and benchmarks
# (b: the kept build, 8 warps a block, 2 blocks an SM; v0: sitting 6's binary with -DMMV_STAGE_NT=99,
#  the kernel before; s1: -DMMV_SWARPS=4 -DMMV_SMIN_BLOCKS=4; s2: -DMMV_SWARPS=4 -DMMV_SMIN_BLOCKS=3)
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r8; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in v0 b s1 s2; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A10 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== test_cuda"; timeout 200 $B/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
echo "== bench_cuda"; timeout 90 $B/bench_cuda > $R/bench_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; head -30 $R/bench_cuda.txt | tail -24
echo "== bench_ds4"; timeout 100 $B/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -11 $R/bench_ds4.txt | cut -c1-70
mkdir -p /tmp/b && cp $B/engram $B/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 100 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== python"; mkdir -p $R/py; timeout 150 sh python/cuda_device_run.sh $B $R/py > $R/py/run.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -3 $R/py/run.txt
tar czf $OUT/r8.tgz -C /tmp r8
