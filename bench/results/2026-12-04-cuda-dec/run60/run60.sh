#!/bin/sh
# issue #25, sitting 60 (session o).  b60 and s60 = a9758fb, built plainly and with -DENGRAM_CUDA_STAMPS.  Run 59's
# open questions: the bulk stream's own time inside the kernel (like wsd_kernel's stamped time), and where the
# gate's ~5 us after its wait go (marks past its block's sums, the cluster's exchange, its writes).
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r60}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/b60/bench_cuda > $R/bench.txt 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 ))s"; grep -E "floor|only reads|copy engine|inside the kernel|^ +1 |against the|host" $R/bench.txt | grep -v FMA_ONLY | cut -c1-170
tar czf $OUT/$RUN.tgz -C /tmp $RUN
BENCH_CUDA_STAMPS_DEC=60 BENCH_CUDA_DECODE_ONLY=1 timeout 120 .gpubin/s60/bench_cuda > $R/stamps.txt 2>&1
echo "stamps rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp" $R/stamps.txt | awk 'NR%15==3' | cut -c1-230
tar czf $OUT/$RUN.tgz -C /tmp $RUN
