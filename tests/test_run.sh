#!/bin/sh
# test_run.sh - engram run end to end: its report is internally consistent
# (distinct rows <= requested, hidden + exposed = read span exactly, exposed
# <= span, no page-cache growth of the tables with O_DIRECT), its read
# figures mean what they say (nothing hidden without layers to hide behind,
# nearly all hidden behind long layers) and its checksum equals a
# serial `engram apply` of the same tokens (layer 1, then layer 14, session
# by session, residual seed:1+b): prefetch vs serial reads, overlap vs
# none, 1 and 3 sessions, 1 and 2 threads all give the same bits.
# Usage: tests/test_run.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ENGRAM="$BUILD/engram"
PY=/usr/bin/python3
tmpdir run

M="$T/m.gguf"
"$ENGRAM" build "$M" --base 2000 --width 64 --fill normal --seed 3 >/dev/null || bad "build"
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
# the read figures: what the definitions promise, exactly (integers)
for sec, x in (("prefill", pre), ("decode", dec)):
    r, e, h = x["read_span_ns"], x["exposed_wait_ns"], x["hidden_ns"]
    if h + e != r: errs.append("%s: hidden + exposed != read span" % sec)
    if min(r, e, h, x["hidden_in_begin_ns"], x["wait_outside_span_ns"]) < 0: errs.append("%s: negative time" % sec)
    if e > r: errs.append("%s: exposed > read span" % sec)
    if x["hidden_in_begin_ns"] > h: errs.append("%s: hidden in the begin call > hidden" % sec)
    if r == 0: errs.append("%s: no read time" % sec)
    for k in ("read_span_ns", "exposed_wait_ns", "hidden_ns", "hidden_in_begin_ns", "wait_outside_span_ns"):
        if sec + "." + k not in d["definitions"]: errs.append("no definition of %s.%s" % (sec, k))
if not d["prefetch"] and (pre["exposed_wait_ns"] != pre["read_span_ns"] or pre["read_span_late_max_ns"]):
    errs.append("serial prefill: exposed != read")
pt = dec["per_table"]
for t in range(2):
    if pt["exposed_wait_ns"][t] > pt["read_span_ns"][t]: errs.append("table %d: exposed > its span" % t)
# a step's span ends at the later of its tables' last rows: at least either
# table's, at most both together
if not max(pt["read_span_ns"]) <= dec["read_span_ns"] <= sum(pt["read_span_ns"]): errs.append("per-table spans")
if d["inconsistent"] != 0: errs.append("%d steps or prompts contradict the definitions" % d["inconsistent"])
notes = []
if not d["overlap"] and dec["hidden_ns"] - dec["hidden_in_begin_ns"] > dec["read_span_ns"] * 0.10:
    # every read waited for before layer 0: between the begin call's return
    # and the last row the engine does nothing but call the waits back to
    # back.  A timing figure, so a note, not a failure (a busy machine can
    # deschedule the engine there)
    notes.append("note: no overlap, yet %.1f%% of the read span hidden outside the begin call" %
                 (100.0 * (dec["hidden_ns"] - dec["hidden_in_begin_ns"]) / dec["read_span_ns"]))
if dec["steps"] != d.get("steps_wanted", dec["steps"]): errs.append("steps")
if dec["rows_requested"] != dec["tokens"] * 48: errs.append("decode rows requested != 48 per token")
if d["page_cache_growth_pages"] is None: errs.append("page cache not counted: %s" % d.get("page_cache_error"))
elif d["io"]["direct"] and d["page_cache_growth_pages"] > 0: errs.append("page cache grew")
if d["checksum"] != want: errs.append("checksum %s != serial apply %s" % (d["checksum"], want))
print("%s: prefill %.0f tok/s, decode %.0f tok/s, decode reads %.0f%% hidden, checksum %s%s" % (
    name, pre["tokens_per_s"], dec["tokens_per_s"],
    100.0 * dec["hidden_ns"] / max(dec["read_span_ns"], 1), d["checksum"],
    "" if not errs else "  <- " + "; ".join(errs)))
