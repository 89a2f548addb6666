#!/bin/sh
# test_shard_files.sh - `engram shard` end to end (issue #24, docs/shards.md)
# on the W = 64 demo: for N = 2, 3, 4 every shard is a valid GGUF per the
# independent parser (@huggingface/gguf, tests/gguf_shard_check.mjs), the
# tables' bytes add up to the model's, `engram rows` of sampled row ids
# (each block's first and last, random ones) from the owning shard prints
# what the model prints, ids outside the block are refused naming it;
# info (text, --json) and verify on shards; --check passes whole sets and
# refuses another model's shard, a different world, a rank twice, a rank
# missing, a non-shard, a shard whose first_row was edited (refused at
# open); the writer leaves nothing on a full disk or a read-only DIR.
# Usage: tests/test_shard_files.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ENGRAM="$BUILD/engram"
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
tmpdir shard
check() { # check DESCRIPTION COMMAND...
    d=$1; shift
    if "$@" >"$T/out" 2>"$T/err"; then ok; else bad "$d"; sed 's/^/    /' "$T/err" | head -5 >&2; fi
}

M="$T/M.gguf"
O="$T/O.gguf"
check "build the W = 64 demo" "$ENGRAM" build "$M" --base 20000 --width 64 --fill normal --seed 5
check "build another model" "$ENGRAM" build "$O" --base 20000 --width 64 --fill normal --seed 6
"$ENGRAM" info --json "$M" >"$T/whole.json"

for N in 2 3 4; do
    D="$T/s$N"
    check "shard N=$N" "$ENGRAM" shard "$M" --ranks $N --out "$D"
    [ "$(ls "$D" | wc -l)" -eq $N ] && ok || bad "N=$N: $(ls "$D" | wc -l) files, wanted $N"
    r=0
    while [ $r -lt $N ]; do
        S="$D/M.shard-$r-of-$N.gguf"
        check "N=$N rank $r: info --json" sh -c "'$ENGRAM' info --json '$S' > '$T/i$N.$r.json'"
        check "N=$N rank $r: independent GGUF parser" node tests/gguf_shard_check.mjs "$S" "$T/i$N.$r.json"
        expect_rc 0 "shard:           rank $r of $N" "N=$N rank $r: info text names the block" "$ENGRAM" info "$S"
        expect_rc 0 "shard rank $r of $N" "N=$N rank $r: verify" "$ENGRAM" verify "$S"
        expect_rc 0 "0 invalid" "N=$N rank $r: verify finds no bad row" "$ENGRAM" verify "$S"
        r=$((r + 1))
    done
    # the tables' bytes add up; sampled rows equal; ids outside refused
    "$PY" - "$T/whole.json" "$N" "$T" >"$T/plan$N" <<'PYEOF' || bad "N=$N: plan"
import json, random, sys
whole = json.load(open(sys.argv[1])); n = int(sys.argv[2]); T = sys.argv[3]
shards = [json.load(open(f"{T}/i{n}.{r}.json")) for r in range(n)]
for t in range(2):
    got = sum(s["tables"][t]["bytes"] for s in shards)
    if got != whole["tables"][t]["bytes"]:
        print(f"BAD table {t}: shards hold {got} bytes, the model {whole['tables'][t]['bytes']}")
rnd = random.Random(n)
for r, s in enumerate(shards):
    for t in range(2):
        lo = s["shard"]["first_row"][t]; hi = lo + s["shard"]["rows"][t]
        ids = [lo, hi - 1] + [rnd.randrange(lo, hi) for _ in range(6)]
        print("SAME", r, t, " ".join(map(str, ids)))
        if lo > 0: print("OUT", r, t, lo - 1, lo, hi)
        if hi < s["tables"][t]["rows"]: print("OUT", r, t, hi, lo, hi)
