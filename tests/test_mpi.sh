#!/bin/sh
# test_mpi.sh BUILD_DIR [NP...] - libengram-mpi under mpirun (issue #24):
# the combine of a sharded pool's shares at -np 2 and 4 (or the NPs given;
# oversubscribed on a small machine), and a rank that exits without joining;
# the DP exchange (test_mpi_exchange).  Needs mpirun and
# BUILD_DIR/tests/mpi/test_mpi_combine, test_mpi_exchange (built where
# mpicc is found).  An ASan build (BUILD_DIR build-san-address*): Open MPI's
# own leaks at finalize suppressed (tests/mpi/lsan_openmpi.supp says which
# and why), and a leak of ours (--leak) must still be reported; a TSan build
# (build-san-thread): Open MPI's own lock reports suppressed
# (tests/mpi/tsan_openmpi.supp).
# Ends with "test_mpi: N passed, N failed".
set -u
. "$(dirname "$0")/lib.sh"
B=${1:-build}
[ $# -gt 0 ] && shift
NPS=${*:-2 4}
P=$B/tests/mpi/test_mpi_combine
tmpdir mpi
[ -x "$P" ] || { echo "test_mpi: $P not built (no mpicc?)"; echo "test_mpi: 0 passed, 1 failed"; exit 1; }
mpi_env test_mpi -q
# a sanitizer's report in a run that exits non-zero by design
SANREP="WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"
case $B in *san-address*)
    # the slow unwinder: Open MPI has no frame pointers, and the
    # suppressions match frames past its first
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}:fast_unwind_on_malloc=0" \
        LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/mpi/lsan_openmpi.supp"
    # the control: a handle of ours never closed is reported, suppressions on
    timeout 120 $MPIRUN -np 2 "$P" --leak >"$T/leak" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -c "ERROR: LeakSanitizer" "$T/leak")" -eq 2 ] &&
        grep -q "in engram_mpi_open" "$T/leak"; then ok; else
        bad "ASan: a handle never closed was not reported (rc $rc)"; tail -20 "$T/leak" >&2; fi
    ;;
*san-thread*)
    export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}:suppressions=$(cd "$(dirname "$0")" && pwd)/mpi/tsan_openmpi.supp"
    ;;
esac

for np in $NPS; do
    # the checks: every rank prints "... N checks, 0 failed"
    timeout 300 $MPIRUN -np $np "$P" >"$T/out$np" 2>&1
    rc=$?
    good=$(grep -c "checks, 0 failed" "$T/out$np")
    if [ "$rc" -eq 0 ] && [ "$good" -eq "$np" ] && ! grep -q "WRONG ROWS" "$T/out$np"; then ok; else
        bad "-np $np: rc $rc, $good of $np ranks passed"; tail -20 "$T/out$np" >&2; fi
    grep "rows read" "$T/out$np" | head -1
    # a rank exits without joining: the job ends non-zero within the bound
    # (not killed by timeout: 124), and no rank reports wrong rows
    timeout 120 $MPIRUN -np $np "$P" --exit >"$T/exit$np" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && ! grep -q "WRONG ROWS" "$T/exit$np" &&
        ! grep -qE "$SANREP" "$T/exit$np"; then ok; else
        bad "-np $np, a rank exits without joining: rc $rc (0: success without it; 124: a hang)"
        tail -20 "$T/exit$np" >&2; fi
    # a rank that stalls (alive, never joining): every peer's timed wait
    # times out 10 times (no hang), then rank 0 ends the job
    timeout 120 $MPIRUN -np $np "$P" --stall >"$T/stall$np" 2>&1
    rc=$?
    peers=$(grep -c "stalled peer: 10 timeouts, then -110" "$T/stall$np")
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$peers" -ge 1 ] &&
        grep -q "rank 0: stalled peer: 10 timeouts, then -110" "$T/stall$np" &&
        ! grep -q "WRONG ROWS" "$T/stall$np" && ! grep -qE "$SANREP" "$T/stall$np"; then ok; else
        bad "-np $np, a stalled rank: rc $rc, $peers peers timed out as expected"; tail -20 "$T/stall$np" >&2; fi
done
# the DP exchange (requests out, rows back): every rank its own tokens and
# count, from the whole file and from shard files, against one process's
# reads; a late rank; an owner whose shard file is cut short
X=$B/tests/mpi/test_mpi_exchange
for np in $NPS; do
    timeout 300 $MPIRUN -np $np "$X" >"$T/xchg$np" 2>&1
    rc=$?
    good=$(grep -c "checks, 0 failed" "$T/xchg$np")
    if [ "$rc" -eq 0 ] && [ "$good" -eq "$np" ] && ! grep -q "WRONG ROWS" "$T/xchg$np"; then ok; else
        bad "exchange -np $np: rc $rc, $good of $np ranks passed"; tail -20 "$T/xchg$np" >&2; fi
done
# a phase MPI refuses to start on rank 0 while the phase's other
# collective is in flight: rank 0's wait names the call, the peer's times
# out, and the freed ops stay MPI's while a request is active (under ASan:
# no write into freed memory at the barriers after; the review's crash)
timeout 120 $MPIRUN -np 2 "$X" --refuse-rows >"$T/refuse" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c "refuse-rows rank .*checks, 0 failed" "$T/refuse")" -eq 2 ] &&
    ! grep -qE "$SANREP" "$T/refuse"; then ok; else
    bad "exchange, a phase refused: rc $rc"; tail -20 "$T/refuse" >&2; fi
# close with a parked op (the review's crash): rank 0 gives up on a combine
# the late rank has not joined and closes its handle; the barrier after it
# completes the collective and must not touch freed memory
timeout 120 $MPIRUN -np 2 "$P" --park >"$T/park" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c "after the barrier" "$T/park")" -eq 2 ] &&
    [ "$(grep -c "checks, 0 failed" "$T/park")" -eq 2 ]; then ok; else
    bad "close with a parked op: rc $rc"; tail -20 "$T/park" >&2; fi
finish test_mpi
