#!/bin/sh
# issue #25, sitting 29: wsd_kernel decoding the rows itself (no decode16_kernel before it): f64 for every
# decode n, f8 up to 8 tokens (decode16 + wsd above), against n (run 28's: decode16 flags + wsd).
# Decode rows alternating, two rounds; test_cuda and test_apply.sh (cuda) on f64; engram apply bytes, n's
# plugin against f64's
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r29; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2; do for v in n f64 f8; do
  f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 .gpubin/$v/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}') $(( $(date +%s) - t0 ))s"
done; done
echo "== test_cuda (f64) $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/f64/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"
grep -E "FAIL" $R/test_cuda.txt | head -10; tail -1 $R/test_cuda.txt
mkdir -p /tmp/b && cp .gpubin/f64/engram .gpubin/f64/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 150 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda, f64) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bits: engram apply --device cuda, n's plugin against f64's $(( $(date +%s) - t0 ))s"
mkdir -p /tmp/old /tmp/new; cp .gpubin/f64/engram /tmp/old/; cp .gpubin/f64/engram /tmp/new/
cp .gpubin/n/engram-cuda.so /tmp/old/; cp .gpubin/f64/engram-cuda.so /tmp/new/
M=/tmp/m; mkdir -p $M
for w in 5120; do /tmp/new/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null || echo "build $w failed"
  for ch in 1 5 33 64; do for bf in "" --residual-bf16; do
    for v in old new; do /tmp/$v/engram apply $M/w$w.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$v.out --kv-out $M/$v.kv --device cuda --chunk $ch $bf > $M/$v.log 2>&1 || { echo "apply $v rc=$?"; tail -2 $M/$v.log; }; done
    if cmp -s $M/old.out $M/new.out && cmp -s $M/old.kv $M/new.kv; then r=same; else r=DIFFER; fi
    echo "W=$w chunk=$ch ${bf:-f32}: $r ($(stat -c %s $M/new.out) + $(stat -c %s $M/new.kv) bytes)"
  done; done
done 2>&1 | tee $R/bits.txt
echo "end $(( $(date +%s) - t0 ))s"
tar czf $OUT/r29.tgz -C /tmp r29
