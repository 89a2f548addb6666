#!/bin/sh
# issue #25, sitting 45 (2026-12-05, session j): run 44's probes, then the weights in k-tiles (branch wip-kt:
# [K/64][N][64] where the wgmma GEMMs run, every box one contiguous run) = kt45, against d44 (main at
# 01c34d3: row-major) and a43 (main's kernel before it).  (1) box_bw, occ_probe; (2) decode rows, two rounds
# alternating a43 / d44 / kt45; (3) prefill rows (the whole bench) d44 / kt45 twice; (4) kt45's test_cuda
# whole, test_apply.sh (cuda); gemm_variants on kt's layout.
# Built on the development VM: .gpubin/box_bw and .gpubin/occ_probe from src/ (nvcc -std=c++17 -O2
# -gencode=arch=compute_90a,code=sm_90a, occ_probe with -Iinclude -Isrc -Icuda ... -lcuda); a43 =
# the 01c34d3 change, then uncommitted, built with -DWSD_HALF_NB=0 (every box in CTAs of 256: main's kernel), d44 =
# main at 01c34d3, kt45 = wip-kt (wip-kt.diff on 01c34d3), gv_kt =
# cuda/gemm_variants.cu of wip-kt.  (A run44.sh with steps (1) and (3) never got a machine; this took its place.)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r45; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
timeout 120 .gpubin/box_bw > $R/box_bw.txt 2>&1; echo "box_bw rc=$? $(( $(date +%s) - t0 ))s"; cat $R/box_bw.txt
timeout 60 .gpubin/occ_probe > $R/occ_probe.txt 2>&1; echo "occ_probe rc=$? $(( $(date +%s) - t0 ))s"; cat $R/occ_probe.txt
tar czf $OUT/r45.tgz -C /tmp r45
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"
        grep -E "^   1 \(" $3 | sed 's/^/    /' | cut -c1-140; }
for round in 1 2; do for v in a43 d44 kt45; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r45.tgz -C /tmp r45
for round in 1 2; do for v in d44 kt45; do
  f=$R/pre_${v}_$round.txt; timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | awk '{printf "%s ", $0}' | tr -s ' ' | cut -c1-300) $(( $(date +%s) - t0 ))s"
done; done
tar czf $OUT/r45.tgz -C /tmp r45
echo "== test_cuda (kt45) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/kt45/test_cuda > $R/test_cuda_kt45.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda_kt45.txt | head -10; grep -c "in a graph.*equal" $R/test_cuda_kt45.txt; tail -1 $R/test_cuda_kt45.txt
tar czf $OUT/r45.tgz -C /tmp r45
mkdir -p /tmp/b && cp .gpubin/kt45/engram .gpubin/kt45/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda_kt45.txt" 2>&1
echo "test_apply.sh (cuda, kt45) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda_kt45.txt
timeout 90 .gpubin/gv_kt > $R/gemm_variants_kt.txt 2>&1; echo "gemm_variants (kt) rc=$? $(( $(date +%s) - t0 ))s"; tail -8 $R/gemm_variants_kt.txt | cut -c1-160
tar czf $OUT/r45.tgz -C /tmp r45
