#!/bin/sh
# issue #25, sitting 48 (2026-12-05, session l).  Built on the development VM from main 3314848 + the session's
# uncommitted knobs: g48 = main's kernels (bench_cuda with BENCH_CUDA_DIST); c0 = -DDEC16_CVT=1; c1 = c0 +
# -DGATEB_STREAM=1 (the prefill gate's x and kv evict-first); c2 = c1 + the gate in blocks of 640 (GATEB_THREADS=640
# GATEB_KC=1 GATEB_MINB=2: run 47's gB); c3 = c0 + gB's shape without GATEB_STREAM.
# (1) dec16_probe: decode16's two routes over their whole domain; (2) ncu: each variant's prefill kernels, F32 and
# BF16 residual; (3) prefill rows with each timing's spread (BENCH_CUDA_DIST), two rounds alternating;
# (4) the variant whose gate is fastest under ncu (sum over F32 + BF16): test_cuda whole.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r48; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
cat $R/machine.txt
t0=$(date +%s)
timeout 60 .gpubin/probe48/dec16_probe > $R/dec16_probe.txt 2>&1; echo "dec16_probe rc=$? $(( $(date +%s) - t0 ))s"; cat $R/dec16_probe.txt
BENCH_CUDA_PREFILL_ONCE=1 timeout 60 .gpubin/g48/bench_cuda > $R/first.txt 2>&1; echo "first rc=$? $(( $(date +%s) - t0 ))s"
K='decode16|ws_gemm|gemv_list|gate_block'
for v in g48 c0 c1 c2 c3; do for r in 1 bf16; do
  BENCH_CUDA_PREFILL_ONCE=$r timeout 60 ncu --clock-control none -k regex:"$K" --launch-skip 4 --launch-count 8 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    .gpubin/$v/bench_cuda > $R/ncu_dur_${v}_$r.txt 2>&1
  echo "ncu dur $v $r rc=$? $(( $(date +%s) - t0 ))s: $(grep -E '^  [a-zA-Z_]|gpu__time_duration' $R/ncu_dur_${v}_$r.txt | awk '/gpu__time_duration/{printf "%s ", $NF; next}{n=$1; sub(/[<(].*/, "", n); printf "%s=", n}' | cut -c1-300)"
done; done
tar czf $OUT/r48.tgz -C /tmp r48
for round in 1 2; do for v in g48 c0 c1 c2 c3; do
  f=$R/pre_${v}_$round.txt; BENCH_CUDA_DIST=1 BENCH_CUDA_PREFILL_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM|again" $f | grep -v FMA_ONLY | sed -E 's/ = [0-9]+ (TFLOP|tokens)\/s//; s/ x cuBLAS F16//; s/\(inexact floor\)//; s/  +/ /g' | paste -sd'|' | cut -c1-300) $(( $(date +%s) - t0 ))s"
  grep -E "^    \[" $f | head -5 | sed 's/^/  /'
done; done
tar czf $OUT/r48.tgz -C /tmp r48
best=$(for v in c0 c1 c2 c3; do echo "$v $(cat $R/ncu_dur_${v}_1.txt $R/ncu_dur_${v}_bf16.txt | awk '/gate_block/{g=1; next} /^  [a-zA-Z_]/{g=0} g && /gpu__time_duration/{s+=$NF} END{print s}')"; done | sort -k2 -g | head -1 | cut -d' ' -f1)
echo "== test_cuda ($best, the fastest gate under ncu) $(( $(date +%s) - t0 ))s"
timeout 330 .gpubin/$best/test_cuda > $R/test_cuda_$best.txt 2>&1; echo "test_cuda ($best) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_cuda_$best.txt
tar czf $OUT/r48.tgz -C /tmp r48
