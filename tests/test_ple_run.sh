#!/bin/sh
# test_ple_run.sh - engram run on the family's second member (issue #22):
# a PLE demo (engram build --arch qwen4exp) runs B sessions through the
# pool (prefill through the prefetch ring with engram_prefill_apply, decode
# steps batched across sessions with engram_step_apply, each session's
# convolution state committed with its tokens), and its checksum equals a
# serial `engram apply --layer L` of each session's whole slice (residual
# seed:1+b, the state carried from call to call by apply itself): the
# session state machinery against the plain sequence apply.  The same bits
# with 1 and 3 sessions, 1 and 2 threads, overlap or not, every I/O engine
# forced, io_uring refused by seccomp and O_DIRECT refused.  The report:
# 16 rows per token, one table, no page-cache growth with O_DIRECT, read
# figures consistent; what a PLE run does not take is refused naming why.
# Usage: tests/test_ple_run.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
SR="$BUILD/tests/seccomp_run"
ND="$(cd "$BUILD/tests" && pwd)/envfail_preload.so" # with ENGRAM_FAIL_ODIRECT
PY=/usr/bin/python3
tmpdir plerun

M="$T/p.gguf"
"$E" build "$M" --arch qwen4exp --base 20011 --width 64 --fill normal --seed 3 >/dev/null || bad "build"
LAYER=$("$E" info "$M" --json | "$PY" -c "import json,sys; print(json.load(sys.stdin)['layer'])" 2>/dev/null)
[ -n "$LAYER" ] || { LAYER=1; bad "info --json names no PLE layer"; }
head -c 7000 data/gpl3.tok | tr -s ' \n' '\n\n' | grep -v '^$' > "$T/tok"
N=$(wc -l < "$T/tok")

serial() { # serial B -> FNV-1a 64 of every session's final residuals (engram apply)
    B=$1; slice=$((N / B)); : > "$T/all.f32"
    b=0
    while [ "$b" -lt "$B" ]; do
        sed -n "$((b * slice + 1)),$(((b + 1) * slice))p" "$T/tok" > "$T/s$b"
        "$E" apply "$M" --layer "$LAYER" --tokens "$T/s$b" --residual-in "seed:$((1 + b))" \
            --residual-out "$T/out" >/dev/null 2>"$T/err" || { bad "apply, session $b"; cat "$T/err" >&2; }
        cat "$T/out" >> "$T/all.f32"
        b=$((b + 1))
    done
    "$PY" -c "
import sys
h = 0xcbf29ce484222325
for c in open(sys.argv[1], 'rb').read():
    h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
print('%016x' % h)" "$T/all.f32"
}

check() { # check NAME WANT_CHECKSUM WANT_ENGINE PREFIX... -- RUN_ARGS...
    name=$1; want=$2; eng=$3; shift 3
    pre=""
    while [ "$1" != "--" ]; do pre="$pre $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if ! $pre "$E" run "$M" --tokens "$T/tok" --json "$@" > "$T/r.json" 2>"$T/err"; then
        bad "$name: engram run failed"; cat "$T/err" >&2; return
    fi
    "$PY" - "$T/r.json" "$want" "$name" "$eng" "$LAYER" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
want, name, eng, layer = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
errs = []
dec, pre = d["decode"], d["prefill"]
if d["member"] != "qwen3.8-ple": errs.append("member %s" % d["member"])
if d["rows_per_token"] != 16: errs.append("rows per token %s" % d["rows_per_token"])
if d["engram_layers"] != [layer]: errs.append("layers %s" % d["engram_layers"])
if dec["rows_requested"] != dec["tokens"] * 16: errs.append("decode rows requested != 16 per token")
if pre["rows_requested"] != pre["tokens"] * 16: errs.append("prefill rows requested != 16 per token")
for sec, x in (("prefill", pre), ("decode", dec)):
    if x["rows_read"] > x["rows_requested"]: errs.append("%s: distinct > requested" % sec)
    r, e, h = x["read_span_ns"], x["exposed_wait_ns"], x["hidden_ns"]
    if h + e != r or e > r or r == 0: errs.append("%s: read figures" % sec)
pt = dec["per_table"]
if len(pt["read_span_ns"]) != 1 or pt["read_span_ns"][0] != dec["read_span_ns"]: errs.append("per-table span")
if d["inconsistent"] != 0: errs.append("inconsistent %d" % d["inconsistent"])
if d["page_cache_growth_pages"] is None: errs.append("page cache not counted")
elif d["io"]["direct"] and d["page_cache_growth_pages"] > 0: errs.append("page cache grew")
if eng and d["io"]["engine"] != eng: errs.append("engine %s, wanted %s" % (d["io"]["engine"], eng))
if d["checksum"] != want: errs.append("checksum %s != serial apply %s" % (d["checksum"], want))
print("%s: %s; prefill %.0f tok/s, decode %.0f tok/s, decode reads %.0f%% hidden, page cache +%s, checksum %s%s" % (
    name, d["io"]["engine"], pre["tokens_per_s"], dec["tokens_per_s"],
    100.0 * dec["hidden_ns"] / max(dec["read_span_ns"], 1), d["page_cache_growth_pages"], d["checksum"],
    "" if not errs else "  <- " + "; ".join(errs)))
sys.exit(1 if errs else 0)
PYEOF
    if [ $? -eq 0 ]; then ok; else bad "$name"; fi
}

