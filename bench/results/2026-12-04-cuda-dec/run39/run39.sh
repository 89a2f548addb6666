#!/bin/sh
# issue #25, sitting 39 (prepared in session h, 2026-12-04 21:38-, when no device was lent; builds of the
# branch wip-25-gpu, commits.txt): h = main 43fb7a5; p = 204658e (the prefill's kernels as programmatic
# dependents); ep = 1d0456a (+ wsd_kernel EAGER/NARROW; f989d53 changes only comments and test_cuda);
# epg = e60afd8 (+ the gate inside the prefill GEMM: groups of 4+ token tiles, 72/216 registers; + the decode
# of up to 4 tokens inside wsd_kernel), epgnf (no fused decode), epg80 (80/208), epg2 (2 groups), epg1
# (1 group: no gate in the GEMM), epgg (the groups' order, the gate after the GEMM: the order's cost alone);
# epgnf/epg80/epg2/epg1 built at 1361724 (d49f2a8 adds only the off-by-default knobs epgg uses);
# e / nn / n5 = HEAD + wsd EAGER only / NARROW only / both with 5 stages
# (run38's builds, wsd_eager_narrow.diff on 43fb7a5).
# epg/test_cuda rebuilt 2026-12-05 at 0d4e003 (e60afd8 + the prefill captured into a graph: main's 9b8479a and c37b369).
# Order: decode rows, prefill rows (each bench under a short timeout: a hang costs 40 s), then test_cuda,
# test_apply.sh (cuda) and bench_ds4 on epg, the whole stack.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r39; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"; }
for round in 1 2; do for v in h ep epg epgnf e nn n5; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r39.tgz -C /tmp r39
for round in 1 2; do for v in h p ep epg epg80 epg2 epg1 epgg; do
  f=$R/pre_${v}_$round.txt; timeout 40 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | awk '{printf "%s ", $0}' | tr -s ' ' | cut -c1-300) $(( $(date +%s) - t0 ))s"
done; done
tar czf $OUT/r39.tgz -C /tmp r39
echo "== test_cuda (epg) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/epg/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER|in a graph" $R/test_cuda.txt | head -14; tail -1 $R/test_cuda.txt
tar czf $OUT/r39.tgz -C /tmp r39
mkdir -p /tmp/b && cp .gpubin/epg/engram .gpubin/epg/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, epg) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4 (epg)"; timeout 60 .gpubin/epg/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -12 $R/bench_ds4.txt | cut -c1-100
tar czf $OUT/r39.tgz -C /tmp r39
