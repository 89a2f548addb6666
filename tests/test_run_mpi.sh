#!/bin/sh
# test_run_mpi.sh BUILD_DIR - `engram run --shard` under mpirun (issue #24):
# at -np 2 and 4, tensor-parallel (every rank the same sessions, its row
# block read, rows combined) and --dp (sessions split across the ranks)
# give the checksum of the one-process run with the same options; in TP
# each rank reads about 48/N rows per token and the ranks' reads add up to
# the one-process run's exactly (each distinct row is one rank's), every
# rank ends with the same residuals; one rank (no mpirun) is a plain run;
# refusals: no plugin, a PLE model, --device cuda, --dp without --shard or
# with fewer sessions than ranks, ranks given different options.  On shard
# files (engram shard, MODEL with %r and %n): --dp through the DP exchange
# and TP give the one-process checksum at -np 2 and 4 (uneven sessions,
# two-chunk prompts); another rank's shard, another world's set and a file
# cut short are refused on every rank.  Needs
# mpirun and BUILD_DIR/engram-mpi.so (built where mpicc is found).
# Ends with "test_run_mpi: N passed, N failed".
set -u
. "$(dirname "$0")/lib.sh"
B=${1:-build}
E="$B/engram"
PY=/usr/bin/python3
tmpdir runmpi
[ -f "$B/engram-mpi.so" ] || { echo "test_run_mpi: $B/engram-mpi.so not built (no mpicc?)";
    echo "test_run_mpi: 0 passed, 1 failed"; exit 1; }
mpi_env test_run_mpi -q

M="$T/m.gguf"
"$E" build "$M" --base 20000 --width 64 --fill normal --seed 3 >/dev/null || bad "build"
head -c 9000 data/gpl3.tok | tr -s ' \n' '\n\n' | grep -v '^$' > "$T/tok"
RUN="--tokens $T/tok --decode 10 --layer-us 20 --json"

# the one-process run: checksum and reads, per session count
one() { # one B [MORE...] -> $T/one.json
    b=$1; shift
    "$E" run "$M" $RUN --sessions "$b" "$@" > "$T/one.json" 2>"$T/err" || { bad "one process, $b sessions"; cat "$T/err" >&2; }
}

