#!/bin/sh
# issue #25, sitting 16: the decode projection through TMA + wgmma (mmw.cuh) for 9-64 tokens.
# m: the default build (mmw from 2 n-tiles); b0: the same tree with -DMMW_MIN_NT=99 (mmv_staged as before);
# m1: mmw for every n (1 n-tile too); c4: clusters of 4; s12: one CTA an SM, 12 stages.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r16; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
S=$R/summary.txt
echo "== test_cuda (m)" >> $S
timeout 200 .gpubin/m/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s" >> $S
grep -E "FAIL|NO|batch-invariant|calls of" $R/test_cuda.txt | head -12 >> $S; tail -1 $R/test_cuda.txt >> $S
echo "== bits: engram apply --device cuda, b0 (mmv) against m / m1 $(( $(date +%s) - t0 ))s" >> $S
M=/tmp/m; mkdir -p $M
for w in 5120 5128; do .gpubin/m/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null 2>&1 || echo "build $w failed" >> $S
  for ch in 1 8 9 16 33 64; do for bf in ""; do
    for v in b0 m m1; do timeout 60 .gpubin/$v/engram apply $M/w$w.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$v.out --device cuda --chunk $ch $bf > $M/$v.log 2>&1 || { echo "apply $v rc=$?" >> $S; tail -2 $M/$v.log >> $S; }; done
    r=""; for v in m m1; do if cmp -s $M/b0.out $M/$v.out; then r="$r $v:same"; else r="$r $v:DIFFER"; fi; done
    echo "W=$w chunk=$ch ${bf:-f32}:$r ($(stat -c %s $M/m.out) bytes)" >> $S
  done; done
done
echo "== decode rows, apply/floor and projection/floor per B $(( $(date +%s) - t0 ))s" >> $S
for round in 1 2; do for v in b0 m m1 c4 s12; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')" >> $S
done; done
echo "end $(( $(date +%s) - t0 ))s" >> $S
tar czf $OUT/r16.tgz -C /tmp r16
cat $S
