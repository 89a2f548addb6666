#!/bin/sh
# fuzz-campaign.sh TARGET [RUNS [SECONDS]] - a libFuzzer campaign outside the suite:
# `make fuzz`, then build-fuzz/fuzz_TARGET for RUNS executions (default 10
# million; at most SECONDS if given) on its corpus, tests/fuzz/corpus/TARGET
# (committed: campaigns go on where the last one stopped, on any machine, and
# the suite replays it), seeded from the committed seeds and regressions.
# To commit a grown corpus minimized: tools/fuzz-campaign.sh TARGET merge.  A crash is written to
# tests/fuzz/regressions/TARGET/ (the suite replays that directory) and
# fails the campaign.  TARGET: model, tokmap, cli, residual, ple.
set -eu
cd "$(dirname "$0")/.."
t=$1
runs=${2:-10000000}
limit=${3:+-max_total_time=$3}
make -s fuzz
corpus=tests/fuzz/corpus/$t
mkdir -p "$corpus" "tests/fuzz/regressions/$t"
case $t in
model) seeds=build-fuzz/seeds_model; sh tests/fuzz/make_seeds.sh "$seeds" build/engram; extra="" ;;
tokmap) seeds=tests/fuzz/tokmap_seeds; extra="-max_len=4096" ;;
cli) seeds=tests/fuzz/cli_seeds; extra="-max_len=4096" ;;
residual) seeds=tests/fuzz/residual_seeds; extra="-max_len=4200" ;;
ple) seeds=tests/fuzz/ple_seeds; extra="-max_len=4096" ;;
*) echo "unknown target $t" >&2; exit 2 ;;
esac
if [ "$runs" = merge ]; then # keep only the inputs that add coverage
    rm -rf "$corpus.new" && mkdir -p "$corpus.new"
    # shellcheck disable=SC2086
    build-fuzz/fuzz_$t -merge=1 $extra "$corpus.new" "$corpus" && rm -rf "$corpus" && mv "$corpus.new" "$corpus"
    exit
fi
# shellcheck disable=SC2086
exec build-fuzz/fuzz_$t -runs="$runs" $limit $extra -print_final_stats=1 \
    -artifact_prefix="tests/fuzz/regressions/$t/" "$corpus" "$seeds" "tests/fuzz/regressions/$t"
