#!/bin/sh
# issue #25, sitting 64 (session p).  p65 = the gate's sums in wsd_kernel's epilogue (the widest box through shared
# memory) and, for up to 8 tokens, wsd_kernel decoding the rows itself (no decode16_kernel launch); s65 the same with
# -DENGRAM_CUDA_STAMPS; p64 = the sums alone (run 63's build plus the widest box's fix); b60 = a9758fb's bench_cuda
# (the library before).  First main's GPU checks on p65, then the decode rows of b60, p64, p65 in turn, twice, then
# p65's stamps.
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r64}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 300 .gpubin/p65/test_cuda > $R/test_cuda.txt 2>&1; rc=$?; echo "test_cuda rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|DIFFER|lacks|:[0-9]+: " $R/test_cuda.txt | head -12; grep -E "decode apply|graph with" $R/test_cuda.txt | grep "W=5120" | cut -c1-200; tail -1 $R/test_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
[ $rc = 124 ] && exit 1
mkdir -p /tmp/b && cp .gpubin/p65/engram .gpubin/p65/engram-cuda.so /tmp/b/
for d in cuda cuda-fma; do
  ENGRAM_DEVICE=$d PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_$d.txt" 2>&1
  echo "test_apply.sh ($d) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_$d.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p64 p65; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "floor for|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-400
    grep -E "against the|host|back to back|CUDA graph\)" $f | cut -c1-170
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
BENCH_CUDA_STAMPS_DEC=60 BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/s65/bench_cuda > $R/stamps.txt 2>&1
echo "stamps rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp" $R/stamps.txt | awk 'NR%15==3' | cut -c1-230
tar czf $OUT/$RUN.tgz -C /tmp $RUN