check() { # check NAME NP B MODE [MORE...]: mpirun -np NP against $T/one.json
    name=$1; np=$2; b=$3; mode=$4; shift 4
    if [ "$mode" = dp ]; then more=--dp; else more=; fi
    timeout 120 $MPIRUN -np "$np" "$E" run "${MODEL:-$M}" ${RUNX:-$RUN} --sessions "$b" --shard $more "$@" > "$T/r.json" 2>"$T/err"
    rc=$?
    [ $rc -eq 0 ] || { bad "$name: rc $rc"; tail -5 "$T/err" >&2; return; }
    "$PY" - "$T/one.json" "$T/r.json" "$name" "$np" "$mode" "${MODEL:+shards}" <<'PYEOF'
import json, sys
one, d = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
name, np, mode = sys.argv[3], int(sys.argv[4]), sys.argv[5]
shards = len(sys.argv) > 6 and sys.argv[6] == "shards"
s = d["shard"]
errs = []
if d["checksum"] != one["checksum"]: errs.append("checksum %s != one process %s" % (d["checksum"], one["checksum"]))
if s["world"] != np or s["mode"] != mode: errs.append("world %s mode %s" % (s["world"], s["mode"]))
R = s["ranks"]
od, op = one["decode"], one["prefill"]
if mode == "tp":
    if s["checksums_agree"] is not True: errs.append("the ranks' residuals differ")
    # each distinct row is one rank's: the reads add up to one process's
    if sum(r["decode_rows_read"] for r in R) != od["rows_read"]: errs.append("decode reads do not add up")
    if sum(r["prefill_rows_read"] for r in R) != op["rows_read"]: errs.append("prefill reads do not add up")
    for r in R:
        if r["decode_tokens"] != od["tokens"]: errs.append("rank %d: %d decode tokens" % (r["rank"], r["decode_tokens"]))
        x = r["decode_rows_read_per_token"]
        if not 0.6 * 48 / np <= x <= 1.4 * 48 / np: errs.append("rank %d: %.2f rows per token" % (r["rank"], x))
    c = s["combine"]["decode"]
    if c["bytes_per_token"] != 48 * 512: errs.append("combine bytes per token %s" % c["bytes_per_token"])
    if c["calls"] != 2 * od["steps"]: errs.append("combine calls %d" % c["calls"])
    if c["hidden_ns"] + c["exposed_ns"] != c["total_ns"] or c["exposed_ns"] > c["total_ns"]: errs.append("combine time")
    # one combine per prefill chunk and table (the pool's chunks count both tables')
    p = s["combine"]["prefill"]
    if p["calls"] != op["chunks"]: errs.append("prefill combine calls %d of %d chunks" % (p["calls"], op["chunks"]))
    if p["bytes"] != op["tokens"] * 48 * 512: errs.append("prefill buffer bytes %d" % p["bytes"])
    # gather (the default): each row is one rank's and the other N - 1 receive it
    recv = sum(r["prefill_bytes_received"] for r in R)
    if p["method"] == "MPI_Iallgatherv":
        if recv != (np - 1) * op["tokens"] * 48 * 512: errs.append("prefill rows received: %d bytes" % recv)
    elif p["method"] != "MPI_Iallreduce BOR" or recv != 0: errs.append("prefill method %s" % p["method"])
    for k, c in (("decode", c), ("prefill", p)):
        if c["complete_before_wait"] > c["calls"] or c["late_ns"] > c["total_ns"] or c["hidden_ns"] + c["exposed_ns"] != c["total_ns"]:
            errs.append("%s combine figures %s" % (k, c))
else:
    if sum(r["sessions"] for r in R) != one["sessions"]: errs.append("sessions")
    if sum(r["decode_tokens"] for r in R) != od["tokens"]: errs.append("decode tokens")
    if s["combine"]["decode"]["calls"] != 0: errs.append("DP combined")
    x = s["exchange"]
    if x["used"] != shards: errs.append("exchange used %s on %s" % (x["used"], "shard files" if shards else "one file"))
    if shards:
        # every rank its block only: its tokens' rows from the owners.  What
        # the ranks asked of others is what the others sent; every decode
        # row is read by one rank, the ranks' reads at least the one
        # process's (which dedupes across every session of a step) and at
        # most 48 a token; about (N-1)/N of a token's 48 rows come from
        # other ranks, a row of 512 B and its 4 B request each
        for ph in ("decode", "prefill"):
            if sum(r["exchange_%s_rows_remote" % ph] for r in R) != sum(r["exchange_%s_rows_sent" % ph] for r in R):
                errs.append("%s rows asked of others != rows sent" % ph)
        rd = sum(r["decode_rows_read"] for r in R)
        if not od["rows_read"] <= rd <= 48 * od["tokens"]: errs.append("decode rows read %d (one process %d)" % (rd, od["rows_read"]))
        for r in R:
            if r["decode_rows_read"] == 0 or r["exchange_decode_rows_remote"] == 0: errs.append("rank %d idle" % r["rank"])
        bpt = x["decode"]["bytes_per_token"]
        if not 0.6 * 48 * (np - 1) / np * 516 <= bpt <= 48 * (np - 1) / np * 516 * 1.1: errs.append("bytes per token %.0f" % bpt)
        if x["decode"]["calls"] != od["steps"]: errs.append("exchanges %d" % x["decode"]["calls"])
        print("  rows read per rank (decode, prefill): %s; bytes per token moved (rank 0): decode %.0f, prefill %.0f; "
              "exchange per decode step (rank 0): %.2f ms" % ([(r["decode_rows_read"], r["prefill_rows_read"]) for r in R],
              bpt, x["prefill"]["bytes_per_token"], x["decode"]["total_ns"] / 1e6 / max(1, x["decode"]["calls"])))
print("%s: checksum %s, rows read per token %s, combine %s%s" % (name, d["checksum"],
      [r["decode_rows_read_per_token"] for r in R],
      "%.0f%% / %.0f%% hidden (decode / prefill)" % tuple(100.0 * s["combine"][k]["hidden_ns"] / max(1, s["combine"][k]["total_ns"]) for k in ("decode", "prefill")),
      "" if not errs else "  <- " + "; ".join(errs)))
sys.exit(1 if errs else 0)
PYEOF
    if [ $? -eq 0 ]; then ok; else bad "$name"; fi
}

