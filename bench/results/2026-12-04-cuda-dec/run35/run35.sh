#!/bin/sh
# issue #25, sitting 35: the landing build f (ws_gemm_kernel persistent with a ticket of units, BN 176; test_cuda
# with n = 256, the CTAs in pairs) : test_cuda, test_apply.sh (cuda), bench_cuda against h = HEAD (3b4689d)
# alternating, two rounds, bench_ds4
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r35; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
echo "== test_cuda (f)"; timeout 240 .gpubin/f/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; grep -E "n= 256|n=2100" $R/test_cuda.txt | cut -c1-160; tail -1 $R/test_cuda.txt
tar czf $OUT/r35.tgz -C /tmp r35
mkdir -p /tmp/b && cp .gpubin/f/engram .gpubin/f/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 120 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, f) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/r35.tgz -C /tmp r35
for round in 1 2; do for v in h f; do
  f=$R/bench_${v}_$round.txt; timeout 60 .gpubin/$v/bench_cuda > $f 2>&1; echo "bench $v.$round rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "cuBLAS F16 GEMM|engram projection|engram apply" $f | grep -v FMA_ONLY
done; done
tar czf $OUT/r35.tgz -C /tmp r35
echo "== bench_ds4 (f)"; timeout 60 .gpubin/f/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -12 $R/bench_ds4.txt | cut -c1-100
tar czf $OUT/r35.tgz -C /tmp r35
