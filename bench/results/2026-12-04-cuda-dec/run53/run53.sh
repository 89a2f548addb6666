#!/bin/sh
# issue #25, sitting 53 (session m): where do the prefill apply's slow reps lose 0.09-0.13 ms?
# l52 = main at 1da2754 built plainly, as run52.sh says (the kernels of d025ecf); s53 = the same code built with NVDEFS=-DENGRAM_CUDA_STAMPS (the
# prefill's kernels stamp %globaltimer at block 0's start and every warp's end; bench_cuda's BENCH_CUDA_STAMPS=R
# prints, per call, each kernel's start and time).  Part 1 is run52.sh (nvidia-smi's clocks and power every 20 ms
# beside BENCH_CUDA_LOOP); part 2 the stamps, with nvidia-smi sampling again.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r53; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi -q -d CLOCK,POWER | head -60; } > $R/machine.txt 2>&1; head -3 $R/machine.txt
smi() { # $1: output file; the sampler's pid on stdout
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $1 2> $1.err &
  p=$!; sleep 1
  if ! kill -0 $p 2>/dev/null; then
    Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
    nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $1 2>> $1.err &
    p=$!
  fi
  echo $p
}
p=$(smi $R/smi.csv)
echo "smi start $(date +%s.%N)" > $R/wall.txt
BENCH_CUDA_LOOP=3 BENCH_CUDA_PREFILL_ONLY=1 timeout 120 .gpubin/l52/bench_cuda > $R/loop.txt 2>&1; echo "bench rc=$?"
echo "smi end $(date +%s.%N)" >> $R/wall.txt
kill $p
grep -E "cuBLAS F16|projection|apply|traffic" $R/loop.txt | head -9
for w in "apply F32" projection "cuBLAS GEMM"; do
  echo "$w: $(grep "loop $w" $R/loop.txt | awk '{print $(NF-5)}' | sort -g | awk '{a[NR]=$1} END{print NR " batches, min " a[1] " median " a[int((NR+1)/2)] " max " a[NR] " ms a call"}')"
done
echo "SM clock (MHz) samples:"; awk -F', ' 'NR>1{print $2}' $R/smi.csv | sort | uniq -c | sort -rn | head -6
echo "event reasons:"; awk -F', ' 'NR>1{print $6}' $R/smi.csv | sort | uniq -c | sort -rn | head -6
p=$(smi $R/smi2.csv)
BENCH_CUDA_STAMPS=48 BENCH_CUDA_PREFILL_ONLY=1 timeout 120 .gpubin/s53/bench_cuda > $R/stamps.txt 2>&1; echo "stamps rc=$?"
kill $p
grep -E "cuBLAS F16|projection|apply" $R/stamps.txt | head -6
for w in "apply F32 " "apply F32 idle" "projection" "apply BF16"; do
  echo "== $w: sorted by event time (us): ev, then each kernel's start offset and time"
  grep "^stamp $w *[0-9]" $R/stamps.txt | awk '{for(i=1;i<=NF;i++) if($i=="ev"){print $(i+1), $0; break}}' | sort -g | awk 'NR%6==1' | cut -d' ' -f2- | cut -c1-230
done
tar czf $OUT/r53.tgz -C /tmp r53
# part 3: the prefill gate's variants under ncu (kernels alone), F32 and BF16 residual (g1..g7: main with
# run53/gate_knobs.diff applied, built with NVDEFS="-DGATEB_PF=132" (g1), "-DGATEB_PF=264" (g2), "-DGATEB_NOKEEP"
# (g3), "-DGATEB_NOKEEP -DGATEB_PF=264" (g4), "-DGATEB_NOKEEP -DGATEB_MINB=3" (g5), g5's + "-DGATEB_PF=396" (g6),
# "-DGATEB_NOKEEP -DGATEB_MINB=4" (g7), each copied to .gpubin/gN; carry .gpubin): l52 = main; g1/g2 = the
# lines of token t + 132 / 264 asked into L2 by token t's block (GATEB_PF); g3 = x and v loaded again for the
# update (GATEB_NOKEEP); g4 = g3 + PF 264; g5 = g3 with three blocks an SM (GATEB_MINB=3, no spills); g6 = g5 + PF
# 396; g7 = g3 with four blocks an SM
t0=$(date +%s)
for v in l52 g1 g2 g3 g4 g5 g6 g7; do for r in 1 bf16; do
  [ $(( $(date +%s) - t0 )) -gt ${GATE_BUDGET:-170} ] && { echo "out of time at $v $r"; break 2; }
  BENCH_CUDA_PREFILL_ONCE=$r timeout 60 ncu --clock-control none -k regex:gate_block --launch-skip 1 --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__occupancy_limit_registers \
    .gpubin/$v/bench_cuda > $R/ncu_gate_${v}_$r.txt 2>&1
  echo "gate $v $r rc=$? $(( $(date +%s) - t0 ))s: $(grep -E 'gpu__time_duration|dram__throughput|occupancy_limit' $R/ncu_gate_${v}_$r.txt | awk '{printf "%s ", $NF}')"
done; done
tar czf $OUT/r53.tgz -C /tmp r53
