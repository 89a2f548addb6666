#!/bin/sh
# issue #25, sitting 43 (2026-12-05, session j): wsd_kernel in CTAs of 128 outputs, two an SM (b:
# WSD_HALF_NB=64, every token box) against CTAs of 256, one an SM (a: WSD_HALF_NB=0 = main's kernel).
# Decode rows alternating, three rounds (each with the new row: 32 direct calls back to back); then b's
# test_cuda whole, test_apply.sh (cuda) and bench_ds4.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r43; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"
        grep -E "^   1 \(" $3 | sed 's/^/    /' | cut -c1-140; }
for round in 1 2 3; do for v in a43 b43; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r43.tgz -C /tmp r43
echo "== test_cuda (b43) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/b43/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda.txt | head -10; grep -c "in a graph.*equal" $R/test_cuda.txt; tail -1 $R/test_cuda.txt
tar czf $OUT/r43.tgz -C /tmp r43
mkdir -p /tmp/b && cp .gpubin/b43/engram .gpubin/b43/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, b43) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4 (b43)"; timeout 60 .gpubin/b43/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -12 $R/bench_ds4.txt | cut -c1-100
tar czf $OUT/r43.tgz -C /tmp r43
