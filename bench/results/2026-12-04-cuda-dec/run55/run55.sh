#!/bin/sh
# issue #25, sitting 55 (session n).  l55 = main at 99495b5 + the WS_PROM knob (no change to any default),
# built plainly (make BUILD=... WERROR=1 .../cuda/bench_cuda, static liburing/jansson/utf8proc); gvP = gemm_variants
# (the header's nvcc line) with -DWS_PROM=P, P = 4 (main), 6, 8, 12 k-tiles of 64 between promotions.
# Part 1: run 54 (the apply and cuBLAS in turn at the same power, BENCH_CUDA_PAIRED=4, nvidia-smi beside).
# Part 2: ncu --set full of one prefill apply's ws_gemm_kernel and gate_block_kernel, of cuBLAS's GEMM on the same
# shape, and of a one-token decode's wsd_kernel and gate_kernel: DRAM and L2 bytes, pipes, stalls.
# Part 3: the promotion interval: gemm_variants for P = 4, 6, 8, 12 (time and accuracy), twice, alternating.
# Part 4: p8 = l55 built with NVDEFS=-DWS_PROM=8 (bench_cuda, test_cuda, engram, engram-cuda.so): the whole bench
# alternating with l55, twice; then p8's test_cuda and test_apply.sh (cuda), as far as the call's time goes.
set -u
t0=$(date +%s)
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="$PATH:/usr/local/cuda/bin"
R=/tmp/r55; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1; cat $R/machine.txt
Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv -lms 20 > $R/smi.csv 2> $R/smi.err &
p=$!
for i in 1 2; do
  BENCH_CUDA_PAIRED=4 BENCH_CUDA_PREFILL_ONLY=1 timeout 100 .gpubin/l55/bench_cuda > $R/paired_$i.txt 2>&1; echo "bench $i rc=$?"
  grep -E "cuBLAS F16 GEMM|engram apply \(|apply, BF16|traffic|paired" $R/paired_$i.txt
done
kill $p
echo "SM clock (MHz) samples:"; awk -F', ' 'NR>1{print $2}' $R/smi.csv | sort | uniq -c | sort -rn | head -6
echo "event reasons:"; awk -F', ' 'NR>1{print $6}' $R/smi.csv | sort | uniq -c | sort -rn | head -4
B=.gpubin/l55/bench_cuda
NC="ncu --clock-control none --set full"
( BENCH_CUDA_PREFILL_ONCE=1 timeout 150 $NC -k regex:'ws_gemm|gate_block' --launch-skip 2 --launch-count 2 $B > $R/ncu_prefill.txt 2>&1; echo "ncu prefill rc=$?" ) 
( BENCH_CUDA_GEMM_ONCE=2048 timeout 150 $NC -k regex:'nvjet|xmma|cutlass|gemm|Kernel' --launch-skip 1 --launch-count 1 $B > $R/ncu_cublas.txt 2>&1; echo "ncu cublas rc=$?" )
( BENCH_CUDA_DECODE_ONCE=1 timeout 150 $NC -k regex:'wsd_kernel|gate_kernel|decode16' --launch-skip 3 --launch-count 3 $B > $R/ncu_decode.txt 2>&1; echo "ncu decode rc=$?" )
for f in prefill cublas decode; do
  echo "== $f"; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate |Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Elapsed Cycles|SM Frequency" $R/ncu_$f.txt | head -40
done
for r in 1 2; do for v in 4 6 8 12; do
  timeout 60 .gpubin/gv$v/gemm_variants > $R/gv${v}_$r.txt 2>&1; echo "gv$v round $r rc=$?"; grep -iE "ws |cublas|2048" $R/gv${v}_$r.txt | head -6
done; done
tar czf $OUT/r55.tgz -C /tmp r55
for round in 1 2; do for v in l55 p8; do
  f=$R/bench_${v}_$round.txt; timeout 90 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^ +1 |^ +8 |^ +64 |engram (projection|apply)|cuBLAS F16 GEMM" $f | grep -v FMA_ONLY | cut -c1-150
done; done
tar czf $OUT/r55.tgz -C /tmp r55
echo "== test_cuda (p8) $(( $(date +%s) - t0 ))s"; timeout 240 .gpubin/p8/test_cuda > $R/test_cuda_p8.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL|NO$|DIFFER" $R/test_cuda_p8.txt | head -10; tail -1 $R/test_cuda_p8.txt
tar czf $OUT/r55.tgz -C /tmp r55
mkdir -p /tmp/b && cp .gpubin/p8/engram .gpubin/p8/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda_p8.txt" 2>&1
echo "test_apply.sh (cuda, p8) rc=$? $(( $(date +%s) - t0 ))s"; tail -3 $R/test_apply_cuda_p8.txt
tar czf $OUT/r55.tgz -C /tmp r55
