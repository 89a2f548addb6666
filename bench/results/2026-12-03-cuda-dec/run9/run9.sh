#!/bin/sh
# issue #25, sitting 9: the final build's test_cuda and decode rows; the CUDA layer's error-check mutants
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r9; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
t0=$(date +%s)
echo "== test_cuda"; timeout 200 $B/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
BENCH_CUDA_DECODE_ONLY=1 timeout 60 $B/bench_cuda > $R/dec.txt 2>&1; echo "decode rc=$? $(grep -E -A10 "^   B " $R/dec.txt | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
mkdir -p /tmp/mut && python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open('.gpubin/mutants.tar.xz').read())" | tar xf - -C /tmp/mut && ls /tmp/mut | wc -l
echo "== mutants"; MUT_LIMIT=60 timeout 300 sh cuda/mutants_run.sh /tmp/mut > $R/mutants.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; cat $R/mutants.txt
tar czf $OUT/r9.tgz -C /tmp r9
