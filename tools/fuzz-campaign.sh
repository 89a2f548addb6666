#!/bin/sh
# fuzz-campaign.sh TARGET [RUNS [SECONDS]] - a libFuzzer campaign outside the suite:
# `make fuzz`, then build-fuzz/fuzz_TARGET for RUNS executions (default 10
# million; at most SECONDS if given) on its corpus (build-fuzz/corpus_TARGET, kept between campaigns)
# seeded from the committed seeds and regressions.  A crash is written to
# tests/fuzz/regressions/TARGET/ (the suite replays that directory) and
# fails the campaign.  TARGET: model, tokmap, cli, residual.
set -eu
cd "$(dirname "$0")/.."
t=$1
runs=${2:-10000000}
limit=${3:+-max_total_time=$3}
make -s fuzz
corpus=build-fuzz/corpus_$t
mkdir -p "$corpus" "tests/fuzz/regressions/$t"
case $t in
model) seeds=build-fuzz/seeds_model; sh tests/fuzz/make_seeds.sh "$seeds" build/engram; extra="" ;;
tokmap) seeds=tests/fuzz/tokmap_seeds; extra="-max_len=4096" ;;
cli) seeds=tests/fuzz/cli_seeds; extra="-max_len=4096" ;;
residual) seeds=tests/fuzz/residual_seeds; extra="-max_len=4200" ;;
*) echo "unknown target $t" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086
exec build-fuzz/fuzz_$t -runs="$runs" $limit $extra -print_final_stats=1 \
    -artifact_prefix="tests/fuzz/regressions/$t/" "$corpus" "$seeds" "tests/fuzz/regressions/$t"
