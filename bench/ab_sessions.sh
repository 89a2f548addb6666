#!/bin/sh
# ab_sessions.sh OLD_REV [RUNS] [ARGS...] - bench_sessions before and after:
# the CURRENT bench/bench_sessions.c built twice, once against the library
# at OLD_REV (built in a temporary git worktree under /tmp, removed on exit)
# and once against this working tree's library, then run alternately RUNS
# times (default 3; old first in odd rounds, new first in even ones, so a
# drift of the machine does not favour one side), every run with the same
# ARGS (bench_sessions' own: [MODEL] [--sessions 16] ...) from this
# directory, hence on the same model file.  Each run's full output is
# printed labelled with its revision, then every run's summary line.
#
#   sh bench/ab_sessions.sh main 3 --seconds 10
#   sh bench/ab_sessions.sh HEAD 1 --seconds 5     (the same code twice: a noise check)
#
# The default model, build/demo.gguf, is written first if missing (build/engram
# build ... --base 16000 --width 64 --fill normal --seed 1).  Exit status 1 if
# a build or any run fails.
set -eu
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
fi
old=$1
shift
runs=3
case ${1:-} in
'' | *[!0-9]*) ;;
*) runs=$1; shift ;;
esac
[ "$runs" -ge 1 ] || { echo "ab_sessions: RUNS must be >= 1" >&2; exit 2; }
old_sha=$(git rev-parse --verify --quiet "$old^{commit}") || {
    echo "ab_sessions: '$old' is not a revision of this repository" >&2
    exit 2
}
head_sha=$(git rev-parse --short HEAD)
dirty=$(git status --porcelain --untracked-files=no | head -n 1)
old_label="old: $old ($(git rev-parse --short "$old_sha"))"
new_label="new: working tree ($head_sha${dirty:+, with uncommitted changes})"

# The model both sides read: the first argument that is not an option or an
# option's value (every option of bench_sessions takes one), else the default.
model=build/demo.gguf
skip=0
for a in "$@"; do
    if [ $skip = 1 ]; then skip=0; continue; fi
    case $a in
    -h | --help) ;;
    -*) skip=1 ;;
    *) model=$a; break ;;
    esac
done

tmp=$(mktemp -d /tmp/engram-ab.XXXXXX)
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    if [ -d "$tmp/old" ]; then
        git worktree remove --force "$tmp/old" 2>/dev/null || true
    fi
    rm -rf "$tmp"
    git worktree prune 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Compiled the same way for both sides (the Makefile's language and
# exactness flags; no -Werror: an old header may warn).
CFL="-std=c11 -D_GNU_SOURCE -O2 -g -fno-fast-math -ffp-contract=off -Wall -Wextra"
LIBS_SYS="-ljansson -lutf8proc -luring -lpthread -lm"
build_side() { # DIR OUT LOG
    # shellcheck disable=SC2086 # CFL and LIBS_SYS are word lists
    if ! (cd "$1" && make -j2 CUDA=0 build/libengram.a build/libengram-tools.a) >"$3" 2>&1 ||
        ! cc $CFL -I"$1/include" -o "$2" bench/bench_sessions.c \
            "$1/build/libengram-tools.a" "$1/build/libengram.a" $LIBS_SYS >>"$3" 2>&1; then
        echo "ab_sessions: building $2 failed; the end of $3:" >&2
        tail -n 30 "$3" >&2
        exit 1
    fi
}

echo "ab_sessions: building the library at $old ($old_sha) in $tmp/old"
git worktree add --detach --quiet "$tmp/old" "$old_sha"
build_side "$tmp/old" "$tmp/bench_old" "$tmp/build-old.log"
echo "ab_sessions: building this tree's library"
build_side "$PWD" "$tmp/bench_new" "$tmp/build-new.log"

if [ ! -f "$model" ] && [ "$model" = build/demo.gguf ]; then
    echo "ab_sessions: writing $model"
    make -j2 CUDA=0 build/engram >"$tmp/build-cli.log" 2>&1 || { tail -n 30 "$tmp/build-cli.log" >&2; exit 1; }
    build/engram build "$model" --base 16000 --width 64 --fill normal --seed 1
fi
[ -f "$model" ] || { echo "ab_sessions: no model at $model" >&2; exit 1; }
stamp() { stat -c '%s bytes, modified %y, inode %i' "$1"; }
model_id=$(stamp "$model")
echo "ab_sessions: model $model ($model_id), $runs round(s), args: $*"

fail=0
run_round() { # ROUND ARGS...
    r=$1
    shift
    if [ $((r % 2)) = 1 ]; then first=old second=new; else first=new second=old; fi
    run_one "$first" "$r" "$@"
    run_one "$second" "$r" "$@"
}
run_one() { # old|new ROUND ARGS...
    side=$1 r=$2
    shift 2
    if [ "$side" = old ]; then label=$old_label; else label=$new_label; fi
    echo
    echo "======== round $r, $label"
    set +e
    "$tmp/bench_$side" "$@" >"$tmp/out-$side-$r.txt" 2>&1
    rc=$?
    set -e
    cat "$tmp/out-$side-$r.txt"
    if [ $rc -ne 0 ]; then
        echo "ab_sessions: this run FAILED (exit $rc)"
        fail=1
    fi
}
i=1
while [ $i -le "$runs" ]; do
    run_round $i "$@"
    i=$((i + 1))
done

if [ "$(stamp "$model")" != "$model_id" ]; then
    echo "ab_sessions: $model changed during the runs: the sides are not comparable" >&2
    fail=1
fi
echo
echo "======== summaries (latencies in us, prompt times in ms)"
for side in old new; do
    if [ $side = old ]; then label=$old_label; else label=$new_label; fi
    echo "$label"
    i=1
    while [ $i -le "$runs" ]; do
        line=$(grep '^summary' "$tmp/out-$side-$i.txt" || echo "summary | (no summary: the run failed)")
        echo "  round $i ${line#summary }"
        i=$((i + 1))
    done
done
exit $fail
