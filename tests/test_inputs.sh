#!/bin/sh
# test_inputs.sh - no input makes the engram command take unbounded memory
# or time, and each refusal says what is wrong (issue #26, defects 4 and 7):
#  - /dev/zero as every file of numbers (tokens, mask, rows, corpus) and as
#    a token map: refused at once (a NUL byte is an invalid item);
#  - an endless stream of valid numbers (yes 7) where the whole file is
#    needed (run, apply, rows --rows): refused at 2^24 items;
#  - hash on 10^7 tokens, plain and --summary: memory independent of the
#    length, time linear (the old reader held ~190 bytes a token, the old
#    summary ~465 and sorted them all);
#  - hash's streaming: the mask read in step, errors named by their place in
#    the whole stream, --summary's counts against sort -u of the rows;
#  - a directory as each input: "Is a directory", exit 3; a device as an
#    input that is read by its size: refused, exit 1.
# Peak memory and wall time are measured by tests/rusage_run (ru_maxrss of
# the command through wait4), which also kills a command past its time
# bound and, outside sanitizer builds, caps its address space at 2 GiB, so
# a build that does read without a bound fails here quickly and safely.
# Usage: tests/test_inputs.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
RR="$BUILD/tests/rusage_run"
tmpdir inputs
[ -x "$RR" ] || { echo "FAIL: $RR is not built (make $RR)" >&2; exit 1; }
case "$BUILD" in
*san*) SAN=1; AS="" ;;          # ASan reserves terabytes of address space; shadow memory
*) SAN=0; AS="-m 2048" ;;
esac
mb() { [ "$SAN" = 1 ] && echo $(($1 * 4 + 300)) || echo "$1"; }  # a bound, for this build
secs() { [ "$SAN" = 1 ] && echo $(($1 * 10)) || echo "$1"; }

# bounded RC NEEDLE MAX_MB MAX_S DESCRIPTION COMMAND...: COMMAND exits RC
# and says NEEDLE (stdout in $T/out, stderr in $T/err) with a peak RSS under
# MAX_MB and within MAX_S seconds (killed then); its figures in $T/ru.
bounded() {
    b_rc=$1; b_needle=$2; b_mb=$(mb "$3"); b_s=$(secs "$4"); b_what=$5; shift 5
    # shellcheck disable=SC2086
    "$RR" -t "$b_s" $AS -o "$T/ru" "$@" >"$T/out" 2>"$T/err" </dev/null
    b_got=$?
    b_kib=$(sed -n 's/.*maxrss_kib=\([0-9]*\).*/\1/p' "$T/ru")
    b_ms=$(sed -n 's/.*wall_ms=\([0-9]*\).*/\1/p' "$T/ru")
    echo "    $b_what: exit $b_got, $((b_kib / 1024)) MB peak, $b_ms ms"
    if [ "$b_got" -eq "$b_rc" ] && grep -q -- "$b_needle" "$T/out" "$T/err" &&
        [ "$b_kib" -lt $((b_mb * 1024)) ]; then ok; else
        bad "$b_what (exit $b_got, wanted $b_rc and '$b_needle'; $b_kib KiB peak, bound $b_mb MB; $(cat "$T/ru"))"
        head -3 "$T/err" >&2
    fi
}

M="$T/m.gguf"
"$E" build "$M" --base 5000 --width 16 --fill normal --seed 9 >/dev/null || { bad "build the model"; finish test_inputs; exit 1; }
echo "1 2 3" > "$T/t3"
echo "1 1 1" > "$T/m3"
mkdir "$T/dir"
ITEM0="item 0 is not a decimal number"

# ---------------------------------------------------------------- /dev/zero
bounded 1 "token file '/dev/zero': $ITEM0" 20 5 "hash --tokens /dev/zero" "$E" hash "$M" --tokens /dev/zero
bounded 1 "mask file '/dev/zero': $ITEM0" 20 5 "hash --mask /dev/zero" "$E" hash "$M" --tokens "$T/t3" --mask /dev/zero
bounded 1 "token file '-': $ITEM0" 20 5 "hash --tokens - < /dev/zero" sh -c "exec '$E' hash '$M' --tokens - < /dev/zero"
bounded 1 "row file '/dev/zero': $ITEM0" 20 5 "rows --rows /dev/zero" "$E" rows "$M" --table 0 --rows /dev/zero
bounded 1 "token file '/dev/zero': $ITEM0" 20 5 "run --tokens /dev/zero" "$E" run "$M" --tokens /dev/zero
bounded 1 "token file '/dev/zero': $ITEM0" 20 5 "apply --tokens /dev/zero" "$E" apply "$M" --layer 1 \
    --tokens /dev/zero --residual-in seed:1 --residual-out "$T/o.f32"
bounded 1 "mask file '/dev/zero': $ITEM0" 20 5 "apply --mask /dev/zero" "$E" apply "$M" --layer 1 \
    --tokens "$T/t3" --mask /dev/zero --residual-in seed:1 --residual-out "$T/o.f32"
