#!/bin/sh
# issue #25, sitting 59 (session o).  b59 = f04c7a1 built plainly (main's library as l55; bench_cuda's new rows): the weights
# streamed by the copy engine alone, called directly (what reading alone costs a direct call), an empty kernel's launch,
# the one-token apply against that stream, and the host's time to submit a call.  Then s59 (f04c7a1 with
# -DENGRAM_CUDA_STAMPS): the kernels' own stamps in one-token calls (idle before each, back to back, the projection
# alone), where a direct call's time goes (the machines have no nsys); then run 58's checks on l59 (f04c7a1 built
# plainly: main's GPU code): test_cuda, test_apply.sh with cuda and cuda-fma, test_ple_cuda.
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r59}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2; do
  f=$R/bench_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/b59/bench_cuda > $f 2>&1
  echo "bench $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "copy|only reads|copy engine|empty|^ +1 |^ +2 |^ +8 |against the|host" $f | grep -v FMA_ONLY | cut -c1-170
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
BENCH_CUDA_STAMPS_DEC=60 BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/s59/bench_cuda > $R/stamps.txt 2>&1
echo "stamps rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp" $R/stamps.txt | awk 'NR%10==3' | cut -c1-200
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 200 .gpubin/l59/test_cuda > $R/test_cuda.txt 2>&1; echo "test_cuda rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/l59/engram .gpubin/l59/engram-cuda.so /tmp/b/
for d in cuda cuda-fma; do
  ENGRAM_DEVICE=$d PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_$d.txt" 2>&1
  echo "test_apply.sh ($d) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_$d.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 120 .gpubin/l59/test_ple_cuda > $R/test_ple_cuda.txt 2>&1; echo "test_ple_cuda rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_ple_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
