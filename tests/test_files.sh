#!/bin/sh
# test_files.sh - outputs that cannot hurt the user (issue #26; RELIABILITY.md
# "Files").  For every writer of the engram command and the benchmarks:
#  - a character device made with mknod in the scratch folder (never the
#    system's): /dev/full's numbers give "No space left on device", exit 3,
#    /dev/null's exit 0, and the node stays a node;
#  - a FIFO with a reader: the bytes arrive through it, equal to the
#    regular file's output, and the FIFO stays a FIFO;
#  - a symbolic link at the output: refused (exit 2), its target untouched;
#  - a link planted at the temporary name the old writer used (OUT.tmpPID):
#    never written through; the output is a regular file with the output;
#  - a folder, a block device node: refused (exit 2), unchanged;
#  - two outputs naming one file, or an output naming an input (also
#    through another spelling or a link): exit 2 before anything is read,
#    the file unchanged;
#  - a replaced regular file keeps its mode; "-" is the standard output
#    with the report on the standard error;
# and the smaller defects: bench io's refusals (a bad --depths item named
# intact, --seconds and --sections checked), and under address-space limits
# every exit 3 says what failed.
# Usage: tests/test_files.sh BUILD_DIR   (device nodes need root: skipped,
# and said, otherwise)
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$(cd "$BUILD" && pwd)/engram"
tmpdir files
M="$T/m.gguf"
"$E" build "$M" --base 3000 --width 64 --fill normal --seed 2 >/dev/null || { bad "build the input model"; finish test_files.sh; exit; }
head -c 3000 data/gpl3.tok > "$T/tok"
/usr/bin/python3 -c '
import struct, math, sys
with open(sys.argv[1], "wb") as f:
    for i in range(256 * 64):
        f.write(struct.pack("<f", math.sin(i * 0.37) * (1 + (i % 97))))
' "$T/in.f32" || bad "float input"
"$E" quantize "$T/in.f32" "$T/in.rows" >/dev/null || bad "rows input"
root=0; [ "$(id -u)" = 0 ] && root=1
[ $root = 1 ] || echo "test_files.sh: not root: the device-node cases are skipped" >&2

