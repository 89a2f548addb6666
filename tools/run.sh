#!/bin/sh
# run.sh - `make run`: the project's main job, `engram run`, on the embedded
# default: the demo model (a scaled V4.1 layout: V' = 99092 and V4.1's real
# multipliers, primes from base 16000 = 1/1000 of V4.1's, rows quantized from
# normal-like values, 64-wide projection weights), which engram run writes
# next to the binary the first time (again whenever the binary is newer),
# and the bundled real-text token stream (the GPL-3 text, compiled in).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
if [ -f "$B/demo.gguf" ] && [ "$B/engram" -nt "$B/demo.gguf" ]; then
    rm -f "$B/demo.gguf"
fi
exec "$B/engram" run
