#!/bin/sh
# issue #25, sitting 11: why the cp.async ring lost (run 10): carveout variants (cv, cvm1: -DMMV_CARVEOUT=100), U=3 S=2;
# the cluster gate with fewer registers (g3, g4: a73ca03 + -DGATE_MINB=3/4); ncu occupancy and stalls
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r11; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do for v in v0 g3 g4 b cv cvm1 u3s2; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== ncu $(( $(date +%s) - t0 ))s"
for vb in v0:64:gate_kernel g4:64:gate_kernel b:16:mmv_staged cv:16:mmv_staged; do v=${vb%%:*}; k=${vb##*:}; nb=${vb#*:}; nb=${nb%%:*}
  BENCH_CUDA_DECODE_ONCE=$nb timeout 90 ncu --clock-control none -k regex:$k --launch-skip 1 --launch-count 1 --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active .gpubin/$v/bench_cuda > $R/ncu_${v}_$nb.txt 2>&1
  echo "ncu $v B=$nb rc=$? $(( $(date +%s) - t0 ))s"; grep -E "mmv_|duration|Block Limit|Achieved Occ|Theoretical Occ|Stall|dram__|warps_active|Shared Memory Configuration|Dynamic Shared|Driver Shared" $R/ncu_${v}_$nb.txt | head -30
done
tar czf $OUT/r11.tgz -C /tmp r11
