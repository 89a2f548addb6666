# lib.sh - what the shell tests share.  Each sources it after `set -u`:
#   . "$(dirname "$0")/lib.sh"
#   tmpdir NAME          T: a private directory ($TMPDIR/engram-NAME-...),
#                        removed at exit with ALSO_REMOVE (one more path,
#                        test_fallback's copy on tmpfs) if set
#   ok / bad MESSAGE     a check passed / failed (FAIL: MESSAGE on stderr)
#   expect_rc RC NEEDLE DESCRIPTION COMMAND...
#                        COMMAND exits RC and says NEEDLE (stdout in
#                        $T/out, stderr in $T/err)
#   finish NAME          the closing line "NAME: N passed, N failed" and
#                        the exit status (0: none failed); the last command
pass=0
fail=0
ALSO_REMOVE=""

tmpdir() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/engram-$1-XXXXXX") || { echo "FAIL: mktemp" >&2; exit 1; }
    trap 'rm -rf "$T" ${ALSO_REMOVE:+"$ALSO_REMOVE"}' EXIT
}

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# (its variables are lib_*: a caller's own, d and rc among them, stay its own)
expect_rc() {
    lib_want=$1; lib_needle=$2; lib_what=$3; shift 3
    "$@" >"$T/out" 2>"$T/err"
    lib_rc=$?
    if [ "$lib_rc" -eq "$lib_want" ] && grep -q -- "$lib_needle" "$T/out" "$T/err"; then ok; else
        bad "$lib_what (rc $lib_rc, wanted $lib_want and '$lib_needle')"; head -3 "$T/err" >&2; fi
}

finish() {
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
