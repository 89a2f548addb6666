#!/bin/sh
# issue #25, sitting 7: staged operands with a rolling weight stream; rolling B = 1 variants
# (b: rolling, 8 warps, 1 block an SM; r2: -DMMV_SMIN_BLOCKS=2; r3: -DMMV_SWARPS=4 -DMMV_SMIN_BLOCKS=4;
#  r4: -DMMV_ROLL=1 -DMMV_SMIN_BLOCKS=2; r5: -DMMV_ROLL=1 -DMMV_UNROLL=8 -DMMV_SMIN_BLOCKS=2;
#  r6: -DMMV_ROLL=1 -DMMV_MIN_BLOCKS=3 -DMMV_SMIN_BLOCKS=2; v0, v3: sitting 6's binaries.
#  The rolling code: rolling.diff, on top of the staged kernel of sitting 6.)
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r7; mkdir -p $R
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do for v in v0 b r2 r3 v3 r4 r5 r6; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A10 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== test_cuda (b)"; timeout 200 $B/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
echo "== ncu"; for v in b r2; do
  BENCH_CUDA_DECODE_ONCE=64 timeout 90 ncu --clock-control none -k regex:mmv_staged --launch-count 1 --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed .gpubin/$v/bench_cuda > $R/ncu_${v}_64.txt 2>&1
  echo "ncu $v B=64 rc=$?"; grep -E "duration|bytes|sectors|active|inst|throughput" $R/ncu_${v}_64.txt | tail -8
done
tar czf $OUT/r7.tgz -C /tmp r7
