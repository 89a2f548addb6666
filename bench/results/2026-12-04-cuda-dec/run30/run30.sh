#!/bin/sh
# issue #25, sitting 30: the landing build n2 (run 28's n + the review's changes: wsd_kernel triggers its
# dependents only for the apply, the step index loaded only with wide tokens) against h = HEAD (7181132),
# both with bench_cuda's BENCH_CUDA_WIDE knob: decode rows alternating, two rounds; then one round each with
# token 0 too wide for F16; test_cuda, test_apply.sh (cuda) and bench_ds4 on n2
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r30; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"; }
for round in 1 2; do for v in h n2; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
for v in h n2; do
  f=$R/wide_${v}.txt; BENCH_CUDA_WIDE=1 BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$v/bench_cuda > $f 2>&1; row wide.$v $? $f
done
echo "== test_cuda (n2) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/n2/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
mkdir -p /tmp/b && cp .gpubin/n2/engram .gpubin/n2/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, n2) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4 (n2)"; timeout 150 .gpubin/n2/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -12 $R/bench_ds4.txt | cut -c1-90
tar czf $OUT/r30.tgz -C /tmp r30
