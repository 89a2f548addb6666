#!/bin/sh
# test_outputs.sh - outputs are all or nothing.  For each command that
# writes a file (build, quantize, dequantize, tokmap --out, apply
# --residual-out):
#  - a full disk (RLIMIT_FSIZE, so writes fail with EFBIG): the command fails
#    with exit 3, no file under the final name, no temporary left behind,
#    and an older file under that name is kept as it was;
#  - SIGKILL at random points of the run (some before, some during, some
#    after the write), with and without an older file under the name:
#    afterwards the name holds the complete new output (byte for byte the
#    reference run's), the older file, or nothing; what else is left is only
#    a temporary named after the output (OUT.tmp...), never a file that
#    could be mistaken for it.  At least one kill must land mid-run.
# Usage: tests/test_outputs.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
tmpdir outputs
KILLS=${KILLS:-6}

# inputs
M="$T/m.gguf"
"$E" build "$M" --base 3000 --width 64 --fill normal --seed 2 >/dev/null || bad "build the input model"
head -c 4000 data/gpl3.tok > "$T/tok"
python3 -c '
import struct, math, sys
with open(sys.argv[1], "wb") as f:
    for i in range(256 * 2048):
        f.write(struct.pack("<f", math.sin(i * 0.37) * (1 + (i % 97))))
' "$T/in.f32" || bad "float input"
"$E" quantize "$T/in.f32" "$T/in.rows" >/dev/null || bad "rows input"
TOK=$(sh tools/fetch-tokenizer.sh 2>/dev/null) || TOK=""

# run_cmd NAME OUT: the command of NAME writing OUT, exec'ed (so that, run
# in a background subshell, $! is the engram process itself)
run_cmd() {
    exec >/dev/null 2>&1
    case $1 in
    build) exec "$E" build "$2" --base 3000 --width 64 --fill normal --seed 7 ;;
    quantize) exec "$E" quantize "$T/in.f32" "$2" ;;
    dequantize) exec "$E" dequantize "$T/in.rows" "$2" ;;
    tokmap) exec "$E" tokmap "$TOK" --out "$2" ;;
    apply) exec "$E" apply "$M" --layer 14 --tokens "$T/tok" --residual-in seed:3 --residual-out "$2" ;;
    esac
}
leftovers() { # leftovers DIR: files other than out and out.tmp*
    ls -A "$1" | grep -vE '^out(\.tmp.*)?$'
}
ms_now() { date +%s%N | cut -c1-13; }

# kill_at DELAY I: runs the command of $c writing $D/killI/out (over an
# older file when I is odd), SIGKILLs it after DELAY ms, and checks what is
# left: the complete new output, the older file, or nothing, and no other
# file; counts in mid the kills that landed before the output was complete
kill_at() {
    delay=$1
    K="$D/kill$2"
    mkdir -p "$K"
    old=$(($2 % 2))
    [ $old -eq 1 ] && echo "an older file" > "$K/out"
    ( run_cmd $c "$K/out" ) &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    if kill -0 $pid 2>/dev/null; then bad "$c: the command outlived SIGKILL"; fi
    if [ ! -e "$K/out" ]; then
        state=absent
        [ $old -eq 0 ] && ok || bad "$c: kill at ${delay} ms: the older file is gone"
    elif cmp -s "$K/out" "$D/ref"; then
        state=new
        ok
    elif [ $old -eq 1 ] && [ "$(cat "$K/out")" = "an older file" ]; then
        state=old
        ok
    else
        state=corrupt
        bad "$c: kill at ${delay} ms left a partial or corrupt file under the final name ($(wc -c < "$K/out") of $size bytes)"
    fi
    [ "$state" != new ] && mid=$((mid + 1))
    if [ -z "$(leftovers "$K")" ]; then ok; else bad "$c: kill at ${delay} ms left: $(leftovers "$K" | tr '\n' ' ')"; fi
}

for c in build quantize dequantize tokmap apply; do
    if [ $c = tokmap ] && [ -z "$TOK" ]; then bad "tokmap: no tokenizer.json (tools/fetch-tokenizer.sh)"; continue; fi
    D="$T/$c"
    mkdir -p "$D"
    t0=$(ms_now)
    ( run_cmd $c "$D/ref" ) || bad "$c: reference run"
    dur=$(( $(ms_now) - t0 ))
    [ -s "$D/ref" ] || bad "$c: no reference output"
    size=$(wc -c < "$D/ref")
    # full disk: the limit at a quarter of the output (ulimit -f counts
    # blocks of 512 bytes in dash, 1024 in bash: both well below the size)
    lim=$(( size / 4 / 1024 + 1 ))
    mkdir -p "$D/full"
    ( ulimit -f $lim; run_cmd $c "$D/full/out" ); rc=$?
    if [ $rc -eq 3 ]; then ok; else bad "$c: full disk: exit $rc, wanted 3"; fi
    if [ ! -e "$D/full/out" ] && [ -z "$(ls -A "$D/full")" ]; then ok; else
        bad "$c: full disk left: $(ls -A "$D/full" | tr '\n' ' ')"; fi
    echo "an older file" > "$D/full/out"
    ( ulimit -f $lim; run_cmd $c "$D/full/out" ); rc=$?
    if [ $rc -eq 3 ] && [ "$(cat "$D/full/out")" = "an older file" ] && [ "$(ls -A "$D/full")" = out ]; then ok; else
        bad "$c: full disk over an older file: exit $rc, left: $(ls -A "$D/full" | tr '\n' ' ')"; fi
    # SIGKILL at random points spread over [0, 1.2 x the reference run's time]
    mid=0
    i=0
    while [ $i -lt "$KILLS" ]; do
        # stratified: kill i at a random point of the i-th of KILLS equal
        # slices of [0, 1.2 x dur], so that early, middle and late kills
        # all happen whatever the random draws
        r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        span=$(( dur * 12 / 10 ))
        kill_at $(( span * i / KILLS + r % (span / KILLS + 1) )) $i
        i=$((i + 1))
    done
    # a machine busy during the reference run makes dur too long, and
    # every kill may then land after the end: more kills, early ones
    # (0, 1, 2, 4, 8, 16 ms), until one lands mid-run
    extra=0
    for delay in 0 1 2 4 8 16; do
        [ $mid -ge 1 ] && break
        kill_at $delay $((KILLS + extra))
        extra=$((extra + 1))
    done
    echo "$c: reference run $dur ms, $size bytes; $mid of $((KILLS + extra)) kills landed before the output was complete"
    if [ $mid -ge 1 ]; then ok; else bad "$c: no kill landed before the output was complete"; fi
done

finish test_outputs.sh
