#!/bin/sh
# issue #25, sitting 14: the prefill GEMM with two partial sums a consumer (WS_DBUF=2: the promotion
# of every other group under the next group's first wgmma), BN 128, against BN 192 (the default)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=$OUT
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
echo "== gemm_variants (BN_STAGES_DBUF), two rounds"
for round in 1 2; do for v in 192_5_0 128_5_0 128_5_2 128_6_2 128_7_2; do
  f=$R/gv_${v}_$round.txt; timeout 60 .gpubin/gv/gv_$v > $f 2>&1
  echo "$v.$round rc=$? $(grep -o 'n= *[0-9]* N= *[0-9]*: cuBLAS [0-9.]* ms ([0-9]* TF/s)  ws [0-9.]* ms ([0-9]* TF/s) = [0-9.]*x' $f | sed 's/  */ /g' | tr '\n' ';')"
done; done
grep -h -o 'n= *[0-9]* N= *[0-9]*.*bits [0-9a-f]*' $R/gv_*_1.txt | sed 's/|.*bits/ bits/' | sort | uniq -c
echo "== bench_cuda: b (BN 192), d5, d6 (BN 128, two partials, 5 / 6 stages) $(( $(date +%s) - t0 ))s"
for round in 1 2; do for v in b d5 d6; do
  f=$R/bench_${v}_$round.txt; timeout 90 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E 'cuBLAS F16 GEMM|projection \(|apply \(|BF16 residual' $f | sed 's/  */ /g' | tr '\n' ';')"
done; done
echo "== ncu: one prefill apply's kernels (b, d6) $(( $(date +%s) - t0 ))s"
for v in b d6; do BENCH_CUDA_PREFILL_ONCE=1 timeout 90 ncu --clock-control none --launch-skip 4 --launch-count 8 --section SpeedOfLight .gpubin/$v/bench_cuda > $R/ncu_$v.txt 2>&1
  echo "$v rc=$?"; grep -E '^  [a-z_].*\(|Duration|DRAM Throughput|Compute \(SM\)' $R/ncu_$v.txt | head -40; done
echo "== bits: engram apply --device cuda, prefill chunks, b against d5 and d6 $(( $(date +%s) - t0 ))s"
M=/tmp/m; mkdir -p $M
.gpubin/b/engram build $M/w.gguf --base 5000 --width 5120 --fill normal --seed 6 > /dev/null || echo "build failed"
for ch in 65 300 2048; do for bf in "" --residual-bf16; do
  for v in b d5 d6; do .gpubin/$v/engram apply $M/w.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
      --residual-out $M/$v.out --device cuda --chunk $ch $bf > $M/$v.log 2>&1 || { echo "apply $v rc=$?"; tail -2 $M/$v.log; }; done
  for v in d5 d6; do if cmp -s $M/b.out $M/$v.out; then r=same; else r=DIFFER; fi; echo "chunk=$ch ${bf:-f32} $v: $r ($(stat -c %s $M/$v.out) bytes)"; done
done; done
echo "== test_cuda on d5 and d6 (together) $(( $(date +%s) - t0 ))s"
timeout 280 .gpubin/d5/test_cuda > $R/test_cuda_d5.txt 2>&1 & p5=$!
timeout 280 .gpubin/d6/test_cuda > $R/test_cuda_d6.txt 2>&1; echo "d6 rc=$?"; wait $p5; echo "d5 rc=$?"
for v in d5 d6; do grep -E "FAIL" $R/test_cuda_$v.txt | head -5; tail -1 $R/test_cuda_$v.txt; done
echo "end $(( $(date +%s) - t0 ))s"
