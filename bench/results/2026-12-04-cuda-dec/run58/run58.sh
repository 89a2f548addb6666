#!/bin/sh
# issue #25, sitting 58 (session n): the GPU checks on main as it stands.  l55 = main at 1bbbde9 (the library's
# code as at de410be) built plainly: test_cuda whole, test_ple_cuda, tests/test_apply.sh with ENGRAM_DEVICE=cuda and
# cuda-fma (the numpy float64 reference).
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r58; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 200 .gpubin/l55/test_cuda > $R/test_cuda.txt 2>&1; echo "test_cuda rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
tar czf $OUT/r58.tgz -C /tmp r58
mkdir -p /tmp/b && cp .gpubin/l55/engram .gpubin/l55/engram-cuda.so /tmp/b/
for d in cuda cuda-fma; do
  ENGRAM_DEVICE=$d PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_$d.txt" 2>&1
  echo "test_apply.sh ($d) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_$d.txt
done
tar czf $OUT/r58.tgz -C /tmp r58
timeout 120 .gpubin/l55/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_ple_cuda.txt
tar czf $OUT/r58.tgz -C /tmp r58
