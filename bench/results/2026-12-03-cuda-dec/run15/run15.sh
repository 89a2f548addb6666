#!/bin/sh
# issue #25, sitting 15: gate.cuh's column test in one helper (gate_col_in): b2 against b (HEAD's);
# the PRE kernel's machine code changed (45,312 -> 43,520 bytes): same bits? same time? test_cuda;
# ncu of one prefill apply's kernels (where the prefill's time goes)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r15; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in b b2; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== bits: engram apply --device cuda, b against b2 $(( $(date +%s) - t0 ))s"
M=/tmp/m; mkdir -p $M
for w in 5120 6400; do .gpubin/b/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null || echo "build $w failed"
  for ch in 1 8 33 64 300; do for bf in "" --residual-bf16; do
    for v in b b2; do .gpubin/$v/engram apply $M/w$w.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$v.out --device cuda --chunk $ch $bf > $M/$v.log 2>&1 || { echo "apply $v rc=$?"; tail -2 $M/$v.log; }; done
    if cmp -s $M/b.out $M/b2.out; then r=same; else r=DIFFER; fi
    echo "W=$w chunk=$ch ${bf:-f32}: $r ($(stat -c %s $M/b2.out) bytes)"
  done; done
done
echo "== test_cuda (b2) $(( $(date +%s) - t0 ))s"; timeout 280 .gpubin/b2/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
echo "== ncu: the second of three prefill applies, its kernels (b2) $(( $(date +%s) - t0 ))s"
BENCH_CUDA_PREFILL_ONCE=1 timeout 120 ncu --clock-control none -k regex:'decode16|ws_gemm|gate|gemv|scale|prep' --launch-skip 3 --launch-count 3 --section SpeedOfLight .gpubin/b2/bench_cuda > $R/ncu_prefill.txt 2>&1
echo "rc=$?"; grep -E '^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\)' $R/ncu_prefill.txt | head -30
echo "end $(( $(date +%s) - t0 ))s"
tar czf $OUT/r15.tgz -C /tmp r15
