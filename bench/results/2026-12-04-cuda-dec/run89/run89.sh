#!/bin/sh
# issue #25, sitting 89 (session aa).  s1 = main at 2e1018b plus ws_gemm_kernel's WS_SPLIT consumer (each consumer's
# partial sums in two halves of 88 outputs, two chains of wgmma: a group's halves promoted while the other half runs,
# a unit's sums stored while the next unit's first k-tile runs); h0 = main at 2e1018b.  gemm_variants of each (gv0,
# gv1: time against cuBLAS, flips against a double sum, the outputs' bits hash).
# carry [".gpubin/h0", ".gpubin/s1"]
set -u
t0=$(date +%s)
RUN=${RUN:-r89}
R=/tmp/$RUN; mkdir -p $R
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2; do
  for b in h0 s1; do
    v=$([ $b = h0 ] && echo gv0 || echo gv1)
    timeout 60 .gpubin/$b/$v > $R/${v}_$i.txt 2>&1; echo "$v $i rc=$? $(( $(date +%s) - t0 ))s"; cut -c1-330 $R/${v}_$i.txt | grep -v "^ws ready"
  done
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
ENGRAM_TEST_CUDA_QUICK=1 timeout 100 .gpubin/s1/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda s1 quick rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_quick.txt
grep -E "FAIL|DIFFER|:[0-9]+: " $R/test_cuda_quick.txt | head -5
for i in 1 2; do
  for b in h0 s1; do
    f=$R/paired_${b}_$i.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "paired $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-200
  done
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 250 .gpubin/s1/test_cuda > $R/test_cuda_s1.txt 2>&1; echo "test_cuda s1 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|DIFFER|:[0-9]+: " $R/test_cuda_s1.txt | head -8; tail -1 $R/test_cuda_s1.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
