#!/bin/sh
# issue #25, sitting 69 (session q).  f2 = main + the gate inside wsd_kernel for one-token calls, done by the last
# F = 40 CTAs to arrive (each a share of the columns; they wait on a 64-bit count; gate.cuh's gate_fin); run 68's
# f1 (one finishing CTA) was 8-9 us slower a token.  s2 = f2 with -DENGRAM_CUDA_STAMPS, sp68 = main (6a1fae9)
# likewise; p68 = main; b60 = a9758fb.  f2's GPU checks (test_cuda, every fixture; test_apply.sh cuda), the
# decode rows of b60, p68, f2 in turn, twice, then the stamps of s2 and sp68 (20 calls a sequence).
# Built on the development VM as run67.sh says (s2, sp68 with NVDEFS=-DENGRAM_CUDA_STAMPS, sp68 from 6a1fae9);
# carry [".gpubin/f2", ".gpubin/p68", ".gpubin/b60", ".gpubin/s2", ".gpubin/sp68"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r69}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 280 .gpubin/f2/test_cuda > $R/test_cuda_f2.txt 2>&1; rc=$?; echo "test_cuda f2 rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: |case [0-9]" $R/test_cuda_f2.txt | head -12; grep -E "one-token|replays of 1 |B=1 " $R/test_cuda_f2.txt | grep "W=5120" | cut -c1-250; tail -1 $R/test_cuda_f2.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
[ $rc = 124 ] && exit 1
mkdir -p /tmp/b && cp .gpubin/f2/engram .gpubin/f2/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 100 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p68 f2; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-200
    grep -E "against the|back to back\)|CUDA graph\)" $f | cut -c1-160
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
for b in s2 sp68; do
  BENCH_CUDA_STAMPS_DEC=20 BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $R/stamps_$b.txt 2>&1
  echo "stamps $b rc=$? $(( $(date +%s) - t0 ))s"; grep "^stamp apply 1 " $R/stamps_$b.txt | awk 'NR%10==5' | cut -c1-240
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
