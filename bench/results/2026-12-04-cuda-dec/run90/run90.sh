#!/bin/sh
# issue #25, sitting 90 (session aa).  o2 = main at 2e1018b plus ws_gemm_kernel's consumers issuing a unit's first
# k-tile before storing the last unit's sums (where the tile is whole: a store without branches, so the wgmma stays
# in flight across it); h0 = main at 2e1018b.  gemm_variants of each (gv0, gv2).  (Sitting 89's split of the
# partial sums into halves lost: ws-split.diff there.)
# carry [".gpubin/h0", ".gpubin/o2"]
set -u
t0=$(date +%s)
RUN=${RUN:-r90}
R=/tmp/$RUN; mkdir -p $R
lib=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2; do
  for b in h0 o2; do
    v=$([ $b = h0 ] && echo gv0 || echo gv2)
    timeout 60 .gpubin/$b/$v > $R/${v}_$i.txt 2>&1; echo "$v $i rc=$? $(( $(date +%s) - t0 ))s"; cut -c1-330 $R/${v}_$i.txt | grep -v "^ws ready"
  done
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
ENGRAM_TEST_CUDA_QUICK=1 timeout 100 .gpubin/o2/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda o2 quick rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_quick.txt
grep -E "FAIL|DIFFER|:[0-9]+: " $R/test_cuda_quick.txt | head -5
for i in 1 2; do
  for b in h0 o2; do
    f=$R/paired_${b}_$i.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "paired $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-200
  done
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
# every fixture only where o2's GEMM was the faster at 2048 tokens in both rounds (BF16 out)
w=$(for i in 1 2; do for v in gv0 gv2; do grep "n= 2048 N= 25600" $R/${v}_$i.txt | sed 's/.*BF16 out \([0-9.]*\) ms.*/\1/'; done; done | paste -sd' ')
echo "BF16 out, gv0 gv2 gv0 gv2: $w"
if echo "$w" | awk '{exit !($2 < $1 && $4 < $3)}'; then
timeout 250 .gpubin/o2/test_cuda > $R/test_cuda_o2.txt 2>&1; echo "test_cuda o2 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|DIFFER|:[0-9]+: " $R/test_cuda_o2.txt | head -8; tail -1 $R/test_cuda_o2.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
else echo "o2 not faster: every fixture not run"; fi