for n in notes:
    print("    " + n)
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
# What the read figures mean, on runs whose answer is known by construction
# (not a speed test: the bounds hold on a loaded machine).
# --layer-us 0, 1 session: nothing lies between the begin call and the table-0
# wait but an empty layer 0, and between the table-0 and table-1 waits only
# the apply of table 0 to one token and 12 empty layers, so read time can be
# hidden only inside the begin call (reported apart as hidden_in_begin_ns: on
# a busy 2-core machine waking the I/O thread there can cost the engine its
# CPU for a few hundred us of a ~1 ms step) or behind that one-token apply
# when table 1's last row comes after table 0's.  The rest must stay small:
# <= 15% of the span (the old report said ~55% hidden here, counting table
# 1's reads as hidden while the engine was blocked on table 0).
# --layer-us 20000, 1 session, the fewest layers (15): layer 0 alone (20 ms)
# is many times a step's 48 reads (~1 ms here, rarely over 10 ms on a disk
# other jobs share), so nearly all the read time is hidden: >= 90%.
head -400 "$T/tok" > "$T/tok400"
head -40 "$T/tok" > "$T/tok40"
meaning() { # meaning NAME PYTHON-CONDITION ARGS...
    name=$1; cond=$2; shift 2
    if ! "$ENGRAM" run "$M" --json --sessions 1 "$@" > "$T/m.json" 2>"$T/err"; then
        bad "$name: engram run failed"; cat "$T/err" >&2; return
    fi
    "$PY" - "$T/m.json" "$name" "$cond" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
x = d["decode"]
r, h, e, b = x["read_span_ns"], x["hidden_ns"], x["exposed_wait_ns"], x["hidden_in_begin_ns"]
# the accounting must hold (a failure); the timing bound is what the
# figures mean on a quiet machine, printed as a note when a busy one misses
# it (timings are not asserted: tests/README.md)
ok = r > 0 and h + e == r and 0 <= b <= h
met = eval(sys.argv[3])
print("%s: decode read span %.3f ms, exposed %.3f ms, hidden %.1f%% (%.1f%% in the begin call)%s%s" % (
    sys.argv[2], r / 1e6, e / 1e6, 100.0 * h / max(r, 1), 100.0 * b / max(r, 1),
    "" if ok else "  <- the accounting does not add up",
    "" if met else "  (note: on a quiet machine " + sys.argv[3] + ")"))
sys.exit(0 if ok else 1)
PYEOF
    if [ $? -eq 0 ]; then ok; else bad "$name"; fi
}
meaning "nothing to hide behind (--layer-us 0)" "h - b <= 0.15 * r" --tokens "$T/tok400" --decode 32 --layer-us 0
meaning "long layers hide the reads (--layer-us 20000)" "h >= 0.90 * r" --tokens "$T/tok40" --decode 4 \
    --layers 15 --layer-us 20000
meaning "--no-overlap: exposed <= read span" "e <= r" --tokens "$T/tok400" --decode 16 --layer-us 0 --no-overlap
# the text report says what its figures cover
"$ENGRAM" run "$M" --tokens "$T/tok40" --sessions 1 --decode 2 --layer-us 0 > "$T/text" 2>"$T/err"
if grep -q "^         reads: span .* exposed .* hidden .* in the begin call" "$T/text" \
   && grep -q "^legend:  decode span = per step, from its begin to its last row" "$T/text"; then ok; else
    bad "the text report lacks its read figures or their legend"; cat "$T/text" >&2; fi
# --threads defaults to the CPUs the process may run on (nproc counts the
# affinity mask); pinned to one CPU by taskset, 1
default_threads() { # default_threads NAME WANT [taskset -c LIST]
    name=$1; want=$2; shift 2
    if "$@" "$ENGRAM" run "$M" --tokens "$T/tok40" --sessions 1 --decode 2 --layer-us 0 --json \
        > "$T/d.json" 2>"$T/err" &&
        got=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["threads"])' "$T/d.json") &&
        [ "$got" = "$want" ]; then ok; else
        bad "$name: threads ${got:-?}, want $want"; cat "$T/err" >&2; fi
}
# the affinity mask's CPUs, at most 256 (nproc would honour OMP_NUM_THREADS,
# which the library does not read)
default_threads "--threads by default = the affinity mask's CPUs" \
    "$("$PY" -c 'import os; print(min(256, len(os.sched_getaffinity(0))))')"
if command -v taskset >/dev/null 2>&1; then
    default_threads "--threads by default under taskset -c 0" 1 taskset -c "$(taskset -pc $$ | sed 's/.*: *//; s/[-,].*//')"
fi
# errors
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 100000 >/dev/null 2>"$T/err"
if [ $? -eq 1 ] && grep -q "fewer than --decode" "$T/err"; then ok; else bad "too short a stream"; fi
"$ENGRAM" run "$M" --layers 10 >/dev/null 2>&1
if [ $? -eq 2 ]; then ok; else bad "--layers 10"; fi
"$ENGRAM" build "$T/now.gguf" --base 2000 --fill normal >/dev/null
"$ENGRAM" run "$T/now.gguf" --tokens "$T/tok" --decode 2 >/dev/null 2>"$T/err"
if [ $? -eq 1 ] && grep -q "no projection weights" "$T/err"; then ok; else bad "model without weights"; fi
# devices: an unknown one is refused; cuda either runs (a GPU) or says why not
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 2 --device nope >/dev/null 2>"$T/err"
if [ $? -eq 2 ] && grep -q "unknown device 'nope'" "$T/err"; then ok; else bad "--device nope"; fi
# cuda-fast was removed (#25: short of the tolerance): an unknown device like any other
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 2 --device cuda-fast >"$T/out" 2>"$T/err"
rc=$?
if [ $rc -eq 2 ] && grep -q "unknown device 'cuda-fast' (cpu, cuda or cuda-fma)" "$T/err" && [ ! -s "$T/out" ]; then ok; else
    bad "--device cuda-fast (removed) must exit 2 as an unknown device (rc $rc)"; cat "$T/err" >&2; fi
"$ENGRAM" run "$M" --tokens "$T/tok" --decode 2 --sessions 1 --device cuda >/dev/null 2>"$T/err"
rc=$?
if [ $rc -eq 0 ] || { [ $rc -eq 3 ] && grep -qiE "cuda|nvidia|gpu|device" "$T/err"; }; then ok; else
    bad "--device cuda without a usable GPU must exit 3 naming the reason (rc $rc)"; cat "$T/err" >&2; fi

finish test_run.sh
