#!/bin/sh
# issue #25, sitting 13: the gate's PRE kernel at 4 blocks an SM (b4: -DGATE_PRE_MINB=4, 64 registers)
# against 3 (b, run 12's build); test_cuda on b4; the 4 GPU mutants not reached in run 9
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=$OUT  # written there as it goes (the device time left may cut the sitting short)
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
echo "== test_cuda (b4)"; timeout 200 .gpubin/b4/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
for round in 1 2; do for v in b b4; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== the 4 error-check mutants run 9 did not reach (cuda/engram_cuda.cu lines 87, 430, 455, 519 at 82678e2) $(( $(date +%s) - t0 ))s"
MUT_LIMIT=60 sh cuda/mutants_run.sh .gpubin/mut4 > $R/mutants.txt 2>&1; cat $R/mutants.txt

