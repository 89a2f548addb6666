#!/bin/sh
# test_run.sh - engram run end to end: its report is internally consistent
# (distinct rows <= requested, hidden + exposed = read time per table, no
# page-cache growth of the tables with O_DIRECT) and its checksum equals a
# serial `engram apply` of the same tokens (layer 1, then layer 14, session
# by session, residual seed:1+b): prefetch vs serial reads, overlap vs
# none, 1 and 3 sessions, 1 and 2 threads all give the same bits.
# Usage: tests/test_run.sh BUILD_DIR
set -u
BUILD=${1:-build}
ENGRAM="$BUILD/engram"
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/engram-run-XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

M="$T/m.gguf"
"$ENGRAM" build "$M" --base 20000 --width 64 --fill normal --seed 3 >/dev/null || bad "build"
head -c 9000 data/gpl3.tok | tr -s ' \n' '\n\n' | grep -v '^$' > "$T/tok"
N=$(wc -l < "$T/tok")

# serial reference checksum for B sessions: each session's slice of N/B tokens
serial() { # serial B -> prints FNV-1a 64 of all sessions' final residuals
    B=$1; slice=$((N / B)); : > "$T/all.f32"
    b=0
    while [ "$b" -lt "$B" ]; do
        sed -n "$((b * slice + 1)),$(((b + 1) * slice))p" "$T/tok" > "$T/s$b"
        "$ENGRAM" apply "$M" --layer 1 --tokens "$T/s$b" --residual-in "seed:$((1 + b))" \
            --residual-out "$T/l1" >/dev/null || bad "apply layer 1, session $b"
        "$ENGRAM" apply "$M" --layer 14 --tokens "$T/s$b" --residual-in "$T/l1" \
            --residual-out "$T/l14" >/dev/null || bad "apply layer 14, session $b"
        cat "$T/l14" >> "$T/all.f32"
        b=$((b + 1))
    done
    "$PY" -c "
import sys
h = 0xcbf29ce484222325
for c in open(sys.argv[1], 'rb').read():
    h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
print('%016x' % h)" "$T/all.f32"
}

check_report() { # check_report NAME WANT_CHECKSUM ARGS...
    name=$1; want=$2; shift 2
    if ! "$ENGRAM" run "$M" --tokens "$T/tok" --json "$@" > "$T/r.json" 2>"$T/err"; then
        bad "$name: engram run failed"; cat "$T/err" >&2; return
    fi
    "$PY" - "$T/r.json" "$want" "$name" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
want, name = sys.argv[2], sys.argv[3]
errs = []
dec, pre = d["decode"], d["prefill"]
if dec["rows_read"] > dec["rows_requested"]: errs.append("decode: distinct > requested")
if pre["rows_read"] > pre["rows_requested"]: errs.append("prefill: distinct > requested")
for t in range(2):
    if dec["hidden_ns"][t] + dec["exposed_ns"][t] != dec["read_ns"][t]:
        errs.append("table %d: hidden + exposed != read time" % t)
    if dec["hidden_ns"][t] < 0 or dec["exposed_ns"][t] < 0: errs.append("negative time")
if dec["hidden_total_ns"] + dec["exposed_total_ns"] != dec["read_total_ns"]: errs.append("totals")
if dec["steps"] != d.get("steps_wanted", dec["steps"]): errs.append("steps")
if dec["rows_requested"] != dec["tokens"] * 48: errs.append("decode rows requested != 48 per token")
if d["page_cache_growth_pages"] is None: errs.append("page cache not counted: %s" % d.get("page_cache_error"))
elif d["io"]["direct"] and d["page_cache_growth_pages"] > 0: errs.append("page cache grew")
if d["checksum"] != want: errs.append("checksum %s != serial apply %s" % (d["checksum"], want))
print("%s: prefill %.0f tok/s, decode %.0f tok/s, table 1 hidden %.0f%%, checksum %s%s" % (
    name, pre["tokens_per_s"], dec["tokens_per_s"],
    100.0 * dec["hidden_ns"][1] / max(dec["read_ns"][1], 1), d["checksum"],
    "" if not errs else "  <- " + "; ".join(errs)))
sys.exit(1 if errs else 0)
PYEOF
    if [ $? -eq 0 ]; then ok; else bad "$name"; fi
}

want1=$(serial 1)
want3=$(serial 3)
check_report "1 session" "$want1" --sessions 1 --decode 12 --layer-us 20
check_report "1 session, no prefetch, no overlap" "$want1" --sessions 1 --decode 12 --layer-us 20 --no-prefetch --no-overlap
check_report "3 sessions, 2 threads" "$want3" --sessions 3 --decode 10 --layer-us 20 --threads 2
check_report "3 sessions, no overlap" "$want3" --sessions 3 --decode 10 --layer-us 5 --no-overlap
check_report "3 sessions, long layers" "$want3" --sessions 3 --decode 4 --layer-us 300
# errors
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 100000 >/dev/null 2>"$T/err"
if [ $? -eq 1 ] && grep -q "fewer than --decode" "$T/err"; then ok; else bad "too short a stream"; fi
"$ENGRAM" run "$M" --layers 10 >/dev/null 2>&1
if [ $? -eq 2 ]; then ok; else bad "--layers 10"; fi
"$ENGRAM" build "$T/now.gguf" --base 20000 --fill normal >/dev/null
"$ENGRAM" run "$T/now.gguf" --tokens "$T/tok" --decode 2 >/dev/null 2>"$T/err"
if [ $? -eq 1 ] && grep -q "no projection weights" "$T/err"; then ok; else bad "model without weights"; fi
# devices: an unknown one is refused; cuda either runs (a GPU) or says why not
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 2 --device nope >/dev/null 2>"$T/err"
if [ $? -eq 2 ] && grep -q "unknown device 'nope'" "$T/err"; then ok; else bad "--device nope"; fi
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 2 --sessions 1 --device cuda >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 0 ] || { [ $rc -eq 3 ] && grep -qiE "cuda|nvidia|gpu|device" "$T/err"; }; then ok; else
    bad "--device cuda without a usable GPU must exit 3 naming the reason (rc $rc)"; cat "$T/err" >&2; fi

echo "test_run.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
