#!/bin/sh
# mpi_bench.sh [OUTDIR] [PASSES] [ARGS...] - issue #24's benchmark, one
# sitting: build/bench/mpi/bench_mpi under mpirun at N = 1, 2, 4 ranks (TP
# mode), each N replicated (every rank reads all 48 rows a token) and
# sharded (a rank its row block; steps combined by MPI_Iallreduce,
# prefill chunks gathered by MPI_Iallgatherv, and once more combined, for
# the comparison).  PASSES (default 2) passes over the 9 runs, the odd ones
# in the order N = 1, 2, 4 (replicated first), the even ones reversed, so a
# drift of the machine favours no side.  Every run gets its own seed (the
# pass and the run's place), so no run re-reads exactly the rows of
# another.  ARGS go to every run (bench_mpi's own: --steps, --prefill ...).
#
#   sh bench/mpi_bench.sh bench/results/2026-12-02-mpi 2
#
# Each run's output goes to OUTDIR/run-P-NP-VARIANT.txt, the RESULT lines
# also to OUTDIR/summary.txt, the machine to OUTDIR/machine.txt.  The
# model, /tmp/engram-mpibench/m64.gguf (W = 64, ~265 MB: build/engram build
# ... --base 20000 --width 64 --fill normal --seed 5), is written first if
# missing.  More ranks than cores are run oversubscribed (said so in each
# output).  Exit status 1 if any run fails (a library or MPI error, or a
# combined row that differs from engram_model_read_bf16: WRONG ROWS).
set -eu
cd "$(dirname "$0")/.."
case ${1:-} in -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2 ;;
esac
out=${1:-bench/results/mpi-$(date +%Y-%m-%d)}
[ $# -gt 0 ] && shift
passes=2
case ${1:-} in
'' | -*) ;;
*) passes=$1; shift ;;
esac
B=build/bench/mpi/bench_mpi
M=/tmp/engram-mpibench/m64.gguf
[ -x "$B" ] || { echo "mpi_bench: $B not built (make, with mpicc present)" >&2; exit 1; }
command -v mpirun >/dev/null 2>&1 || { echo "mpi_bench: no mpirun" >&2; exit 1; }
mkdir -p "$out" /tmp/engram-mpibench
[ -f "$M" ] || build/engram build "$M" --base 20000 --width 64 --fill normal --seed 5
# As tests/test_mpi.sh: root allowed (containers), no CMA single copy,
# shared memory and self only, the session directory in a private TMPDIR.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    TMPDIR=/tmp/engram-mpibench
MPIRUN="mpirun --oversubscribe --allow-run-as-root -q"
{
    date -u
    uname -a
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)'
    free -g | head -2
    mpirun --version | head -1
    git rev-parse --short HEAD
    ls -l "$M"
    df -h "$M" | tail -1
} >"$out/machine.txt" 2>&1
: >"$out/summary.txt"
fail=0
# VARIANT: r = replicated, s = sharded (prefill gathered), sc = sharded with prefill combined
runs_fwd="1:r 1:s 1:sc 2:r 2:s 2:sc 4:r 4:s 4:sc"
runs_rev="4:sc 4:s 4:r 2:sc 2:s 2:r 1:sc 1:s 1:r"
p=1
while [ "$p" -le "$passes" ]; do
    if [ $((p % 2)) -eq 1 ]; then list=$runs_fwd; else list=$runs_rev; fi
    i=0
    for r in $list; do
        np=${r%%:*} v=${r#*:}
        i=$((i + 1))
        case $v in
        r) mode="--mode replicated" ;;
        s) mode="--mode sharded --step-method combine --prefill-method gather" ;;
        sc) mode="--mode sharded --step-method combine --prefill-method combine" ;;
        esac
        f="$out/run-$p-np$np-$v.txt"
        echo "== pass $p, -np $np, $mode, seed $((p * 100 + i))" | tee "$f"
        # shellcheck disable=SC2086
        if timeout 600 $MPIRUN -np "$np" "$B" "$M" $mode --seed $((p * 100 + i)) "$@" >>"$f" 2>&1; then
            :
        else
            echo "mpi_bench: pass $p -np $np $v FAILED (rc $?)" | tee -a "$f" >&2
            fail=1
        fi
        grep '^RESULT' "$f" | sed "s/^/pass=$p /" | tee -a "$out/summary.txt"
    done
    p=$((p + 1))
done
exit $fail
