#!/bin/sh
# issue #25, sitting 75 (session r).  k75 = branch wip-bulk: the weights on the device in k-tiles of 64 inputs,
# already in the 128-byte swizzle's order, so that wsd_kernel takes a CTA's tile with one plain bulk copy (no
# tensor map) and ws_gemm_kernel's maps copy them as they lie; e75 = k75 with the bulk copies' L2 policy
# evict_first (-DWSD_EVICT_FIRST, bench_cuda only); m75 = main (a5e6a7a).  test_cuda W = 64 (quick) on
# k75, the decode rows of m75, k75 and e75 in turn three times, the one-token stamps (BENCH_CUDA_STAMPS_DEC=20) of
# sm75 / sk75 (m75 / k75 built with -DENGRAM_CUDA_STAMPS), tests/test_apply.sh (cuda), test_cuda every fixture,
# then the prefill apply and cuBLAS in turn (BENCH_CUDA_PAIRED=4) of m75 and k75 twice.
# Built on the development VM: make BUILD=... WERROR=1 (static liburing, jansson, utf8proc) at a5e6a7a (m75:
# bench_cuda) and at the branch (k75: test_cuda, bench_cuda, engram, engram-cuda.so); carry [".gpubin/m75", ".gpubin/k75", ".gpubin/e75",
# ".gpubin/sm75", ".gpubin/sk75"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r75}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_QUICK=1 timeout 60 .gpubin/k75/test_cuda > $R/test_cuda_quick.txt 2>&1; echo "test_cuda k75 quick rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_quick.txt | head -8; tail -1 $R/test_cuda_quick.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2 3; do
  for b in m75 k75 e75; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '$1 == 1 || $1 == 8 || $1 >= 32 {printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
for b in sm75 sk75; do
  BENCH_CUDA_STAMPS_DEC=20 BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $R/stamps_$b.txt 2>&1; echo "stamps $b rc=$? $(( $(date +%s) - t0 ))s"
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/k75/engram .gpubin/k75/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 80 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 240 .gpubin/k75/test_cuda > $R/test_cuda_k75.txt 2>&1; echo "test_cuda k75 (every fixture) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_k75.txt | head -8; tail -1 $R/test_cuda_k75.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in m75 k75; do
    f=$R/paired_${b}_$i.txt; BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "paired $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "paired|engram apply \(|cuBLAS F16 GEMM|projection" $f | cut -c1-160
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
