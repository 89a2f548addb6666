#!/bin/sh
# summarize.sh RUNDIR/out/rNN: the figures of a sitting's raw files, as its run script printed them
# (ncu per-kernel durations in us; prefill rows in ms; decode rows apply/floor at each B).
d=$1
for f in "$d"/ncu_dur_*.txt; do [ -f "$f" ] || continue
  echo "$(basename "$f" .txt): $(grep -E '^  [a-zA-Z_]|gpu__time_duration' "$f" | awk '/gpu__time_duration/{printf "%s ", $NF; next}{n=$1; if (n == "void") n=$2; sub(/[<(].*/, "", n); printf "%s=", n}')"
done
for f in "$d"/pre_*.txt; do [ -f "$f" ] || continue
  echo "$(basename "$f" .txt): $(grep -E "engram (projection|apply)|cuBLAS F16 GEMM|again" "$f" | grep -v FMA_ONLY | sed -E 's/ = [0-9]+ (TFLOP|tokens)\/s//; s/ x cuBLAS F16//; s/\(inexact floor\)//; s/promoted wgmma//; s/project \+ gate//; s/  +/ /g' | paste -sd'|')"
done
for f in "$d"/dec_*.txt; do [ -f "$f" ] || continue
  echo "$(basename "$f" .txt): $(grep -E -A14 "^   B " "$f" | awk 'NR>1{printf "%s:%s ", $1, $3}')"
  grep -E "^   1 \(" "$f" | sed 's/^/    /' | cut -c1-140
done