# wargs W OUT: the engram arguments of writer W writing OUT (the scratch
# folder's paths hold no spaces); wcmd W OUT runs it (stdout and stderr to
# $T/o and $T/e)
wargs() {
    case $1 in
    build) echo build "$2" --base 3000 --width 64 --seed 7 ;;
    quantize) echo quantize "$T/in.f32" "$2" ;;
    dequantize) echo dequantize "$T/in.rows" "$2" ;;
    apply) echo apply "$M" --layer 14 --tokens "$T/tok" --residual-in seed:3 --residual-out "$2" ;;
    kv) echo apply "$M" --layer 1 --tokens "$T/tok" --residual-in seed:3 --residual-out "$T/kvres" --kv-out "$2" ;;
    csv) echo bench io "$M" --sections b --seconds 0.2 --no-fio --no-baseline --csv "$2" ;;
    svg) echo bench io "$M" --sections a --depths 1 --seconds 0.1 --no-fio --no-baseline --svg "$2" ;;
    tokmap) echo tokmap "$TOK" --out "$2" ;;
    esac
}
# shellcheck disable=SC2046
wcmd() { "$E" $(wargs "$1" "$2") >"$T/o" 2>"$T/e"; }
# seekable writers refuse devices and FIFOs; the others write through them
WRITERS="build quantize dequantize apply kv csv svg tokmap"
TOK=$(sh tools/fetch-tokenizer.sh 2>/dev/null) || { TOK=""; bad "tokmap: no tokenizer.json (tools/fetch-tokenizer.sh)"; }
case $TOK in ''|/*) ;; *) TOK="$(pwd)/$TOK" ;; esac
[ -n "$TOK" ] || WRITERS=${WRITERS% tokmap}
seekable() { [ "$1" = build ]; }

for w in $WRITERS; do
    D="$T/$w"; mkdir "$D"
    wcmd $w "$D/ref"; rc=$?
    if [ $rc = 0 ] && [ -f "$D/ref" ]; then ok; else bad "$w: reference run (rc $rc)"; cat "$T/e" >&2; fi

    # a symbolic link at the output: refused, the target untouched
    echo victim > "$D/victim"; ln -s victim "$D/link"
    wcmd $w "$D/link"; rc=$?
    if [ $rc = 2 ] && grep -q "symbolic link" "$T/e" && [ -L "$D/link" ] &&
        [ "$(cat "$D/victim")" = victim ]; then ok; else bad "$w: a symlink at the output (rc $rc)"; fi

    # a link planted at the old writer's temporary name (OUT.tmpPID) and at
    # the names of the form it uses now cannot be predicted; the output is
    # written, the link's target untouched
    echo victim > "$D/victim2"
    # shellcheck disable=SC2046
    ( cd "$D" && exec sh -c 'ln -s victim2 out.tmp$$; exec "$@"' sh "$E" $(wargs $w out) ) >"$T/o" 2>"$T/e"
    rm -f "$D"/out.tmp[0-9]*
    if [ "$(cat "$D/victim2")" = victim ] && [ -f "$D/out" ] && [ ! -L "$D/out" ] &&
        { [ $w = csv ] || [ $w = svg ] || cmp -s "$D/out" "$D/ref"; }; then ok; else
        bad "$w: a link at the old temporary name"; cat "$T/e" >&2; fi

    # a folder
    mkdir "$D/dir"
    wcmd $w "$D/dir"; rc=$?
    if [ $rc = 2 ] && grep -q "directory" "$T/e" && [ -d "$D/dir" ]; then ok; else bad "$w: a folder (rc $rc)"; fi

    # a replaced regular file keeps its mode
    echo old > "$D/mode"; chmod 600 "$D/mode"
    wcmd $w "$D/mode"; rc=$?
    if [ $rc = 0 ] && [ "$(stat -c %a "$D/mode")" = 600 ] && ! grep -qx old "$D/mode"; then ok; else
        bad "$w: mode of a replaced file (rc $rc, mode $(stat -c %a "$D/mode"))"; fi

    # a FIFO with a reader
    mkfifo "$D/fifo"
    if seekable $w; then
        wcmd $w "$D/fifo"; rc=$?
        if [ $rc = 2 ] && grep -q "FIFO" "$T/e" && [ -p "$D/fifo" ]; then ok; else bad "$w: a FIFO (rc $rc)"; fi
    else
        timeout 60 cat "$D/fifo" > "$D/fromfifo" &
        reader=$!
        wcmd $w "$D/fifo"; rc=$?
        wait $reader
        if [ $rc = 0 ] && [ -p "$D/fifo" ] && { [ $w = csv ] || [ $w = svg ] || cmp -s "$D/fromfifo" "$D/ref"; } &&
            [ -s "$D/fromfifo" ]; then ok; else bad "$w: a FIFO with a reader (rc $rc)"; fi
    fi

    if [ $root = 1 ]; then
        mknod "$D/full" c 1 7 && mknod "$D/null" c 1 3 && mknod "$D/blk" b 7 250 || bad "$w: mknod"
        wcmd $w "$D/full"; rc=$?
        if seekable $w; then
            if [ $rc = 2 ] && grep -q "character device" "$T/e" && [ -c "$D/full" ]; then ok; else bad "$w: device (rc $rc)"; fi
        elif [ $rc = 3 ] && grep -q "No space left on device" "$T/e" && [ -c "$D/full" ]; then ok; else
            bad "$w: a full device (rc $rc, $(ls -l "$D/full"))"; cat "$T/e" >&2; fi
        wcmd $w "$D/null"; rc=$?
        want=0; seekable $w && want=2
        if [ $rc = $want ] && [ -c "$D/null" ]; then ok; else bad "$w: a null device (rc $rc, $(ls -l "$D/null"))"; fi
        wcmd $w "$D/blk"; rc=$?
        if [ $rc = 2 ] && grep -q "block device" "$T/e" && [ -b "$D/blk" ]; then ok; else bad "$w: a block device (rc $rc)"; fi
    fi
    [ -z "$(ls -A "$D" | grep '\.tmp')" ] || { bad "$w: temporaries left: $(ls -A "$D" | grep '\.tmp' | tr '\n' ' ')"; }
    ls -A "$D" | grep '\.tmp' | sed "s|^|$D/|" | xargs -r rm -f
done

# the same file twice, or an output over an input: exit 2, nothing changed
S="$T/same"; mkdir "$S"; echo OLD > "$S/kk"; ln "$S/kk" "$S/kkhard"; cp "$T/in.f32" "$S/in"
cp "$T/tok" "$S/tok"; ln -s tok "$S/toklink"
same() { # same DESCRIPTION FILE COMMAND...: exit 2 naming "same file", FILE unchanged
    lib_d=$1; lib_f=$2; shift 2
    lib_sum=$(cksum < "$lib_f")
    "$@" >"$T/o" 2>"$T/e"; lib_rc=$?
    if [ $lib_rc = 2 ] && grep -q "same file" "$T/e" && [ "$(cksum < "$lib_f")" = "$lib_sum" ]; then ok; else
        bad "same file: $lib_d (rc $lib_rc)"; head -2 "$T/e" >&2; fi
}
A="$E apply $M --layer 1 --tokens $T/tok --residual-in seed:3"
same "--residual-out and --kv-out" "$S/kk" $A --residual-out "$S/kk" --kv-out "$S/kk"
same "the same file spelled twice" "$S/kk" $A --residual-out "$S/kk" --kv-out "$S/../same/./kk"
same "the same file through a hard link" "$S/kk" $A --residual-out "$S/kk" --kv-out "$S/kkhard"
same "an input through a symbolic link" "$S/tok" "$E" apply "$M" --layer 1 --tokens "$S/toklink" --residual-in seed:3 --residual-out "$S/tok"
expect_rc 2 "same file" "a new name twice" $A --residual-out "$S/new" --kv-out "$S/new"
[ ! -e "$S/new" ] && ok || bad "a new name twice: created"
# refused before anything is read: the model named does not even exist
expect_rc 2 "same file" "same file before reading" "$E" apply "$T/no/such.gguf" --layer 1 \
    --tokens "$T/tok" --residual-in seed:3 --residual-out "$S/kk" --kv-out "$S/kk"
same "--residual-out over MODEL" "$M" $A --residual-out "$M"
same "--residual-out over --tokens" "$T/tok" $A --residual-out "$T/tok"
same "--kv-out over --residual-in" "$S/in" "$E" apply "$M" --layer 1 --tokens "$T/tok" --residual-in "$S/in" --residual-out "$S/o1" --kv-out "$S/in"
same "quantize IN IN" "$S/in" "$E" quantize "$S/in" "$S/in"
same "dequantize IN IN" "$T/in.rows" "$E" dequantize "$T/in.rows" "$T/in.rows"
same "build OUT --tokmap OUT" "$S/kk" "$E" build "$S/kk" --tokmap "$S/kk"
same "bench io --csv FILE" "$M" "$E" bench io "$M" --csv "$M"
same "bench io --csv X --svg X" "$S/kk" "$E" bench io "$M" --csv "$S/kk" --svg "$S/kk"
[ -z "$TOK" ] || same "tokmap --out TOKENIZER" "$TOK" "$E" tokmap "$TOK" --out "$TOK"
# two outputs to one character device are allowed (nothing to keep whole)
expect_rc 0 "applied" "two outputs to /dev/null" $A --residual-out /dev/null --kv-out /dev/null

# "-": the data on the standard output, the report on the standard error
"$E" apply "$M" --layer 14 --tokens "$T/tok" --residual-in seed:3 --residual-out - >"$T/stdout" 2>"$T/e"
if [ $? = 0 ] && cmp -s "$T/stdout" "$T/apply/ref" && grep -q "applied layer" "$T/e"; then ok; else bad "apply --residual-out -"; fi
expect_rc 2 "regular file" "build -" "$E" build -
expect_rc 2 "same file" "two outputs to -" $A --residual-out - --kv-out -

# "-" for every writer that streams: exactly the regular file's bytes (the
# CSV and SVG: their first line; the report went to stderr)
for w in quantize dequantize apply tokmap; do
    [ $w = tokmap ] && [ -z "$TOK" ] && continue
    # shellcheck disable=SC2046
    "$E" $(wargs $w -) >"$T/stdout" 2>"$T/e"; rc=$?
    if [ $rc = 0 ] && cmp -s "$T/stdout" "$T/$w/ref"; then ok; else bad "$w to - (rc $rc)"; fi
done
# shellcheck disable=SC2046
"$E" $(wargs csv -) >"$T/stdout" 2>"$T/e"
[ "$(head -1 "$T/stdout")" = "section,what,depth,value,unit" ] && ok || bad "bench io --csv -: $(head -1 "$T/stdout")"
# shellcheck disable=SC2046
"$E" $(wargs svg -) >"$T/stdout" 2>"$T/e"
case $(head -c 4 "$T/stdout") in "<svg") ok ;; *) bad "bench io --svg -: $(head -c 60 "$T/stdout")" ;; esac

# a socket at the output: refused
/usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$T/sock" &&
    expect_rc 2 "socket" "a socket" "$E" quantize "$T/in.f32" "$T/sock"
[ -S "$T/sock" ] && ok || bad "the socket replaced"

# the temporary's name, made known by a getrandom that gives 0, 1, 2, ...
# (tests/fixed_random_preload.so): a link planted at the first name is
# never written through (O_EXCL | O_NOFOLLOW: the next name is taken); 64
# names all taken: exit 3, nothing written
P="$T/pre"; mkdir "$P"; echo victim > "$P/victim"
PRE="$(cd "$BUILD" && pwd)/tests/fixed_random_preload.so"
ln -s victim "$P/out.tmp.aaaaaaaaaaaa"
ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" LD_PRELOAD="$PRE" "$E" quantize "$T/in.f32" "$P/out" >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 0 ] && cmp -s "$P/out" "$T/quantize/ref" && [ "$(cat "$P/victim")" = victim ]; then ok; else
    bad "a link at the writer's own first temporary name (rc $rc)"; cat "$T/e" >&2; fi
rm -f "$P/out"
/usr/bin/python3 -c '
import os, sys
abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
for k in range(1, 64):
    os.symlink("victim", sys.argv[1] + "/out.tmp." + abc[k % 62] * 12)
' "$P" 2>/dev/null
ASAN_OPTIONS="${ASAN_OPTIONS:-}:verify_asan_link_order=0" LD_PRELOAD="$PRE" "$E" quantize "$T/in.f32" "$P/out" >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 3 ] && grep -q "File exists" "$T/e" && [ ! -e "$P/out" ] && [ "$(cat "$P/victim")" = victim ]; then ok; else
    bad "64 names taken (rc $rc)"; cat "$T/e" >&2; fi

# descriptors 0-2 closed by the caller: no output becomes one of them
( exec >&- 2>&-; "$E" quantize "$T/in.f32" "$T/closed.rows" ); rc=$?
if [ $rc = 0 ] && cmp -s "$T/closed.rows" "$T/quantize/ref"; then ok; else bad "stdout and stderr closed: the output (rc $rc)"; fi

# an interrupted command leaves no temporary (SIGINT, SIGTERM)
for sig in INT TERM; do
    I="$T/int$sig"; mkdir "$I"
    # (python resets SIGINT, which a shell's background job inherits ignored)
    /usr/bin/python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$E" build "$I/big.gguf" --base 400000 --width 512 --fill normal >/dev/null 2>&1 &
    pid=$!
    k=0; while [ -z "$(ls -A "$I")" ] && [ $k -lt 200 ]; do sleep 0.01; k=$((k + 1)); done
    kill -$sig $pid; wait $pid 2>/dev/null; rc=$?
    if [ $rc -gt 128 ] && [ -z "$(ls -A "$I")" ]; then ok; else bad "SIG$sig: rc $rc, left: $(ls -A "$I" | tr '\n' ' ')"; fi
done

# ... and while the output is being finished (fsync made slow by the
# preload), and on SIGPIPE (an output to a closed pipe beside a file)
F="$T/intfsync"; mkdir "$F"
PRELOAD_FSYNC_SLEEP_MS=3000 /usr/bin/python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.environ["LD_PRELOAD"] = sys.argv[1]
os.environ["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
os.execv(sys.argv[2], sys.argv[2:])' "$PRE" "$E" quantize "$T/in.f32" "$F/out" >/dev/null 2>&1 &
pid=$!
k=0; while [ -z "$(ls -A "$F")" ] && [ $k -lt 300 ]; do sleep 0.01; k=$((k + 1)); done
sleep 0.3; kill -INT $pid; wait $pid 2>/dev/null; rc=$?
if [ $rc -gt 128 ] && [ -z "$(ls -A "$F")" ]; then ok; else bad "SIGINT in fsync: rc $rc, left: $(ls -A "$F" | tr '\n' ' ')"; fi
G="$T/pipe"; mkdir "$G"
"$E" apply "$M" --layer 1 --tokens "$T/tok" --residual-in seed:3 --residual-out - --kv-out "$G/kv" 2>/dev/null | head -c 10 >/dev/null
[ -z "$(ls -A "$G")" ] && ok || bad "SIGPIPE: left $(ls -A "$G" | tr '\n' ' ')"

# bench io --create over a node: refused, never opened as a model
mkfifo "$T/cfifo"
expect_rc 2 "FIFO" "bench io --create over a FIFO" "$E" bench io "$T/cfifo" --create 1G
[ -p "$T/cfifo" ] && ok || bad "--create replaced the FIFO"

if [ $root = 1 ]; then
    # in a shared sticky folder (/tmp's rules): a file planted by another
    # user gives nothing (the output is root's, by root's umask), a FIFO or
    # device of another user's is not written; root's own file keeps its
    # mode and group
    K="$T/sticky"; mkdir "$K"; chmod 1777 "$K"
    touch "$K/planted"; chmod 666 "$K/planted"; chown nobody "$K/planted"
    ( umask 077; exec "$E" quantize "$T/in.f32" "$K/planted" >/dev/null 2>&1 ); rc=$?
    if [ $rc = 0 ] && [ "$(stat -c '%U %a' "$K/planted")" = "root 600" ]; then ok; else
        bad "a planted file's owner and mode passed on: $(stat -c '%U %a' "$K/planted")"; fi
    ( umask 077; exec "$E" quantize "$T/in.f32" "$K/new" >/dev/null 2>&1 )
    [ "$(stat -c %a "$K/new")" = 600 ] && ok || bad "a new name under umask 077: $(stat -c %a "$K/new")"
    echo old > "$K/mine"; chgrp daemon "$K/mine"; chmod 640 "$K/mine"
    "$E" quantize "$T/in.f32" "$K/mine" >/dev/null 2>&1
    [ "$(stat -c '%U %G %a' "$K/mine")" = "root daemon 640" ] && ok || bad "root's file: $(stat -c '%U %G %a' "$K/mine")"
    mkfifo "$K/fifo"; chown nobody "$K/fifo"
    expect_rc 2 "sticky folder" "another user's FIFO in a sticky folder" "$E" quantize "$T/in.f32" "$K/fifo"
    mknod "$K/null" c 1 3; chown nobody "$K/null"
    expect_rc 2 "sticky folder" "another user's device in a sticky folder" "$E" quantize "$T/in.f32" "$K/null"
    [ -p "$K/fifo" ] && [ -c "$K/null" ] && ok || bad "the sticky folder's nodes replaced"
    # a folder its user may write but not read (0300) takes an output
    if command -v su >/dev/null && su -s /bin/sh nobody -c "test -x '$E'" 2>/dev/null; then
        chmod 711 "$T"; chmod 644 "$T/in.f32"
        Wo="$T/wonly"; mkdir "$Wo"; chown nobody "$Wo"; chmod 300 "$Wo"
        su -s /bin/sh nobody -c "'$E' quantize '$T/in.f32' '$Wo/out'" >/dev/null 2>"$T/e"; rc=$?
        if [ $rc = 0 ] && cmp -s "$Wo/out" "$T/quantize/ref"; then ok; else bad "a write-only folder (rc $rc)"; cat "$T/e" >&2; fi
        chmod 700 "$T"
    else
        echo "test_files.sh: nobody cannot run $E: the write-only folder case is skipped" >&2
    fi
fi

# the benchmarks' CSV files follow the rule too (refused before they run)
for b in "bench_core --seconds 0.1 --csv" "bench_sessions $M --seconds 1 --csv" "bench_apply --model $M --tokens 1 --reps 1 --csv"; do
    [ -x "$BUILD/bench/${b%% *}" ] || { bad "${b%% *} not built"; continue; }
    echo victim > "$T/bvictim"; ln -sf bvictim "$T/blink"
    (cd . && $BUILD/bench/$b "$T/blink") >"$T/o" 2>"$T/e"; rc=$?
    if [ $rc != 0 ] && grep -q "symbolic link" "$T/e" && [ "$(cat "$T/bvictim")" = victim ]; then ok; else
        bad "${b%% *} --csv at a symlink (rc $rc)"; fi
done

# the benchmarks' CSV never over their input; bench io's default corpus
# (data/gpl3.tok, relative: a copy in a scratch folder) neither
cp "$T/tok" "$T/btok"
expect_rc 2 "same file" "bench_core --csv over --tokens" "$BUILD/bench/bench_core" --tokens "$T/btok" --csv "$T/btok"
expect_rc 2 "same file" "bench_sessions --csv over MODEL" "$BUILD/bench/bench_sessions" "$M" --csv "$M"
expect_rc 2 "same file" "bench_apply --csv over --model" "$BUILD/bench/bench_apply" --model "$M" --csv "$M"
mkdir -p "$T/cwd/data" && cp "$T/tok" "$T/cwd/data/gpl3.tok"
( cd "$T/cwd" && exec "$E" bench io "$M" --sections c --csv data/gpl3.tok ) >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 2 ] && grep -q "same file" "$T/e" && cmp -s "$T/cwd/data/gpl3.tok" "$T/tok"; then ok; else bad "bench io --csv over the default corpus (rc $rc)"; fi

# bench io: a bad --depths item is named whole (it was printed from freed
# memory), --seconds and --sections are checked
"$E" bench io "$M" --depths 4,0 >"$T/o" 2>"$T/e"; rc=$?
if [ $rc = 2 ] && [ "$(head -1 "$T/e")" = "engram: bench io: bad depth '0'" ]; then ok; else bad "bench io --depths 4,0 (rc $rc): $(head -1 "$T/e")"; fi
for s in -1 0 nan abc inf 1e9; do
    expect_rc 2 "seconds" "bench io --seconds $s" "$E" bench io "$M" --seconds "$s"
done
for s in xyz "" ab7; do
    expect_rc 2 "sections" "bench io --sections '$s'" "$E" bench io "$M" --sections "$s"
done

# every exit 3 says what failed, under address-space limits from 5 MiB up
# (plain builds only: a sanitizer reserves more address space than that)
case $BUILD in *san*) ;; *)
    quiet=0; runs=0; failed=0; : > "$T/oomcmds"
    for kb in 5120 5632 6144 7168 8192 12288 16384 24576 32768 49152 98304; do
        for c in apply kv quantize dequantize build hash rows verify run; do
            case $c in
            hash) ( ulimit -v $kb; exec "$E" hash "$M" --tokens "$T/tok" --summary >"$T/o" 2>"$T/e" ) ;;
            rows) ( ulimit -v $kb; exec "$E" rows "$M" --table 1 1 2 3 >"$T/o" 2>"$T/e" ) ;;
            verify) ( ulimit -v $kb; exec "$E" verify "$M" >"$T/o" 2>"$T/e" ) ;;
            run) ( ulimit -v $kb; exec "$E" run "$M" --tokens "$T/tok" --sessions 2 --decode 4 --layers 16 --layer-us 0 >"$T/o" 2>"$T/e" ) ;;
            *) ( ulimit -v $kb; wcmd $c "$T/oom" ) ;;
            esac
            rc=$?
            runs=$((runs + 1))
            [ $rc = 3 ] && failed=$((failed + 1)) && echo "$c" >> "$T/oomcmds"
            # (127: the loader itself could not map the libraries, and said so)
            if { [ $rc -gt 3 ] && [ $rc != 127 ]; } || { [ $rc != 0 ] && [ ! -s "$T/e" ]; }; then
                quiet=$((quiet + 1)); echo "  $c at $kb KiB: rc $rc, stderr $(wc -c < "$T/e") bytes" >&2; fi
        done
    done
    [ $quiet = 0 ] && ok || bad "$quiet of $runs runs under ulimit -v failed without a message or by a signal"
    # not vacuous: every command met the limit at least once
    n_cmds=$(sort -u "$T/oomcmds" | wc -l)
    echo "test_files.sh: under ulimit -v, $failed of $runs runs exited 3 with a message ($n_cmds of 9 commands)"
    [ "$n_cmds" = 9 ] && ok || bad "only $n_cmds of 9 commands met the memory limit: $(sort -u "$T/oomcmds" | tr '\n' ' ')"
    ;;
esac

finish test_files.sh
