#!/bin/sh
# issue #25, sitting 26: the decode projection through wsd_kernel (the prefill's arithmetic in cuBLAS's
# decode shape, run 25's probe made the library's path). b: HEAD's library (mmv); u: wsd for every n <= 64;
# s: wsd from 9 tokens (mmv below). Decode rows alternating, two rounds; test_cuda on u.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r26; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do for v in b u s; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"
done; done
grep -E '^   1 ' $R/dec_u_2.txt $R/dec_b_2.txt
echo "== test_cuda (u) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/u/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|invariant|bits of|replays|decode, F16|without wgmma" $R/test_cuda.txt | head -40; tail -1 $R/test_cuda.txt
tar czf $OUT/r26.tgz -C /tmp r26
