#!/bin/sh
# run.sh - `make run`: the main job on the embedded default.  For now: build
# the default demo model with `engram build` (scaled V4.1 layout: V4.1's
# V' = 99092 and its real multipliers, primes from base 16000 = 1/1000 of
# V4.1's, random rows, 64-wide projection weights), show its layout next to
# the full one, print its info, hash the bundled real-text token stream and
# summarize it, decode the rows of its first token and verify the tables.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
M="$B/demo.gguf"
# (rebuilt whenever the engram binary is newer than the model)
if [ ! -f "$M" ] || [ "$B/engram" -nt "$M" ]; then
    "$B/engram" build "$M" --base 16000 --width 64 --fill normal --seed 1
fi
echo "== engram layout --vocab-size 99092 --base 16000   (the demo; V4.1 itself uses --base 16000000)"
"$B/engram" layout --vocab-size 99092 --base 16000
echo
echo "== engram info $M"
"$B/engram" info "$M"
echo
echo "== engram hash $M --tokens data/gpl3.tok --summary   (GPL-3 text, DeepSeek V3 tokenizer)"
"$B/engram" hash "$M" --tokens data/gpl3.tok --summary
echo
echo "== rows of the first token (table 0, first 8 values of each of its 24 rows)"
rows=$(head -1 data/gpl3.tok | cut -d' ' -f1 | "$B/engram" hash "$M" --tokens - | cut -d' ' -f1-24)
# shellcheck disable=SC2086
"$B/engram" rows "$M" --table 0 $rows | cut -d' ' -f1-8
echo
echo "== engram verify $M"
"$B/engram" verify "$M"
echo
for L in 1 14; do
    echo "== engram apply $M --layer $L --tokens data/gpl3.tok --residual-in seed:1 --threads 2"
    "$B/engram" apply "$M" --layer "$L" --tokens data/gpl3.tok --residual-in seed:1 \
        --residual-out "$B/demo-residual-$L.f32" --threads 2
done
