#!/bin/sh
# issue #25, sitting 27: HEAD (7181132, the wsd decode folded into project_block) first run on a GPU:
# decode bench, test_cuda, test_apply.sh on the GPU, bench_ds4
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r27; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
f=$R/dec_h_1.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/h/bench_cuda > $f 2>&1
echo "h.1 rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"
echo "== test_cuda $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/h/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
mkdir -p /tmp/b && cp .gpubin/h/engram .gpubin/h/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4"; timeout 150 .gpubin/h/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -14 $R/bench_ds4.txt | cut -c1-90
tar czf $OUT/r27.tgz -C /tmp r27
