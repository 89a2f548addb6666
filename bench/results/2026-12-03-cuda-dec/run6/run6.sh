#!/bin/sh
# issue #25, sitting 6: the decode projection with the tokens' operands staged in shared memory
# (.gpubin/b: the staged kernel, 8 warps, 1 block an SM; v0: -DMMV_STAGE_NT=99, the kernel before;
#  v2: -DMMV_SWARPS=4 -DMMV_SMIN_BLOCKS=2; v3: -DMMV_SMIN_BLOCKS=2)
set -u
B=.gpubin/b
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv; } > $OUT/machine.txt 2>&1
t0=$(date +%s)
echo "== test_cuda (v1 = default: 8 warps, 1 block/SM)"; timeout 200 $B/test_cuda > $OUT/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $OUT/test_cuda.txt | head -5; tail -1 $OUT/test_cuda.txt
for v in v0 b v2 v3 v0 b v3; do
  d=.gpubin/$v; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $OUT/dec_$v.$(date +%s).txt 2>&1
  echo "== decode $v rc=$? $(( $(date +%s) - t0 ))s"; ls -t $OUT/dec_$v.* | head -1 | xargs grep -E -A11 "^   B " | awk '{print $1, $3, $5}' | tr '\n' ' '; echo
done
echo "== test_cuda v3"; timeout 200 .gpubin/v3/test_cuda > $OUT/test_cuda_v3.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $OUT/test_cuda_v3.txt | head -5; tail -1 $OUT/test_cuda_v3.txt
echo "== ncu"; for v in v0 v3; do for nb in 1 64; do
  BENCH_CUDA_DECODE_ONCE=$nb timeout 90 ncu --clock-control none -k regex:mmv --launch-count 2 --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active .gpubin/$v/bench_cuda > $OUT/ncu_${v}_$nb.txt 2>&1
  echo "ncu $v B=$nb rc=$? $(( $(date +%s) - t0 ))s"; grep -E "mmv|duration|bytes|sectors|rate|warps_active" $OUT/ncu_${v}_$nb.txt | tail -14
done; done
