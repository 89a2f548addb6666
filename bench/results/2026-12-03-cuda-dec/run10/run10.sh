#!/bin/sh
# issue #25, sitting 10: the staged decode kernel with a cp.async ring for the weights (and operands)
# b: U=1 S=3 2 blocks/SM; v0: a73ca03 (register bursts); u2s3/u1s4/u2s2/u1s5: U, S, 1 block/SM;
# w4: 4 warps a block, 3 blocks/SM; m1: b with one token through the staged kernel too
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r10; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in v0 b u2s3 u1s4 u2s2 u1s5 w4 m1; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== test_cuda"; timeout 220 .gpubin/b/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
tar czf $OUT/r10.tgz -C /tmp r10
