# lib.sh - what the shell tests share.  Each sources it after `set -u`:
#   . "$(dirname "$0")/lib.sh"
#   tmpdir NAME          T: a private directory ($TMPDIR/engram-NAME-...),
#                        removed at exit with ALSO_REMOVE (one more path,
#                        test_fallback's copy on tmpfs) if set, also when
#                        the test is ended by TERM, INT or HUP (run.sh's
#                        interruption sends TERM): once the command running
#                        then has ended
#   ok / bad MESSAGE     a check passed / failed (FAIL: MESSAGE on stderr)
#   expect_rc RC NEEDLE DESCRIPTION COMMAND...
#                        COMMAND exits RC and says NEEDLE (stdout in
#                        $T/out, stderr in $T/err)
#   mpi_env NAME [OPTION...]
#                        (after tmpdir) Open MPI for the MPI tests: NAME
#                        fails where there is no mpirun; MPIRUN the command
#                        (oversubscribed, as root), with the OPTIONs
#   finish NAME          the closing line "NAME: N passed, N failed" and
#                        the exit status (0: none failed); the last command
pass=0
fail=0
ALSO_REMOVE=""

tmpdir() {
    T=$(mktemp -d "${TMPDIR:-/tmp}/engram-$1-XXXXXX") || { echo "FAIL: mktemp" >&2; exit 1; }
    trap 'rm -rf "$T" ${ALSO_REMOVE:+"$ALSO_REMOVE"}' EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    trap 'exit 129' HUP
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

mpi_env() {
    lib_name=$1; shift
    command -v mpirun >/dev/null 2>&1 || { echo "$lib_name: no mpirun"; echo "$lib_name: 0 passed, 1 failed"; exit 1; }
    # In a container: root allowed, no CMA/ptrace single copy (vader's
    # default needs ptrace rights containers lack), shared memory and self
    # only, no session directory trouble in a private TMPDIR.
    export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader \
        OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        TMPDIR="$T"
    MPIRUN="mpirun --oversubscribe --allow-run-as-root${*:+ $*}"
}

finish() {
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