one 4
check "-np 2 TP, 4 sessions" 2 4 tp
check "-np 2 DP, 4 sessions" 2 4 dp
check "-np 4 TP, 4 sessions" 4 4 tp
check "-np 4 DP, 4 sessions" 4 4 dp
one 3
check "-np 2 DP, 3 sessions (uneven)" 2 3 dp
check "-np 4 TP, 3 sessions" 4 3 tp
one 1 --no-overlap
check "-np 2 TP, 1 session, no overlap" 2 1 tp --no-overlap
one 3
check "-np 2 TP, 3 sessions, prefill by allreduce" 2 3 tp --prefill-method combine
check "-np 4 TP, 3 sessions, prefill by allreduce" 4 3 tp --prefill-method combine

# shard files (engram shard): --dp gets each token's rows from their owners
# through the exchange (every rank holds its block only), TP reads its own;
# MODEL names each rank's file with %r and %n
"$E" shard "$M" --ranks 2 --out "$T/s2" >/dev/null && "$E" shard "$M" --ranks 4 --out "$T/s4" >/dev/null || bad "engram shard"
# sh: assignments before a function call may stay: set and clear them here
onshards() { MODEL=$1; shift; check "$@"; MODEL=; RUNX=; }
one 4
onshards "$T/s2/m.shard-%r-of-%n.gguf" "shard files -np 2 DP, 4 sessions" 2 4 dp
onshards "$T/s4/m.shard-%r-of-%n.gguf" "shard files -np 4 DP, 4 sessions" 4 4 dp
onshards "$T/s2/m.shard-%r-of-%n.gguf" "shard files -np 2 TP, 4 sessions" 2 4 tp
one 5
onshards "$T/s4/m.shard-%r-of-%n.gguf" "shard files -np 4 DP, 5 sessions (uneven)" 4 5 dp
# prompts of two chunks (2,048 + 465 tokens), ranks with 2 and 1 sessions:
# the rank with fewer chunks serves the others in the rounds it has none
tr -s ' \n' '\n\n' < data/gpl3.tok | grep -v '^$' > "$T/tokL"
RUNX="--tokens $T/tokL --decode 4 --layer-us 20 --json"
"$E" run "$M" $RUNX --sessions 3 > "$T/one.json" 2>"$T/err" || bad "one process, long prompts"
onshards "$T/s2/m.shard-%r-of-%n.gguf" "shard files -np 2 DP, 3 sessions, 2-chunk prompts" 2 3 dp
# refusals: another rank's shard, another world's set (a file missing)
expect_rc 1 "was given shard 0 of 2" "a rank given another rank's shard" \
    timeout 120 $MPIRUN -np 2 "$E" run "$T/s2/m.shard-0-of-2.gguf" $RUN --sessions 2 --shard --dp
expect_rc 1 "was given shard" "shard files of another world" \
    timeout 120 $MPIRUN -np 2 "$E" run "$T/s4/m.shard-%r-of-4.gguf" $RUN --sessions 2 --shard --dp
