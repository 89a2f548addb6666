#!/bin/sh
# issue #25, sitting 68 (session q).  f1 = main + the gate inside wsd_kernel for calls of one token (gate.cuh's
# gate_fin: the CTA arriving last gates and writes; no gate_kernel launch); f8 = the same for calls of up to 8
# tokens (-DWSD_FIN_N=8, bench only); p68 = main at 6a1fae9; b60 = a9758fb (the library before session p).
# First f1's GPU checks (test_cuda, every fixture; tests/test_apply.sh with cuda), then the decode rows of b60, p68,
# f1, f8 in turn, twice.  Built on the development VM as run67.sh says (f8 with NVDEFS=-DWSD_FIN_N=8);
# carry [".gpubin/f1", ".gpubin/f8", ".gpubin/p68", ".gpubin/b60"].
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r68}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
timeout 300 .gpubin/f1/test_cuda > $R/test_cuda_f1.txt 2>&1; rc=$?; echo "test_cuda f1 rc=$rc $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|NO,|NO;|DIFFER|lacks|:[0-9]+: |case [0-9]" $R/test_cuda_f1.txt | head -12; grep -E "one-token|4-byte|replays of 1 |B=1 " $R/test_cuda_f1.txt | grep "W=5120" | cut -c1-250; tail -1 $R/test_cuda_f1.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
[ $rc = 124 ] && exit 1
mkdir -p /tmp/b && cp .gpubin/f1/engram .gpubin/f1/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
for i in 1 2; do
  for b in b60 p68 f1 f8; do
    f=$R/bench_${b}_$i.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$b/bench_cuda > $f 2>&1
    echo "bench $b $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" $f | grep -v FMA_ONLY | awk '{printf "%s %s %s | ", $1, $2, $3} END {print ""}' | cut -c1-300
    grep -E "against the|back to back\)|CUDA graph\)" $f | cut -c1-160
  done
  tar czf $OUT/$RUN.tgz -C /tmp $RUN
done
