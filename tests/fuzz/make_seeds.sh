#!/bin/sh
# make_seeds.sh OUTDIR ENGRAM - seed corpus for fuzz_model: headers of small
# valid models (v2 and v3, with and without projection weights); the harness
# supplies the zero tables.
set -eu
out=$1; engram=$2
mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
i=0
for args in "--gguf-version 3" "--gguf-version 2" "--width 4"; do
    # shellcheck disable=SC2086
    "$engram" build "$tmp/m.gguf" --base 2 --vocab 40 --compressed-vocab 30 --fill zero $args >/dev/null
    head -c 4096 "$tmp/m.gguf" > "$out/seed$i"   # the header; tables come from the harness
    i=$((i + 1))
done
