#!/bin/sh
# issue #25, sitting 67 (session q; prepared in session p, widened here).  p68 = main at 6a1fae9 (what landed in
# session p, never run on a device before); w68 = p68 + run67/wip-self-loads.diff (the gate's own chunk sums for
# 33-64 tokens with every load of a warp's chunks issued first); b60 = a9758fb's bench_cuda (the library before
# session p).  test_cuda's W = 5120 fixture on p68 and w68 (where the chunk sums run), tests/test_apply.sh on p68
# (cuda, cuda-fma), then the decode rows of b60, p68, w68 in turn, twice.
# Built on the development VM from main (w68 from a worktree with the diff applied; b60 from a9758fb likewise):
#   make -s -j2 BUILD=/tmp/bld-p68 WERROR=1 LDLIBS_CORE="-l:liburing.a -lpthread -lm" \
#        LDLIBS_TOOLS="-l:libjansson.a -l:libutf8proc.a" /tmp/bld-p68/cuda/test_cuda /tmp/bld-p68/cuda/bench_cuda \
#        /tmp/bld-p68/engram /tmp/bld-p68/engram-cuda.so
#   cp those four to .gpubin/p68/ (w68: test_cuda and bench_cuda); run with carry [".gpubin/p68", ".gpubin/w68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r67}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for b in p68 w68; do
  ENGRAM_TEST_CUDA_WIDTH=5120 timeout 150 .gpubin/$b/test_cuda > $R/test_cuda_$b.txt 2>&1; echo "test_cuda $b (W = 5120) rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "FAIL|NO$|NO,|DIFFER|lacks|:[0-9]+: " $R/test_cuda_$b.txt | head -6; tail -1 $R/test_cuda_$b.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
mkdir -p /tmp/b && cp .gpubin/p68/engram .gpubin/p68/engram-cuda.so /tmp/b/
for d in cuda cuda-fma; do
  ENGRAM_DEVICE=$d PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_$d.txt" 2>&1
  echo "test_apply.sh ($d) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_$d.txt
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p68 w68; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-400
    grep -E "against the|back to back\)|CUDA graph\)" $f | cut -c1-160
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
