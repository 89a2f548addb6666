#!/bin/sh
# issue #25, sitting 22: each warp of the decode projection asks L2 for its weights MMV_PF rounds ahead
# (cp.async.bulk.prefetch.L2, one instruction a round a warp, no registers): b HEAD, p1/p2/p4 = 1/2/4 rounds
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r22; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in b p1 p2 p4; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"
done; done
echo "end $(( $(date +%s) - t0 ))s"
tar czf $OUT/r22.tgz -C /tmp r22