# a shard file cut short: its rank cannot open it, and every rank refuses
# (no hang, exit 1), the others saying a rank's model did not open
mkdir "$T/cut" && cp "$T/s2/"*.gguf "$T/cut/" && truncate -s -1000 "$T/cut/m.shard-1-of-2.gguf"
expect_rc 1 "some did not open" "a shard file cut short" \
    timeout 120 $MPIRUN -np 2 "$E" run "$T/cut/m.shard-%r-of-%n.gguf" $RUN --sessions 2 --shard --dp

# one rank without mpirun: a plain run, said so
one 2
"$E" run "$M" $RUN --sessions 2 --shard > "$T/r.json" 2>"$T/err"
if [ $? -eq 0 ] && "$PY" -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(0 if a['checksum'] == b['checksum'] and b['shard']['mode'] == 'one process' else 1)" "$T/one.json" "$T/r.json"
then ok; else bad "--shard as one process"; cat "$T/err" >&2; fi
# the text report: the ranks' lines and the combine's
timeout 120 $MPIRUN -np 2 "$E" run "$M" --tokens "$T/tok" --decode 4 --layer-us 20 --sessions 2 --shard > "$T/text" 2>"$T/err"
if grep -q "^shard:   2 ranks, TP" "$T/text" && grep -q "^         rank 1: 2 sessions; decode .* per token (of 48)" "$T/text" \
    && grep -q "^combine: MPI_Iallreduce .* bytes per token combined" "$T/text" \
    && grep -q "^         decode: begin to completion .* ms .*, exposed (waiting) .* ms, hidden .* ms" "$T/text" \
    && grep -q "^         prefill: begin to completion .* ms .*, exposed (waiting) .* ms, hidden .* ms" "$T/text" \
    && [ "$(grep -c '^checksum' "$T/text")" -eq 1 ]; then ok; else bad "text report"; cat "$T/text" "$T/err" >&2; fi

# refusals
expect_rc 1 "run: --shard needs MPI: no file /nonexistent" "no plugin (\$ENGRAM_MPI_PLUGIN)" \
    env ENGRAM_MPI_PLUGIN=/nonexistent "$E" run "$M" $RUN --sessions 1 --shard
mkdir "$T/bin" && cp "$E" "$T/bin/engram"
expect_rc 1 "no engram-mpi.so next to the engram executable" "no plugin next to the binary" \
    "$T/bin/engram" run "$M" $RUN --sessions 1 --shard
expect_rc 2 "run: --shard runs on the CPU" "--shard --device cuda" \
    "$E" run "$M" $RUN --sessions 1 --shard --device cuda
expect_rc 2 "run: --dp is a mode of --shard" "--dp alone" "$E" run "$M" $RUN --sessions 1 --dp
expect_rc 2 "needs prefetch" "--shard --no-prefetch" "$E" run "$M" $RUN --sessions 1 --shard --no-prefetch
expect_rc 2 "is gather or combine" "--prefill-method other" "$E" run "$M" $RUN --sessions 1 --shard --prefill-method ring
expect_rc 2 "an option of --shard without --dp" "--prefill-method with --dp" \
    "$E" run "$M" $RUN --sessions 1 --shard --dp --prefill-method gather
"$E" build "$T/ple.gguf" --arch qwen4exp --base 20011 --width 64 --fill normal --seed 3 >/dev/null || bad "PLE build"
expect_rc 1 "--shard is V4.1's" "PLE --shard" "$E" run "$T/ple.gguf" $RUN --sessions 1 --shard
expect_rc 2 "needs --sessions >= 4" "--dp, fewer sessions than ranks" \
    timeout 120 $MPIRUN -np 4 "$E" run "$M" $RUN --sessions 2 --shard --dp
expect_rc 2 "were not given the same model, tokens and options" "ranks given different options" \
    timeout 120 $MPIRUN -np 1 "$E" run "$M" $RUN --sessions 2 --shard : -np 1 "$E" run "$M" $RUN --sessions 3 --shard
# the command links no MPI
if ldd "$E" | grep -q "libmpi"; then bad "engram links libmpi"; else ok; fi
finish test_run_mpi
