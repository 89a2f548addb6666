#!/bin/sh
# test_envfail.sh - failures of the CLI's own environment, injected into the
# real `engram` process by tests/envfail_preload.so (LD_PRELOAD; release
# build only, as sanitizer runtimes must come first):
#  - `engram run`: the model cannot be opened again, or not mapped, to count
#    its resident pages (the run completes and says why the page-cache
#    figure is missing: text and JSON); /proc/self/exe cannot be read when it
#    looks for the demo model (it stops and says to give --model);
#  - `engram apply`: its residual input fails to read (EIO);
#  - `engram bench io`: the model cannot be mapped to count resident pages
#    (n/a in the table, no growth rows in the CSV, the reason on stderr);
#    the token corpus's buffer cannot grow, at two sizes (the
#    corpus is refused with the reason, not benchmarked shorter), and a
#    corpus that does not exist.
# Each check also sees the shim's log line, so a check cannot pass with the
# shim inactive.
# Usage: tests/test_envfail.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
SO="$(cd "$BUILD/tests" && pwd)/envfail_preload.so"
tmpdir envfail
# shim KIND: the shim's log shows a failure of KIND was injected
shim() { if grep -q "$1" "$T/log" 2>/dev/null; then ok; else bad "the shim injected no '$1'"; fi; rm -f "$T/log"; }
runs() { # runs DESCRIPTION COMMAND... (stdout to $T/out, stderr to $T/err): it exits 0
    d=$1; shift
    if "$@" > "$T/out" 2> "$T/err"; then ok; else bad "$d: rc $?"; cat "$T/err" >&2; fi
}
has() { # has FILE NEEDLE DESCRIPTION
    if grep -q -- "$2" "$1"; then ok; else bad "$3: no '$2' in $1"; sed 's/^/    /' "$1" | tail -5 >&2; fi
}

M="$T/m.gguf"
"$E" build "$M" --base 3000 --width 64 --fill normal --seed 2 >/dev/null || bad "build"
head -c 3000 data/gpl3.tok > "$T/tok"
RUN="run $M --tokens $T/tok --sessions 2 --decode 8 --layer-us 5"

# the model opened by the library (once), then refused: run completes
# shellcheck disable=SC2086
runs "run, reopen refused" env ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_OPEN="$M" ENGRAM_FAIL_OPEN_SKIP=1 \
    LD_PRELOAD="$SO" "$E" $RUN
has "$T/out" "page cache of the tables not counted ($M: Permission denied)" "run, reopen refused"
has "$T/out" "checksum of the final residuals" "run, reopen refused"
shim "open refused"
# shellcheck disable=SC2086
runs "run --json, reopen refused" env ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_OPEN="$M" \
    ENGRAM_FAIL_OPEN_SKIP=1 LD_PRELOAD="$SO" "$E" $RUN --json
if /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d["page_cache_growth_pages"] is None and d["page_cache_error"] == "Permission denied" else 1)
' "$T/out"; then ok; else bad "run --json, reopen refused: growth not null with the reason"; cat "$T/out" >&2; fi
shim "open refused"
# the mapping refused
# shellcheck disable=SC2086
runs "run, mmap refused" env ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_MMAP="$M" LD_PRELOAD="$SO" "$E" $RUN
has "$T/out" "page cache of the tables not counted ($M: No such device)" "run, mmap refused"
shim "mmap refused"
# no /proc/self/exe: no demo model, and nothing written anywhere
(cd "$T" && ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_READLINK=/proc/self/exe LD_PRELOAD="$SO" \
    "$OLDPWD/$E" run --decode 2 > "$T/out" 2> "$T/err")
rc=$?
if [ "$rc" -eq 3 ]; then ok; else bad "run without /proc/self/exe: rc $rc, wanted 3"; fi
has "$T/err" "(/proc/self/exe: No such file or directory); give --model" "run without /proc/self/exe"
if grep -q "writing the demo model" "$T/err"; then bad "run without /proc/self/exe went on"; else ok; fi
shim "readlink refused"

# apply: its residual input fails to read (EIO): the error named, nothing
# (under a time limit: a mutant that ignores the error spins)
# left under the output's name
n=$(wc -w < "$T/tok")
head -c $((n * 4 * 64 * 4)) /dev/zero > "$T/resid"
ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_PREAD="$T/resid" LD_PRELOAD="$SO" timeout 60 \
    "$E" apply "$M" --layer 1 --tokens "$T/tok" --residual-in "$T/resid" --residual-out "$T/out.f32" \
    > "$T/out" 2> "$T/err"
rc=$?
if [ "$rc" -ne 0 ]; then ok; else bad "apply with a failing residual read exited 0"; fi
has "$T/err" "Input/output error" "apply, residual read refused"
left=0
for f in "$T"/*out.f32* "$T"/.*out.f32*; do [ -e "$f" ] && left=1; done
if [ "$left" -eq 0 ]; then ok; else bad "apply left an output behind"; ls -a "$T" >&2; fi
shim "pread refused"

# bench io, prefill section only, on a table large enough to read
B="$T/bench.gguf"
"$E" build "$B" --base 20000 --fill pool >/dev/null || bad "build bench model"
BENCH="bench io $B --sections c --max-tokens 3000 --corpus $T/tok --csv $T/b.csv"
# shellcheck disable=SC2086
runs "bench io, mmap refused" env ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_MMAP="$B" LD_PRELOAD="$SO" "$E" $BENCH
has "$T/err" "page-cache growth not counted (mapping $B: No such device)" "bench io, mmap refused"
if grep -q "tok .* n/a .* n/a .* n/a" "$T/out"; then ok; else bad "bench io, mmap refused: growth not n/a"; cat "$T/out" >&2; fi
if grep -q "engram_rows_per_s" "$T/b.csv" && ! grep -q "growth" "$T/b.csv"; then ok; else
    bad "bench io, mmap refused: CSV rows"; cat "$T/b.csv" >&2; fi
shim "mmap refused"
# the corpus buffer's growth to 4096 tokens (16384 bytes) and to 8192 (32768 bytes)
head -c 40000 data/gpl3.tok > "$T/tok5k"
if [ "$(wc -w < "$T/tok5k")" -gt 4096 ]; then ok; else bad "the corpus for the growth has no more than 4096 tokens"; fi
for size in 16384 32768; do
    # shellcheck disable=SC2086
    ENGRAM_ENVFAIL_LOG="$T/log" ENGRAM_FAIL_ALLOC=$size LD_PRELOAD="$SO" \
        "$E" bench io "$B" --sections c --corpus "$T/tok5k" > "$T/out" 2> "$T/err"
    has "$T/err" "corpus file '$T/tok5k': out of memory" "bench io, corpus allocation of $size bytes"
    if grep -q "tok5k .*[0-9]" "$T/out"; then bad "bench io benchmarked a corpus it could not hold"; else ok; fi
    shim "allocation refused"
done
# a corpus that does not exist: refused with the reason, the run goes on
"$E" bench io "$B" --sections c --corpus "$T/nonexistent" > "$T/out" 2> "$T/err"
has "$T/err" "cannot read corpus file '$T/nonexistent': No such file or directory" "bench io, missing corpus"
finish test_envfail
