#!/bin/sh
# issue #25, sitting 74 (session q): the check of the last refactor (wsd_out / wsd_xq_at shared by wsd_kernel and
# the gate's chunk sums; test_cuda's bf16_of / overflow_token helpers): test_cuda's W = 5120 fixture and
# tests/test_apply.sh (cuda) on p74 (main with it).  Built as run67.sh says; carry [".gpubin/p74"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r74}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
ENGRAM_TEST_CUDA_WIDTH=5120 timeout 120 .gpubin/p74/test_cuda > $R/test_cuda_p74.txt 2>&1; echo "test_cuda p74 (W = 5120) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: " $R/test_cuda_p74.txt | head -8; tail -1 $R/test_cuda_p74.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p74/engram .gpubin/p74/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 80 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
