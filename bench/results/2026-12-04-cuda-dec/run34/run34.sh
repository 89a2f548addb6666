#!/bin/sh
# issue #25, sitting 34: ws_gemm_kernel persistent with a ticket of units (d: BN 192; e: BN 176) against
# h = HEAD (3b4689d): gemm_variants at n = 2048,1024,512,300,9 (d also with a CTA per unit), bench_cuda whole,
# test_cuda on d
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=$OUT/r34; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
export GV_NS=2048,1024,512,300,9
for v in h:pers d:pers e:pers d:all h:pers d:pers e:pers; do
  b=${v%%:*}; m=${v##*:}; e=""; [ $m = all ] && e="GV_GRID_ALL=1"
  f=$R/gv_${b}_${m}_$(date +%s).txt; env $e timeout 90 .gpubin/$b/gv > $f 2>&1; echo "== $b $m rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "^n=" $f | grep "N= 25600" | sed -E 's/\| unwritten 0 of [0-9]+, BF16 out differs 0 \| BF16 flips.*\| bits/| bits/' | cut -c1-150
  grep -E "^n=" $f | grep -v "unwritten 0 of [0-9]*, BF16 out differs 0" | cut -c1-200
done
for round in 1 2; do for v in h d e; do
  f=$R/bench_${v}_$round.txt; timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; echo "bench $v.$round rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "cuBLAS F16 GEMM|engram projection|engram apply" $f | grep -v FMA_ONLY
done; done
echo "== test_cuda (d) $(( $(date +%s) - t0 ))s"; timeout 220 .gpubin/d/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