bounded 1 "a map is 1..2^24" 100 5 "build --tokmap /dev/zero (64 MiB + 1 byte read)" "$E" build "$T/x.gguf" \
    --tokmap /dev/zero --base 100
[ ! -e "$T/o.f32" ] && [ ! -e "$T/x.gguf" ] && ok || bad "a refused command left its output"

# ---------------------------------------------------------------- endless valid numbers: the 2^24 limit
LIM="more than 16777216 items (the limit)"
bounded 1 "token file '-': $LIM" 150 20 "run --tokens - < yes 7" sh -c "yes 7 | '$E' run '$M' --tokens -"
bounded 1 "token file '-': $LIM" 150 20 "apply --tokens - < yes 7" sh -c "yes 7 | '$E' apply '$M' --layer 1 \
    --tokens - --residual-in seed:1 --residual-out '$T/o.f32'"
bounded 1 "row file '-': $LIM" 150 20 "rows --rows - < yes 0" sh -c "yes 0 | '$E' rows '$M' --table 0 --rows -"
[ ! -e "$T/o.f32" ] && ok || bad "a refused apply left its output"

# ---------------------------------------------------------------- hash on 10^7 tokens
# the bundled text, one id a line, doubled 11 times (15.5 M) and cut to 10^7
tr -s ' \t\r\n' '\n\n\n\n' < data/gpl3.tok | grep -v '^$' > "$T/t0"
for i in 1 2 3 4 5 6 7 8 9 10 11; do cat "$T/t0" "$T/t0" > "$T/t1" && mv "$T/t1" "$T/t0"; done
head -n 10000000 "$T/t0" > "$T/t7"
head -n 12345 "$T/t0" > "$T/tk"
rm -f "$T/t0"
bounded 0 "" 30 60 "hash of 10^7 tokens (lines counted by wc)" sh -c "'$E' hash '$M' --tokens '$T/t7' | wc -l"
[ "$(cat "$T/out")" = 10000000 ] && ok || bad "hash of 10^7 tokens printed $(cat "$T/out") lines"
bounded 0 "tokens: *10000000 (0 masked)" 30 20 "hash --summary of 10^7 tokens" "$E" hash "$M" --tokens "$T/t7" --summary
grep -q "row requests: *480000000 (48 per token)" "$T/out" && ok || bad "--summary: row requests"
grep -q "hash speed:" "$T/out" && ok || bad "--summary: no hash speed"
rm -f "$T/t7"

# --summary against the rows themselves: distinct rows by sort -u, a mask
# counted, over 3 chunks of 4096 and a part
awk '{print (NR % 7 == 0) ? 0 : 1}' "$T/tk" > "$T/mk"
"$E" hash "$M" --tokens "$T/tk" --mask "$T/mk" --history 5,-1,7 > "$T/rows.txt" || bad "hash with a mask"
"$E" hash "$M" --tokens "$T/tk" --mask "$T/mk" --history 5,-1,7 --summary > "$T/sum.txt" || bad "hash --summary with a mask"
d0=$(cut -d' ' -f1-24 "$T/rows.txt" | tr ' ' '\n' | sort -u | wc -l)
d1=$(cut -d' ' -f25-48 "$T/rows.txt" | tr ' ' '\n' | sort -u | wc -l)
grep -q "^table 0: *$d0 distinct rows of 296280 requests" "$T/sum.txt" && ok || bad "--summary table 0: not $d0 distinct rows"
grep -q "^table 1: *$d1 distinct rows of 296280 requests" "$T/sum.txt" && ok || bad "--summary table 1: not $d1 distinct rows"
grep -q "^tokens: *12345 (1763 masked)" "$T/sum.txt" && ok || bad "--summary: tokens and masked"
# the same rows through stdin, fed a few bytes at a time by a pipe
sh -c "cat '$T/tk' | '$E' hash '$M' --tokens - --mask '$T/mk' --history 5,-1,7" | cmp -s - "$T/rows.txt" &&
    ok || bad "hash from a pipe differs"

expect_rc 2 "cannot both be '-'" "hash --tokens - --mask -" sh -c "'$E' hash '$M' --tokens - --mask - < '$T/tk'"

# errors past the first chunk name their place in the whole stream
head -n 5000 "$T/tk" > "$T/bad1"; echo 4000000 >> "$T/bad1"; echo 5 >> "$T/bad1"
expect_rc 1 "token 4000000 at position 5000 is not < vocab" "a token >= vocab in the second chunk" \
    "$E" hash "$M" --tokens "$T/bad1"
[ "$(wc -l < "$T/out")" = 4096 ] && ok || bad "hash printed $(wc -l < "$T/out") lines before the bad chunk, not 4096"
head -n 5000 "$T/tk" > "$T/bad2"; echo 12x >> "$T/bad2"
expect_rc 1 "token file '$T/bad2': item 5000 is not a decimal" "an invalid item in the second chunk" \
    "$E" hash "$M" --tokens "$T/bad2"
