#!/bin/sh
# issue #25, sitting 32: ws_gemm_kernel persistent (p: BN 192; q: BN 176) against h = HEAD (3b4689d):
# gemm_variants (h, p, p with a CTA per tile, q) twice alternating; bench_cuda whole (prefill rows) h/p/q twice
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r32; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.sm,power.limit --format=csv; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do
  for v in h p pall q; do
    b=$v; e=""; [ $v = pall ] && { b=p; e="GV_GRID_ALL=1"; }
    f=$R/gv_${v}_$round.txt; env $e timeout 120 .gpubin/$b/gv > $f 2>&1; echo "gv $v.$round rc=$? $(( $(date +%s) - t0 ))s"
    grep -E "^ws ready|^n=" $f | sed -E 's/\| BF16 flips.*\| bits/| bits/' | cut -c1-200
  done
  for v in h p q; do
    f=$R/bench_${v}_$round.txt; timeout 120 .gpubin/$v/bench_cuda > $f 2>&1; echo "bench $v.$round rc=$? $(( $(date +%s) - t0 ))s"
    grep -E "cuBLAS F16 GEMM|engram projection|engram apply" $f | grep -v FMA_ONLY
  done
done
tar czf $OUT/r32.tgz -C /tmp r32
