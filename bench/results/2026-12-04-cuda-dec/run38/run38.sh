#!/bin/sh
# issue #25, sitting 38: wsd_kernel releasing each stage once its products are done (EAGER) and with a token
# box of the call's n rounded up to 8/16/32/64 (NARROW; 6 stages where they fit): en = both (the tree),
# e = EAGER only, nn = NARROW only, n5 = both with 5 stages, h = HEAD (43fb7a5); decode rows alternating,
# two rounds; then test_cuda and test_apply.sh (cuda) on en
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r38; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"; }
for round in 1 2; do for v in h en e nn n5; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r38.tgz -C /tmp r38
grep -h -E "graph|floor for" $R/dec_*_1.txt | cut -c1-120
echo "== test_cuda (en) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/en/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$" $R/test_cuda.txt | head -10; grep -E "calls of 2, 8" $R/test_cuda.txt | cut -c1-150; tail -1 $R/test_cuda.txt
tar czf $OUT/r38.tgz -C /tmp r38
mkdir -p /tmp/b && cp .gpubin/en/engram .gpubin/en/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, en) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/r38.tgz -C /tmp r38
