#!/bin/sh
# issue #25, sitting 54 (session m): the prefill apply against cuBLAS at the same power.  Run 53 found the card at
# its power cap under load, the apply's slow reps its GEMM at a lower clock, and cuBLAS 0.972 ms in a loop against
# 0.846 in the timed rows.  BENCH_CUDA_PAIRED=4 times batches of 10 F32 applies and 10 cuBLAS GEMMs in turn for 4 s
# (both at the clock of the moment), with nvidia-smi sampling beside.  l52 = main at the commit adding
# BENCH_CUDA_PAIRED, built plainly as run52.sh says.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r54; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $R/smi.csv 2> $R/smi.err &
p=$!
for i in 1 2; do
  BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 100 .gpubin/l52/bench_cuda > $R/paired_$i.txt 2>&1; echo "bench $i rc=$?"
  grep -E "cuBLAS F16 GEMM|engram apply \(|apply, BF16|traffic|paired" $R/paired_$i.txt
done
kill $p
echo "SM clock (MHz) samples:"; awk -F', ' 'NR>1{print $2}' $R/smi.csv | sort | uniq -c | sort -rn | head -6
echo "event reasons:"; awk -F', ' 'NR>1{print $6}' $R/smi.csv | sort | uniq -c | sort -rn | head -4
tar czf $OUT/r54.tgz -C /tmp r54
