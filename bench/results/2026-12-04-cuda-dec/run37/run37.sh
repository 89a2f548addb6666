#!/bin/sh
# issue #25, sitting 37: the prefill gate's block shape (gate_block_kernel: GATEB_THREADS / GATEB_KC / GATEB_MINB):
# a = HEAD (675ea61: 320/2/2), B 640/1/2, C 640/1/3, D 384/2/2, E 640/1/1; whole bench_cuda, three rounds alternating
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r37; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in a B C D E; do
  f=$R/bench_${v}_$round.txt; timeout 60 .gpubin/g$v/bench_cuda > $f 2>&1; echo "bench $v.$round rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "cuBLAS F16 GEMM|engram projection|engram apply" $f | grep -v FMA_ONLY | awk '{printf "   %s\n", $0}' | cut -c1-100
done; done
tar czf $OUT/r37.tgz -C /tmp r37
