#!/bin/sh
# issue #25, sitting 31: n3 = n2 with gemv_rows unrolled (loads in flight; each sum's FMAs in the same order):
# the wide token's cost (BENCH_CUDA_WIDE) against h (HEAD, gemv_list_kernel after wsd) and n2; normal decode
# rows n2 / n3; test_cuda on n3
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r31; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"; }
for v in n2 n3; do f=$R/dec_${v}.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; row $v $? $f; done
for v in h n2 n3; do
  f=$R/wide_${v}.txt; BENCH_CUDA_WIDE=1 BENCH_CUDA_DECODE_ONLY=1 timeout 90 .gpubin/$v/bench_cuda > $f 2>&1; row wide.$v $? $f
done
echo "== test_cuda (n3) $(( $(date +%s) - t0 ))s"; timeout 280 .gpubin/n3/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
tar czf $OUT/r31.tgz -C /tmp r31
