#!/bin/sh
# test_ple_apply.sh - the PLE output stage against tests/ple_apply_ref.py,
# an independent numpy float64 reference of SPEC.md section 10's
# consumption: cases written by `test_ple_apply --dump` (synthetic BF16
# weights, a random start state, about 1 in 6 positions masked, a zero
# residual stream, run in random chunks with 2 threads) at W = 40 and at the
# real W = 2560, each over a sequence long enough for the dilated
# convolution's state to matter.
# Usage: tests/test_ple_apply.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
PY=${PY:-/usr/bin/python3}
tmpdir ple-apply

# run_ref NAME W N SEED
run_ref() {
    d="$T/$1"
    mkdir -p "$d"
    if "$BUILD/tests/test_ple_apply" --dump "$d" "$2" "$3" "$4" >"$T/out" 2>"$T/err"; then ok; else
        bad "$1: dump"; sed 's/^/    /' "$T/out" "$T/err" | tail -8 >&2; return; fi
    sed 's/^/    /' "$T/out"
    if "$PY" tests/ple_apply_ref.py check "$d" >"$T/out" 2>"$T/err"; then ok; else
        bad "$1: against the float64 reference"; fi
    sed 's/^/    /' "$T/out" "$T/err"
    rm -rf "$d"
}

run_ref w40 40 64 1
run_ref w2560 2560 40 2

finish test_ple_apply.sh
