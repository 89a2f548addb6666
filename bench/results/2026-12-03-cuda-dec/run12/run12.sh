#!/bin/sh
# issue #25, sitting 12: the decode gate's PRE kernel (gate_kernel<true>: 72 registers, 3 blocks an SM)
# b: the new build; v0: a73ca03 (the gate at 128 registers); gp4: b with -DGATE_PRE_MINB=4 (64 registers)
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r12; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
for round in 1 2 3; do for v in v0 b gp4; do
  d=.gpubin/$v; f=$R/dec_${v}_$round.txt; BENCH_CUDA_DECODE_ONLY=1 timeout 60 $d/bench_cuda > $f 2>&1
  echo "$v.$round rc=$? $(grep -E -A14 "^   B " $f | awk 'NR>1{printf "%s:%s/%s ", $1, $3, $5}')"
done; done
echo "== bits: engram apply --device cuda, the old gate's plugin against the new one $(( $(date +%s) - t0 ))s"
mkdir -p /tmp/old /tmp/new; cp .gpubin/b/engram /tmp/old/; cp .gpubin/b/engram /tmp/new/
cp .gpubin/v0/engram-cuda.so /tmp/old/; cp .gpubin/b/engram-cuda.so /tmp/new/
M=/tmp/m; mkdir -p $M
for w in 5120 6400; do /tmp/new/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null || echo "build $w failed"
  for ch in 1 8 33 64; do for bf in "" --residual-bf16; do
    for v in old new; do /tmp/$v/engram apply $M/w$w.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$v.out --device cuda --chunk $ch $bf > $M/$v.log 2>&1 || { echo "apply $v rc=$?"; tail -2 $M/$v.log; }; done
    if cmp -s $M/old.out $M/new.out; then r=same; else r=DIFFER; fi
    echo "W=$w chunk=$ch ${bf:-f32}: $r ($(stat -c %s $M/new.out) bytes)"
  done; done
done
echo "== test_cuda $(( $(date +%s) - t0 ))s"; timeout 300 .gpubin/b/test_cuda > $R/test_cuda.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; grep -E "FAIL" $R/test_cuda.txt | head -5; tail -1 $R/test_cuda.txt
mkdir -p /tmp/b && cp .gpubin/b/engram .gpubin/b/engram-cuda.so /tmp/b/
ENGRAM_DEVICE=cuda PY=python3 timeout 120 sh tests/test_apply.sh /tmp/b > "$R/test_apply_cuda.txt" 2>&1
echo "test_apply.sh (cuda) rc=$? $(( $(date +%s) - t0 ))s"; tail -1 $R/test_apply_cuda.txt
echo "== bench_ds4"; timeout 110 .gpubin/b/bench_ds4 > $R/bench_ds4.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s"; tail -11 $R/bench_ds4.txt | cut -c1-70
tar czf $OUT/r12.tgz -C /tmp r12