PYEOF
    if grep -q '^BAD' "$T/plan$N"; then bad "N=$N: $(grep '^BAD' "$T/plan$N")"; else ok; fi
    grep '^SAME' "$T/plan$N" | while read -r _ r t ids; do
        S="$D/M.shard-$r-of-$N.gguf"
        "$ENGRAM" rows "$M" --table $t $ids >"$T/a" 2>&1
        "$ENGRAM" rows "$S" --table $t $ids >"$T/b" 2>&1
        if cmp -s "$T/a" "$T/b" && [ -s "$T/a" ]; then echo ok; else echo "bad N=$N rank $r table $t rows $ids differ"; fi
    done >"$T/same$N"
    grep '^OUT' "$T/plan$N" | while read -r _ r t id lo hi; do
        S="$D/M.shard-$r-of-$N.gguf"
        "$ENGRAM" rows "$S" --table $t $id >"$T/a" 2>&1; rc=$?
        if [ $rc -eq 1 ] && grep -q "row $id of table $t is not in this shard's block \[$lo, $hi)" "$T/a"; then echo ok
        else echo "bad N=$N rank $r table $t row $id: rc $rc: $(head -1 "$T/a")"; fi
    done >>"$T/same$N"
    while read -r line; do
        if [ "$line" = ok ]; then ok; else bad "$line"; fi
    done <"$T/same$N"
    expect_rc 0 "ok: $N shards" "N=$N: --check passes the set" "$ENGRAM" shard --check "$D"/*.gguf
done

# --check refuses bad sets, naming why
D="$T/s3"
check "shard another model" "$ENGRAM" shard "$O" --ranks 3 --out "$T/o3"
expect_rc 1 "another model" "--check: a shard of another model" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$T/o3/O.shard-1-of-3.gguf" "$D/M.shard-2-of-3.gguf"
expect_rc 1 "world of" "--check: a different world" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$T/s2/M.shard-1-of-2.gguf" "$D/M.shard-2-of-3.gguf"
expect_rc 1 "both rank 1 of 3" "--check: a rank twice" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$D/M.shard-1-of-3.gguf" "$D/M.shard-1-of-3.gguf"
expect_rc 1 "rank 2 of 3 is missing" "--check: a rank missing" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$D/M.shard-1-of-3.gguf"
expect_rc 1 "is not a shard file" "--check: the whole model in a set" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$M" "$D/M.shard-2-of-3.gguf"
# overlapping blocks: a shard whose first_row was edited is refused at open
cp "$D/M.shard-1-of-3.gguf" "$T/edited.gguf"
"$PY" - "$T/edited.gguf" <<'PYEOF' || bad "edit first_row"
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read(1 << 20))
k = b"deepseek41.engram.shard.first_row"; i = b.index(k) + len(k)
assert struct.unpack_from("<IIQ", b, i) == (9, 4, 2)
v = struct.unpack_from("<I", b, i + 16)[0]
with open(p, "r+b") as f:
    f.seek(i + 16); f.write(struct.pack("<I", v - 5))
PYEOF
expect_rc 1 "first_row" "a shard with an edited first_row: refused at open" "$ENGRAM" info "$T/edited.gguf"
expect_rc 1 "first_row" "--check: overlapping blocks (an edited shard)" "$ENGRAM" shard --check \
    "$D/M.shard-0-of-3.gguf" "$T/edited.gguf" "$D/M.shard-2-of-3.gguf"

# usage and refusals
expect_rc 2 "exists" "an existing shard is kept without --force" "$ENGRAM" shard "$M" --ranks 3 --out "$D"
check "--force replaces" "$ENGRAM" shard "$M" --ranks 3 --out "$D" --force
expect_rc 2 "--ranks" "--ranks 0" "$ENGRAM" shard "$M" --ranks 0 --out "$T/z"
expect_rc 1 "already a shard" "a shard is not a source" "$ENGRAM" shard "$D/M.shard-0-of-3.gguf" --ranks 2 --out "$T/z"
[ -z "$(ls -A "$T/z" 2>/dev/null)" ] && ok || bad "a refused shard run left $(ls -A "$T/z")"

# all-or-nothing: a full disk (RLIMIT_FSIZE) fails the first file, or the
# second after the first (then the first is removed too, and an earlier set
# is as it was); a read-only DIR
unit=512
sh -c 'ulimit -f 2; head -c 1500 /dev/zero >"$1"' sh "$T/u" >/dev/null 2>&1 && unit=1024
mkdir "$T/full"
( ulimit -f 1000; "$ENGRAM" shard "$M" --ranks 2 --out "$T/full" ) >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 3 ] && [ -z "$(ls -A "$T/full")" ]; then ok; else
    bad "full disk: exit $rc, left: $(ls -A "$T/full" | tr '\n' ' ')"; fi
s0=$(stat -c %s "$T/s3/M.shard-0-of-3.gguf"); s1=$(stat -c %s "$T/s3/M.shard-1-of-3.gguf")
lim=$(( (s0 + unit - 1) / unit ))
if [ $((lim * unit)) -lt "$s1" ]; then # (N = 3: shard 0 is 256 bytes smaller)
    ( ulimit -f $lim; "$ENGRAM" shard "$M" --ranks 3 --out "$T/full" ) >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 3 ] && [ -z "$(ls -A "$T/full")" ] && grep -q "removed the 1 shard file" "$T/err"; then ok; else
        bad "full disk at the second shard: exit $rc, left: $(ls -A "$T/full" | tr '\n' ' ')"; fi
fi
# --force over a whole set that fails at the second shard: the old set is
# untouched (the new shards are written as NAME.new and renamed into place
# only when all are there; a review found the old first shard replaced and
# the set left broken)
if [ $((lim * unit)) -lt "$s1" ]; then
    cp -r "$T/s3" "$T/old3"
    ( ulimit -f $lim; "$ENGRAM" shard "$M" --ranks 3 --out "$T/old3" --force ) >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -eq 3 ] && cmp -s "$T/s3/M.shard-0-of-3.gguf" "$T/old3/M.shard-0-of-3.gguf" &&
        [ "$(ls "$T/old3")" = "$(ls "$T/s3")" ] &&
        "$ENGRAM" shard --check "$T"/old3/M.shard-*-of-3.gguf >/dev/null 2>&1; then ok; else
        bad "--force failing at the second shard: exit $rc, left: $(ls "$T/old3" | tr '\n' ' ')"; fi
    rm -rf "$T/old3"
fi
if [ "$(id -u)" -ne 0 ]; then
    mkdir "$T/ro" && chmod 555 "$T/ro"
    expect_rc 3 "" "a read-only DIR" "$ENGRAM" shard "$M" --ranks 2 --out "$T/ro"
    [ -z "$(ls -A "$T/ro")" ] && ok || bad "a read-only DIR got $(ls -A "$T/ro")"
    chmod 755 "$T/ro"
fi

finish test_shard_files.sh
