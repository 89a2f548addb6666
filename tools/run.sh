#!/bin/sh
# run.sh - `make run`: the main job on the embedded default.  For now: build
# a small demo model (V4.1 multipliers, primes from base 50000, random rows),
# print its info, hash the bundled real-text token stream and summarize it,
# decode the rows of its first token and verify the tables.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
M="$B/demo.gguf"
if [ ! -f "$M" ]; then
    "$B/engram" build "$M" --base 50000 --width 64 --fill random --seed 1
fi
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
