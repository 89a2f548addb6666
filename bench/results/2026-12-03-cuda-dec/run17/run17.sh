#!/bin/sh
# issue #25, sitting 17: mmw with several blocks a wait (MMW_R); the W=5128 chunk-16 difference of run 16.
# m: default; b0: -DMMW_MIN_NT=99 (mmv_staged as before); m1: mmw for every n; b3: 3 CTAs an SM, 4 stages.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r17; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
S=$R/summary.txt
echo "== decode rows, apply/floor and projection/floor per B" >> $S
for round in 1 2; do for v in b0 m m1 b3; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')" >> $S
done; done
echo "== bits $(( $(date +%s) - t0 ))s" >> $S
M=/tmp/m; mkdir -p $M
ap() { timeout 60 .gpubin/$1/engram apply $M/w$2.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$3.out --device cuda --chunk $4 > $M/$3.log 2>&1 || { echo "apply $1 rc=$?" >> $S; tail -2 $M/$3.log >> $S; }; }
cm() { n=$(cmp -l $M/$1.out $M/$2.out 2>/dev/null | wc -l); f=$(cmp $M/$1.out $M/$2.out 2>/dev/null | awk '{print $5}' | tr -d ,); echo "  $1 vs $2: $n bytes differ, first at byte ${f:-none}" >> $S; }
for w in 5128 5120; do .gpubin/m/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null 2>&1 || echo "build $w failed" >> $S; done
echo "W=5128 chunk 16 (82048 bytes a token):" >> $S
ap b0 5128 b0a 16; ap b0 5128 b0b 16; ap m 5128 ma 16; ap m 5128 mb 16; ap m1 5128 m1a 16
cm b0a b0b; cm ma mb; cm b0a ma; cm b0b mb; cm ma m1a
echo "W=5128 chunk 12, 24; W=5120 chunk 16:" >> $S
ap b0 5128 b0a 12; ap m 5128 ma 12; cm b0a ma
ap b0 5128 b0a 24; ap m 5128 ma 24; cm b0a ma
ap b0 5120 b0a 16; ap m 5120 ma 16; cm b0a ma
echo "== test_cuda (m) $(( $(date +%s) - t0 ))s" >> $S
timeout 200 .gpubin/m/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s" >> $S
grep -E "FAIL|failed|: NO|batch-invariant|calls of" $R/test_cuda.txt | head -14 >> $S; tail -1 $R/test_cuda.txt >> $S
echo "end $(( $(date +%s) - t0 ))s" >> $S
tar czf $OUT/r17.tgz -C /tmp r17
cat $S