want1=$(serial 1)
want3=$(serial 3)
[ "$want1" != "$want3" ] && ok || bad "1 and 3 sessions give one checksum: the reference cannot tell"
check "1 session" "$want1" "" -- --sessions 1 --decode 12 --layer-us 20
check "3 sessions, 2 threads" "$want3" "" -- --sessions 3 --decode 10 --layer-us 20 --threads 2
check "3 sessions, no overlap" "$want3" "" -- --sessions 3 --decode 10 --layer-us 5 --no-overlap
check "3 sessions, 20 layers" "$want3" "" -- --sessions 3 --decode 6 --layers 20 --layer-us 50
for eng in uring threads buffered; do
    name=$eng; [ $eng = uring ] && name=io_uring
    check "ENGRAM_IO=$eng" "$want3" "$name" env ENGRAM_IO=$eng -- --sessions 3 --decode 8 --layer-us 5
done
check "io_uring refused (seccomp)" "$want3" threads "$SR" -- --sessions 3 --decode 8 --layer-us 5
case $BUILD in
*san*) ;; # a preloaded shim ahead of the sanitizer's runtime: the plain build checks it
*) check "O_DIRECT refused" "$want3" buffered env LD_PRELOAD="$ND" ENGRAM_FAIL_ODIRECT=1 -- --sessions 3 --decode 8 --layer-us 5 ;;
esac

# the text report names the member's layer and its rows per token
"$E" run "$M" --tokens "$T/tok" --sessions 2 --decode 4 --layer-us 0 > "$T/text" 2>"$T/err" || bad "text run"
if grep -q "the PLE layer at $LAYER" "$T/text" && grep -q "rows: 16 per token" "$T/text" \
    && ! grep -q "table 1" "$T/text"; then ok; else bad "text report"; cat "$T/text" >&2; fi

# refused, naming why (exit 1: the data, not the usage)
"$E" run "$M" --tokens "$T/tok" --decode 2 --device cuda >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "qwen3.8-ple model: its run applies on the CPU" "$T/err"; then ok; else bad "--device cuda: exit $rc, $(cat "$T/err")"; fi
"$E" run "$M" --tokens "$T/tok" --decode 2 --no-prefetch >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "no-prefetch is V4.1's" "$T/err"; then ok; else bad "--no-prefetch: exit $rc, $(cat "$T/err")"; fi
"$E" run "$M" --tokens "$T/tok" --decode 2 --layers "$LAYER" >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 2 ] && grep -q "more than $LAYER" "$T/err"; then ok; else bad "--layers $LAYER: exit $rc, $(cat "$T/err")"; fi

finish test_ple_run.sh
