#!/bin/sh
# issue #25, sitting 52 (prepared in session l, not run): is a slow prefill apply a slow clock?  The apply's
# kernels alone under ncu add up to ~1.09 ms on an H200, while most timed reps take 1.18-1.22 ms, also from a
# graph and back to back (run 51); the projection alone is steady.  l52 = main at the commit that added
# BENCH_CUDA_LOOP (built as the other runs: make BUILD=/tmp/bld-l52 WERROR=1 LDLIBS_CORE="-l:liburing.a -lpthread
# -lm" LDLIBS_TOOLS="-l:libjansson.a -l:libutf8proc.a" /tmp/bld-l52/cuda/bench_cuda, copied to .gpubin/l52).
# nvidia-smi samples the SM clock, power and the clock event reasons every 20 ms while bench_cuda runs the
# apply, the projection and cuBLAS's GEMM 3 s each back to back, printing each batch's time per call with the
# wall clock; lay the two side by side.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r52; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $R/smi.csv 2> $R/smi.err &
smi=$!
sleep 1
if ! kill -0 $smi 2>/dev/null; then # an older name of the last field
  Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
  nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $R/smi.csv 2>> $R/smi.err &
  smi=$!
fi
echo "smi start $(date +%s.%N)" > $R/wall.txt
BENCH_CUDA_LOOP=3 BENCH_CUDA_PREFILL_ONLY=1 timeout 120 .gpubin/l52/bench_cuda > $R/loop.txt 2>&1; echo "bench rc=$?"
echo "smi end $(date +%s.%N)" >> $R/wall.txt
kill $smi
for w in "apply F32" projection "cuBLAS GEMM"; do
  echo "$w: $(grep "loop $w" $R/loop.txt | awk '{print $(NF-5)}' | sort -g | awk '{a[NR]=$1} END{print NR " batches, min " a[1] " median " a[int((NR+1)/2)] " max " a[NR] " ms a call"}')"
done
awk -F', ' 'NR>1{print $2}' $R/smi.csv | sort | uniq -c | sort -rn | head -8
tar czf $OUT/r52.tgz -C /tmp r52
