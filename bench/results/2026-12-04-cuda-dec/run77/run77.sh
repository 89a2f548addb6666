#!/bin/sh
# issue #25, sitting 77 (session r).  Runs 75-76: the k-tiles by plain bulk copies with evict_first (e75) took one
# token to 1.093-1.101x, but the prefill's GEMM through swizzle-less maps of the k-tiles was ~2% slower (k75).
# e77 = e75 as it would land (evict_first in wsd_kernel's copies alone); d77 = e77 built with -DWS_GEMM_BULK:
# ws_gemm_kernel takes its weights by plain bulk copies too (multicast to the pair where the token tiles pair up).
# test_cuda W = 64 (quick) on d77; the prefill apply and cuBLAS in turn (BENCH_CUDA_PAIRED=4) of m75, e77, d77
# twice; the decode rows of m75, e77, d77 twice; test_cuda every fixture and tests/test_apply.sh (cuda) on d77.
# carry [".gpubin/m75", ".gpubin/e77", ".gpubin/d77"]
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r77}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/d77/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda d77 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in m75 e77 d77; do
    f=$R/paired_${b}_$i.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "paired $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|projection" $f | cut -c1-150
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
for i in 1 2; do
  for b in m75 e77 d77; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 48 {printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
timeout 220 .gpubin/d77/test_cuda > $R/test_cuda_d77.txt 2>&1; echo "test_cuda d77 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_d77.txt | head -8; tail -1 $R/test_cuda_d77.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/d77/engram .gpubin/d77/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 60 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
