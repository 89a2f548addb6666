#!/bin/sh
# issue #25, sitting 49 (2026-12-05, session l): the change as it lands = l49 (main 3314848 + decode16_kernel
# through the hardware's E4M3 conversion, no knob; bench_cuda's knobs), against g48 (main's kernels, the same bench).
# (1) dec16_probe (second version: the domain decode16 takes, then run 48's); (2) l49's test_cuda whole and
# test_apply.sh (cuda); (3) ncu: decode16 and the rest of one prefill apply, both; (4) prefill rows (spread) and
# decode rows, two rounds alternating.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r49; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
cat $R/machine.txt
t0=$(date +%s)
timeout 60 .gpubin/probe49/dec16_probe > $R/dec16_probe.txt 2>&1; echo "dec16_probe rc=$? $(( $(date +%s) - t0 ))s"; cat $R/dec16_probe.txt
timeout 240 .gpubin/l49/test_cuda > $R/test_cuda_l49.txt 2>&1; echo "test_cuda (l49) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_l49.txt
tar czf $OUT/r49.tgz -C /tmp r49
mkdir -p /tmp/b && cp .gpubin/l49/engram .gpubin/l49/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 120 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda_l49.txt" 2>&1
echo "test_apply.sh (cuda, l49) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda_l49.txt
tar czf $OUT/r49.tgz -C /tmp r49
K='decode16|ws_gemm|gemv_list|gate_block'
for v in g48 l49; do
  BENCH_CUDA_PREFILL_ONCE=1 timeout 60 ncu --clock-control none -k regex:"$K" --launch-skip 4 --launch-count 8 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed .gpubin/$v/bench_cuda > $R/ncu_dur_$v.txt 2>&1
  echo "ncu dur $v rc=$? $(( $(date +%s) - t0 ))s: $(grep -E '^  [a-zA-Z_]|gpu__time_duration' $R/ncu_dur_$v.txt | awk '/gpu__time_duration/{printf "%s ", $NF; next}{n=$1; sub(/[<(].*/, "", n); printf "%s=", n}' | cut -c1-300)"
done
for round in 1 2; do for v in g48 l49; do
  f=$R/pre_${v}_$round.txt; BENCH_CUDA_DIST=1 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM|again" $f | grep -v FMA_ONLY | sed -E 's/ = [0-9]+ (TFLOP|tokens)\/s//; s/ x cuBLAS F16//; s/\(inexact floor\)//; s/  +/ /g' | paste -sd'|' | cut -c1-300) $(( $(date +%s) - t0 ))s"
done; done
tar czf $OUT/r49.tgz -C /tmp r49
row() { echo "$1 rc=$2 $(grep -E -A14 "^   B " $3 | awk 'NR>1{printf "%s:%s ", $1, $3}') $(( $(date +%s) - t0 ))s"
        grep -E "^   1 \(" $3 | sed 's/^/    /' | cut -c1-140; }
for round in 1 2; do for v in g48 l49; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 40 .gpubin/$v/bench_cuda > $f 2>&1; row $v.$round $? $f
done; done
tar czf $OUT/r49.tgz -C /tmp r49
