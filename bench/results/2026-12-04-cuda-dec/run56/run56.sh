#!/bin/sh
# issue #25, sitting 56 (session n): the closing figures on an H200 (run 55 ran on an H100).  l55 = main at
# 1bbbde9 built plainly (bench_cuda, bench_ds4).  The whole bench twice, the paired prefill ratio (apply and cuBLAS
# in turn at the same power) twice with nvidia-smi beside, and engram's layer beside ds4's route once.
# RUN names the output (r56 by default; run 57 was `RUN=r57 sh run56/run56.sh`, asking for an H200 again).
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
RUN=${RUN:-r56}
R=/tmp/$RUN; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
for i in 1 2; do
  f=$R/bench_$i.txt; timeout 90 .gpubin/l55/bench_cuda > $f 2>&1
  echo "bench $i rc=$? $(( $(date +%s) - t0 ))s"; grep -E "copy|only reads|^ +1 |^ +8 |^ +64 |engram (projection|apply)|cuBLAS F16 GEMM|traffic" $f | grep -v FMA_ONLY | cut -c1-160
done
tar czf $OUT/$RUN.tgz -C /tmp $RUN
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $R/smi.csv 2> $R/smi.err &
p=$!
for i in 1 2; do
  BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 100 .gpubin/l55/bench_cuda > $R/paired_$i.txt 2>&1; echo "paired $i rc=$?"
  grep -E "paired" $R/paired_$i.txt
done
kill $p
echo "SM clock (MHz) samples:"; awk -F', ' 'NR>1{print $2}' $R/smi.csv | sort | uniq -c | sort -rn | head -4
echo "event reasons:"; awk -F', ' 'NR>1{print $6}' $R/smi.csv | sort | uniq -c | sort -rn | head -3
tar czf $OUT/$RUN.tgz -C /tmp $RUN
timeout 240 .gpubin/l55/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "bench_ds4 rc=$? $(( $(date +%s) - t0 ))s"
sed -n '/^summary/,$p' $R/bench_ds4.txt
tar czf $OUT/$RUN.tgz -C /tmp $RUN
