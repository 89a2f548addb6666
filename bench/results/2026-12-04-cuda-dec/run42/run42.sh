#!/bin/sh
# issue #25, sitting 42 (2026-12-05): branch land-fuse (main 38c0fff + the fused decode of up to 4 tokens, run 39's
# d67e46e, c83af80, 1361724, e60afd8 ported) = lf, against ln (main at e68ab7b..38c0fff).
# Decode rows alternating, three rounds; prefill rows once each; then lf's test_cuda whole, test_apply.sh
# (cuda) and bench_ds4.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r42; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"; }
for round in 1 2 3; do for v in ln lf; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
for v in ln lf; do
  f=$R/pre_${v}.txt; timeout 40 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | awk '{printf "%s ", $0}' | tr -s ' ' | cut -c1-300) $(( $(date +%s) - t0 ))s"
done
tar czf $OUT/r42.tgz -C /tmp r42
echo "== test_cuda (lf) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/lf/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda.txt | head -10; grep -c "in a graph.*equal" $R/test_cuda.txt; tail -1 $R/test_cuda.txt
tar czf $OUT/r42.tgz -C /tmp r42
mkdir -p /tmp/b && cp .gpubin/lf/engram .gpubin/lf/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, lf) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4 (lf)"; timeout 60 .gpubin/lf/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -12 $R/bench_ds4.txt | cut -c1-100
tar czf $OUT/r42.tgz -C /tmp r42
