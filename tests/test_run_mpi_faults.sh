#!/bin/sh
# test_run_mpi_faults.sh BUILD_DIR - `engram run --shard` when a rank fails
# mid-run (issue #24, item 5): under mpirun, TP mode, a run of 2,000 decode
# steps (about 86 s of simulated layers) after a prompt of 20 tokens per
# session, and 2 s after every rank has the model open (mid-decode by a
# wide margin) this script, not the code under test, hurts one rank:
#  - kill -9 of one rank's process (found by its OMPI_COMM_WORLD_RANK in
#    /proc/PID/environ): the job ends non-zero within 60 s (not the
#    `timeout` guard's 124), and no checksum is printed;
#  - SIGSTOP of one rank (alive, never joining): with --shard-timeout 3 the
#    others' combine waits time out, a rank says so ("not complete after
#    3000000000 ns"), the job ends non-zero well before the run could have
#    finished, no checksum printed.
# A short run of the same command without a fault prints its checksum (the
# grep that finds none above does find one when there is one); usage of
# --shard-timeout (0, without --shard) is refused.  Needs mpirun and
# BUILD_DIR/engram-mpi.so (built where mpicc is found).
# Ends with "test_run_mpi_faults: N passed, N failed".
set -u
. "$(dirname "$0")/lib.sh"
B=${1:-build}
E="$B/engram"
tmpdir runmpif
[ -f "$B/engram-mpi.so" ] || { echo "test_run_mpi_faults: $B/engram-mpi.so not built (no mpicc?)";
    echo "test_run_mpi_faults: 0 passed, 1 failed"; exit 1; }
mpi_env test_run_mpi_faults
EXE=$(readlink -f "$E")

M="$T/m.gguf"
"$E" build "$M" --base 20000 --width 64 --fill normal --seed 3 >/dev/null || bad "build"
# 2 sessions x (2,000 decode + 20 prompt tokens); 43 layers of 1 ms a step
tr -s ' \n' '\n\n' < data/gpl3.tok | grep -v '^$' | head -4040 > "$T/tok"
RUN="--tokens $T/tok --layer-us 1000 --sessions 2 --shard"
now() { date +%s.%N; }
secs() { echo "$(now) - $1" | bc; }

victim= # the hurt rank's pid, for the cleanup
cleanup_victim() {
    [ -n "$victim" ] && kill -0 "$victim" 2>/dev/null && kill -CONT "$victim" 2>/dev/null && kill -9 "$victim" 2>/dev/null
    victim=
}

find_rank() { # find_rank R: $victim = rank R's engram process, once it has the model open
    victim=
    for _ in $(seq 300); do
        for p in $(pgrep -f "$M"); do
            [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$EXE" ] || continue
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" || continue
            ls -l "/proc/$p/fd" 2>/dev/null | grep -q "$M" && { victim=$p; return 0; }
        done
        sleep 0.1
    done
    return 1
}

fault() { # fault NAME NP RANK SIGNAL [MORE...]: rank RANK of NP gets SIGNAL mid-decode
    name=$1; np=$2; r=$3; sig=$4; shift 4
    t0=$(now)
    timeout 120 $MPIRUN -np "$np" "$E" run "$M" $RUN --decode 2000 "$@" > "$T/f.out" 2> "$T/f.err" &
    job=$!
    if ! find_rank "$r"; then
        bad "$name: rank $r's process not found"; wait "$job"; return 1
    fi
    sleep 2
    kill -"$sig" "$victim"
    wait "$job"
    rc=$?
    dt=$(secs "$t0")
    cleanup_victim
    sums=$(grep -c '^checksum' "$T/f.out")
    echo "$name: rc $rc after ${dt} s, $sums checksum lines"
    # 124: the timeout guard ended a hang; the run itself takes >= 86 s
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$(echo "$dt < 60" | bc)" -eq 1 ] && [ "$sums" -eq 0 ]; then ok; else
        bad "$name: rc $rc after $dt s, $sums checksum lines"; tail -5 "$T/f.err" >&2; fi
}

# the control: the same command, short and unhurt, prints one checksum
timeout 120 $MPIRUN -np 2 "$E" run "$M" $RUN --decode 20 > "$T/c.out" 2> "$T/c.err"
rc=$?
if [ "$rc" -eq 0 ] && [ "$(grep -c '^checksum' "$T/c.out")" -eq 1 ]; then ok; else
    bad "control run: rc $rc"; tail -5 "$T/c.err" >&2; fi

# a rank killed: mpirun sees it die and ends the others
fault "-np 2, rank 1 killed (SIGKILL)" 2 1 KILL
fault "-np 3, rank 0 killed (SIGKILL)" 3 0 KILL
# a rank stalled: the others' timed combine waits give up and end the job
fault "-np 2, rank 1 stopped (SIGSTOP), --shard-timeout 3" 2 1 STOP --shard-timeout 3
if grep -q "run: engram_mpi_combine_wait: not complete after 3000000000 ns" "$T/f.err"; then ok; else
    bad "-np 2 stall: no rank named the timeout"; tail -5 "$T/f.err" >&2; fi
fault "-np 3, rank 2 stopped (SIGSTOP), --shard-timeout 3" 3 2 STOP --shard-timeout 3
if grep -q "run: engram_mpi_combine_wait: not complete after 3000000000 ns" "$T/f.err"; then ok; else
    bad "-np 3 stall: no rank named the timeout"; tail -5 "$T/f.err" >&2; fi

expect_rc 2 "shard-timeout takes seconds >= 1" "--shard-timeout 0" "$E" run "$M" $RUN --shard-timeout 0
expect_rc 2 "is an option of --shard" "--shard-timeout without --shard" \
    "$E" run "$M" --tokens "$T/tok" --shard-timeout 5
finish test_run_mpi_faults
