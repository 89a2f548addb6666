#!/bin/sh
# test_fallback.sh - refusals become fallbacks with identical outputs.
# Each way the fast path can be refused, on a real file:
#  - io_uring refused by a seccomp filter (EPERM from io_uring_setup, as
#    Docker's default profile does; tests/seccomp_run installs it and checks
#    that it works before running the command);
#  - O_DIRECT refused (EINVAL at open, as tmpfs before Linux 6.6 and some
#    FUSE/network filesystems do; tests/envfail_preload.so with
#    ENGRAM_FAIL_ODIRECT=1, logged);
#  - both at once; the model on tmpfs (/dev/shm: whatever this kernel does);
#    the engines forced by ENGRAM_IO.
# For each: `engram info` names the engine and the reason, `engram apply`
# writes the same bytes as on the normal path (both layers), `engram run`
# gives the same checksum and reports the engine and the reason, and
# `engram rows` prints the same rows.
# Usage: tests/test_fallback.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
SR="$BUILD/tests/seccomp_run"
ND="$(cd "$BUILD/tests" && pwd)/envfail_preload.so" # with ENGRAM_FAIL_ODIRECT
tmpdir fallback

M="$T/m.gguf"
"$E" build "$M" --base 3000 --width 64 --fill normal --seed 2 >/dev/null || bad "build"
head -c 6000 data/gpl3.tok > "$T/tok"
ROWS="1 17 4242 9999 12345 20000"

# outputs of one configuration into $T/$1.*: PREFIX... is the command prefix
outputs() {
    name=$1; model=$2; shift 2
    "$@" "$E" info "$model" > "$T/$name.info" 2>&1 || bad "$name: info"
    for L in 1 14; do
        "$@" "$E" apply "$model" --layer $L --tokens "$T/tok" --residual-in seed:4 \
            --residual-out "$T/$name.l$L" > /dev/null 2>"$T/$name.err" || { bad "$name: apply layer $L"; cat "$T/$name.err" >&2; }
    done
    "$@" "$E" run "$model" --tokens "$T/tok" --sessions 2 --decode 16 --layer-us 5 --json \
        > "$T/$name.run" 2>"$T/$name.err" || { bad "$name: run"; cat "$T/$name.err" >&2; }
    "$@" "$E" rows "$model" --table 1 $ROWS > "$T/$name.rows" 2>&1 || bad "$name: rows"
}
field() { # field FILE KEY: a string or number field of the run's JSON
    tr ',{}' '\n\n\n' < "$1" | grep "\"$2\":" | head -1 | sed 's/.*": *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/'
}
same_as_ref() {
    name=$1
    for L in 1 14; do
        if cmp -s "$T/ref.l$L" "$T/$name.l$L"; then ok; else bad "$name: apply layer $L differs from the normal path"; fi
    done
    a=$(field "$T/ref.run" checksum); b=$(field "$T/$name.run" checksum)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "$name: run checksum $b, normal path $a"; fi
    if cmp -s "$T/ref.rows" "$T/$name.rows"; then ok; else bad "$name: rows differ"; fi
}
expect_info() { # expect_info NAME PATTERN: the info line on table reads
    if grep "^table reads:" "$T/$1.info" | grep -qE "$2"; then ok; else
        bad "$1: info says '$(grep '^table reads:' "$T/$1.info")', wanted /$2/"; fi
}
expect_run() { # expect_run NAME ENGINE NOTE_PATTERN
    e=$(field "$T/$1.run" engine); n=$(field "$T/$1.run" note)
    if [ "$e" = "$2" ] && echo "$n" | grep -qE "$3"; then ok; else
        bad "$1: run reports engine '$e' note '$n', wanted '$2' /$3/"; fi
}

outputs ref "$M"
normal=$(field "$T/ref.run" engine)
echo "normal path: $(grep '^table reads:' "$T/ref.info")"
if [ "$normal" = "io_uring" ]; then ok; else
    echo "note: io_uring is not the normal path here ($normal); the seccomp case still runs"; fi

# io_uring refused by seccomp
outputs seccomp "$M" "$SR"
# (the default depth 64: ENGRAM_READER_THREADS(64) = 32 threads, engram.h)
expect_info seccomp "^table reads: +threads, O_DIRECT.*depth 64 \(32 threads\).*io_uring refused \(Operation not permitted\)"
expect_run seccomp threads "io_uring refused \(Operation not permitted\)"
same_as_ref seccomp

# O_DIRECT refused
export ENGRAM_FAIL_ODIRECT=1 ENGRAM_ENVFAIL_LOG="$T/nodirect.log"
outputs nodirect "$M" env LD_PRELOAD="$ND"
expect_info nodirect "^table reads: +buffered, buffered.*depth 64 \(32 threads\).*O_DIRECT refused \(Invalid argument\); buffered fallback"
expect_run nodirect buffered "O_DIRECT refused"
same_as_ref nodirect
if [ -s "$T/nodirect.log" ]; then ok; else bad "the O_DIRECT shim never refused an open"; fi

# both
outputs both "$M" env LD_PRELOAD="$ND" "$SR"
expect_info both "^table reads: +buffered.*O_DIRECT refused"
expect_run both buffered "O_DIRECT refused"
same_as_ref both
unset ENGRAM_FAIL_ODIRECT ENGRAM_ENVFAIL_LOG

# forced engines
for eng in threads buffered; do
    outputs "forced-$eng" "$M" env ENGRAM_IO=$eng
    expect_run "forced-$eng" $eng ""
    same_as_ref "forced-$eng"
done

# the model on tmpfs, if there is one
if [ -d /dev/shm ] && SHM=$(mktemp -d /dev/shm/engram-fallback-XXXXXX 2>/dev/null); then
    ALSO_REMOVE=$SHM
    cp "$M" "$SHM/m.gguf"
    outputs tmpfs "$SHM/m.gguf"
    echo "tmpfs: $(grep '^table reads:' "$T/tmpfs.info")"
    same_as_ref tmpfs
    # engram info on tmpfs names what it does (O_DIRECT where this kernel allows it)
    if grep "^table reads:" "$T/tmpfs.info" | grep -qE "O_DIRECT \(no page cache\)|O_DIRECT refused"; then ok; else
        bad "tmpfs: info names neither O_DIRECT nor its refusal"; fi
fi

finish test_fallback.sh
