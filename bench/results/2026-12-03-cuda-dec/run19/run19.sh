#!/bin/sh
# issue #25, sitting 19: is HEAD's decode apply deterministic? (run 16: HEAD's path differed once from
# two other builds at W=5128 chunk 16; run 17 did not reproduce it). h: HEAD (ab33d95) engram + plugin.
set -u
lib=$(dirname "$(find / -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="${lib}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
R=/tmp/r19; mkdir -p $R
{ date -u; nvidia-smi -L; } > $R/machine.txt 2>&1
t0=$(date +%s)
S=$R/summary.txt
M=/tmp/m; mkdir -p $M
for w in 5128 5120; do .gpubin/h/engram build $M/w$w.gguf --base 5000 --width $w --fill normal --seed 6 > /dev/null 2>&1 || echo "build $w failed" >> $S; done
ap() { timeout 60 .gpubin/h/engram apply $M/w$1.gguf --layer 1 --tokens data/gpl3.tok --residual-in seed:7 \
        --residual-out $M/$3.out --device cuda --chunk $2 > $M/$3.log 2>&1 || { echo "apply rc=$?" >> $S; tail -2 $M/$3.log >> $S; }; }
for x in "5128 16 6" "5120 16 4" "5128 9 3" "5128 33 3" "5128 64 3"; do set -- $x
  ap $1 $2 ref; r=""
  i=1; while [ $i -lt $3 ]; do ap $1 $2 again
    n=$(cmp -l $M/ref.out $M/again.out 2>/dev/null | wc -l)
    if [ "$n" = 0 ]; then r="$r same"; else f=$(cmp $M/ref.out $M/again.out | awk '{print $5}' | tr -d ,); r="$r DIFFER($n bytes, first at byte $f)"; cp $M/again.out $M/diff_$1_$2_$i.out; fi
    i=$((i+1)); done
  echo "W=$1 chunk=$2: $r ($(( $(date +%s) - t0 ))s)" >> $S
done
echo "end $(( $(date +%s) - t0 ))s" >> $S
tar czf $OUT/r19.tgz -C /tmp r19
cat $S
