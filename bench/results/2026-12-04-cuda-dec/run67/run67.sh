#!/bin/sh
# issue #25, sitting 67 (session p), the session's last device minutes.  p68 = what lands: the gate's sums in
# wsd_kernel's epilogue for boxes up to 32 tokens, made by the gate itself for 33-64 tokens and the other projections;
# run 64-66's own decode of one token's rows in wsd_kernel taken out again (it cost CUDA-graph replays and
# back-to-back calls 3-10 us, run 66).  b60 = a9758fb's bench_cuda (the library before).  The decode rows of b60 and
# p68 in turn, then test_cuda on p68's W = 5120 fixture (where the new sums run; budget for no more).
# Build first, on the development VM, from main (b60 from a9758fb the same way):
#   make -s -j2 BUILD=/tmp/bld-p68 WERROR=1 LDLIBS_CORE="-l:liburing.a -lpthread -lm" \
#        LDLIBS_TOOLS="-l:libjansson.a -l:libutf8proc.a" /tmp/bld-p68/cuda/test_cuda /tmp/bld-p68/cuda/bench_cuda
#   mkdir -p .gpubin/p68 && cp /tmp/bld-p68/cuda/test_cuda /tmp/bld-p68/cuda/bench_cuda .gpubin/p68/
# then run with carry [".gpubin/p68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r67}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for b in b60 p68; do
  f=$R/bench_${b}_1.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$b/bench_cuda > $f 2>&1
  echo "bench $b rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-400
  grep -E "against the|back to back\)|CUDA graph\)" $f | cut -c1-160
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
ENGRAM_TEST_CUDA_WIDTH=5120 timeout 150 .gpubin/p68/test_cuda > $R/test_cuda.txt 2>&1; echo "test_cuda (W = 5120) rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|DIFFER|lacks|:[0-9]+: " $R/test_cuda.txt | head -8; grep -E "decode apply" $R/test_cuda.txt | cut -c1-200; tail -1 $R/test_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