head -n 4096 "$T/tk" > "$T/t4096"
head -n 4095 "$T/mk" > "$T/m4095"
head -n 4097 "$T/mk" > "$T/m4097"
head -n 5000 "$T/mk" > "$T/m5000"
expect_rc 1 "mask file has 4095 entries for 4096 tokens" "mask one short at a chunk's end" \
    "$E" hash "$M" --tokens "$T/t4096" --mask "$T/m4095"
expect_rc 1 "mask file has 4097 entries for 4096 tokens" "mask one long at a chunk's end" \
    "$E" hash "$M" --tokens "$T/t4096" --mask "$T/m4097"
expect_rc 1 "mask file has 5000 entries for 12345 tokens" "mask ends in the second chunk" \
    "$E" hash "$M" --tokens "$T/tk" --mask "$T/m5000"
head -n 5000 "$T/tk" > "$T/t5000"
expect_rc 1 "mask file has 12345 entries for 5000 tokens" "tokens end in the second chunk" \
    "$E" hash "$M" --tokens "$T/t5000" --mask "$T/mk"

# rows --rows past one chunk (4096): checked whole before anything prints
cut -d' ' -f1-2 "$T/rows.txt" | head -n 3000 | tr ' ' '\n' > "$T/r6000"
"$E" rows "$M" --table 0 --rows "$T/r6000" > "$T/rv.txt" && [ "$(wc -l < "$T/rv.txt")" = 6000 ] &&
    ok || bad "rows --rows of 6000 rows"
"$E" rows "$M" --table 0 "$(tail -n 1 "$T/r6000")" > "$T/rv1"
tail -n 1 "$T/rv.txt" | cmp -s - "$T/rv1" && ok || bad "rows: the last row's line differs in a long request"
echo 999999999 >> "$T/r6000"
expect_rc 1 "row 999999999 of table 0: out of range" "rows: out of range in the second chunk" \
    "$E" rows "$M" --table 0 --rows "$T/r6000"
[ ! -s "$T/out" ] && ok || bad "rows printed something before failing"

# ---------------------------------------------------------------- a directory as an input
D="$T/dir"
expect_rc 3 "cannot read token file '$D': Is a directory" "hash --tokens DIR" "$E" hash "$M" --tokens "$D"
expect_rc 3 "cannot read mask file '$D': Is a directory" "hash --mask DIR" "$E" hash "$M" --tokens "$T/t3" --mask "$D"
expect_rc 3 "cannot read row file '$D': Is a directory" "rows --rows DIR" "$E" rows "$M" --table 0 --rows "$D"
expect_rc 3 "cannot read token file '$D': Is a directory" "run --tokens DIR" "$E" run "$M" --tokens "$D"
expect_rc 3 "cannot read token file '$D': Is a directory" "apply --tokens DIR" "$E" apply "$M" --layer 1 \
    --tokens "$D" --residual-in seed:1 --residual-out "$T/o.f32"
expect_rc 3 "cannot read mask file '$D': Is a directory" "apply --mask DIR" "$E" apply "$M" --layer 1 \
    --tokens "$T/t3" --mask "$D" --residual-in seed:1 --residual-out "$T/o.f32"
expect_rc 3 "cannot read '$D': Is a directory" "apply --residual-in DIR" "$E" apply "$M" --layer 1 \
    --tokens "$T/t3" --residual-in "$D" --residual-out "$T/o.f32"
expect_rc 3 "cannot read '$D': Is a directory" "build --tokmap DIR" "$E" build "$T/x.gguf" --tokmap "$D"
expect_rc 3 "cannot read '$D': Is a directory" "quantize DIR" "$E" quantize "$D" "$T/x.rows"
expect_rc 3 "cannot read '$D': Is a directory" "dequantize DIR" "$E" dequantize "$D" "$T/x.f32"
expect_rc 1 "not a regular file" "tokmap DIR" "$E" tokmap "$D"
expect_rc 1 "not a regular file" "build --tokenizer DIR" "$E" build "$T/x.gguf" --tokenizer "$D"
# inputs read by their size: a device's size says nothing
expect_rc 1 "'/dev/zero' is not a regular file" "quantize /dev/zero" "$E" quantize /dev/zero "$T/x.rows"
expect_rc 1 "'/dev/zero' is not a regular file" "dequantize /dev/zero" "$E" dequantize /dev/zero "$T/x.f32"
expect_rc 1 "'/dev/zero' is not a regular file" "apply --residual-in /dev/zero" "$E" apply "$M" --layer 1 \
    --tokens "$T/t3" --residual-in /dev/zero --residual-out "$T/o.f32"
for f in o.f32 x.gguf x.rows x.f32; do
    [ ! -e "$T/$f" ] && ok || bad "a refused command left $f"
done

finish test_inputs
