#!/bin/sh
# run_shard_bench.sh [OUTDIR] - `engram run --shard` in one sitting (issue
# #24): the whole run (simulated layers, Engram at 1 and 14, prefill through
# the ring, decode steps) at N = 1, 2, 4 ranks: TP on the one file with the
# prefill chunks gathered (the default) and combined (--prefill-method
# combine), DP on the one file (unsharded pools), DP and TP on shard files
# (DP through the row exchange).  Two passes, the second in reverse order.
# Every run's --json to OUTDIR/run-P-NAME.json, a table to OUTDIR/summary.txt
# (printed): checksum (all must equal the one-process run's), prefill
# tokens/s, decode step p50/p99, rows read per token per rank, bytes moved
# per token, and the combine's (exchange's) time, exposed part and hidden
# share, decode and prefill apart.
#
#   sh bench/run_shard_bench.sh bench/results/2026-12-02-run-shard
#
# The model: /tmp/engram-runshard/m64.gguf (build/engram build ... --base
# 20000 --width 64 --fill normal --seed 5) and its shard sets for N = 2, 4,
# written first if missing.  Tokens: data/gpl3.tok twice over (15,102 tokens:
# 4 sessions of 3,775 tokens, a 2,048-token chunk and a
# partial one each), 32 decode steps, 43 layers of 100 us.  Exit 1 if a run
# fails or a checksum differs.
set -eu
cd "$(dirname "$0")/.."
out=${1:-bench/results/run-shard-$(date +%Y-%m-%d)}
E=build/engram
D=/tmp/engram-runshard
M=$D/m64.gguf
[ -f build/engram-mpi.so ] || { echo "run_shard_bench: build/engram-mpi.so not built" >&2; exit 1; }
mkdir -p "$out" "$D"
[ -f "$M" ] || "$E" build "$M" --base 20000 --width 64 --fill normal --seed 5 >/dev/null
for n in 2 4; do
    [ -d "$D/s$n" ] || "$E" shard "$M" --ranks "$n" --out "$D/s$n" >/dev/null
done
cat data/gpl3.tok data/gpl3.tok | tr -s ' \n' '\n\n' | grep -v '^$' >"$D/tok"
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    TMPDIR=$D
MPIRUN="mpirun --oversubscribe --allow-run-as-root -q"
RUN="--tokens $D/tok --sessions 4 --decode 32 --layer-us 100 --json"
{
    date -u
    uname -a
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket)'
    mpirun --version | head -1
    git rev-parse --short HEAD
    uptime
} >"$out/machine.txt" 2>&1
# NAME:NP:ARGS (ARGS with '+' for spaces; @ = this N's shard set)
runs="one:1:
tp-gather-2:2:--shard
tp-combine-2:2:--shard+--prefill-method+combine
dp-2:2:--shard+--dp
dp-files-2:2:--shard+--dp+@
tp-files-2:2:--shard+@
tp-gather-4:4:--shard
tp-combine-4:4:--shard+--prefill-method+combine
dp-4:4:--shard+--dp
dp-files-4:4:--shard+--dp+@"
rev=$(printf '%s\n' "$runs" | awk '{ a[NR] = $0 } END { for (i = NR; i > 0; i--) print a[i] }')
fail=0
for pass in 1 2; do
    list=$runs
    [ "$pass" = 2 ] && list=$rev
    for r in $list; do
        name=${r%%:*}; rest=${r#*:}; np=${rest%%:*}; args=$(printf '%s' "${rest#*:}" | tr '+' ' ')
        model=$M
        case " $args " in *" @ "*)
            model="$D/s$np/m64.shard-%r-of-%n.gguf"
            args=$(printf '%s' "$args" | sed 's/ *@//') ;;
        esac
        f="$out/run-$pass-$name.json"
        if [ "$np" = 1 ]; then
            "$E" run "$model" $RUN $args >"$f" 2>"$f.err" || { echo "FAILED: $name" >&2; fail=1; }
        else
            timeout 600 $MPIRUN -np "$np" "$E" run "$model" $RUN $args >"$f" 2>"$f.err" ||
                { echo "FAILED: $name (pass $pass)" >&2; fail=1; }
        fi
    done
done
/usr/bin/python3 - "$out" <<'PYEOF' | tee "$out/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(out, "run-*.json"))):
    try:
        d = json.load(open(f))
    except Exception as e:
        print("unreadable:", f, e); continue
    p, name = os.path.basename(f)[4:-5].split("-", 1)
    rows.append((name, p, d))
ref = {p: d["checksum"] for name, p, d in rows if name == "one"}
print("%-14s %s %-17s %8s %7s %7s %-22s %9s %26s %26s" % ("run", "P", "checksum", "pre t/s", "p50 ms",
      "p99 ms", "rows/token/rank", "B/token", "decode: total/exp ms, hid", "prefill: total/exp ms, hid"))
bad = 0
for name, p, d in sorted(rows, key=lambda r: (r[0], r[1])):
    s = d.get("shard") or {}
    R = s.get("ranks", [])
    per = [r["decode_rows_read_per_token"] for r in R] if R else [d["decode"]["rows_read"] / max(1, d["decode"]["tokens"])]
    ok = d["checksum"] == ref.get(p, ref.get("1"))
    bad += not ok
    x = s.get("exchange", {})
    if x.get("used"):
        dec, pre, bpt = x["decode"], x["prefill"], x["decode"]["bytes_per_token"]
    elif s:
        dec, pre = s["combine"]["decode"], s["combine"]["prefill"]
        bpt = dec["bytes_per_token"]
    else:
        dec = pre = None; bpt = 0
    def ct(c):
        if not c or not c.get("total_ns"): return "-"
        return "%.0f/%.0f, %.0f%%" % (c["total_ns"] / 1e6, c["exposed_ns"] / 1e6,
                                      100.0 * (c["total_ns"] - c["exposed_ns"]) / c["total_ns"])
    print("%-14s %s %-17s %8.0f %7.2f %7.2f %-22s %9.0f %26s %26s" % (name, p, d["checksum"] + ("" if ok else "!"),
          d["prefill"]["tokens_per_s"], d["decode"]["step_p50_ns"] / 1e6, d["decode"]["step_p99_ns"] / 1e6,
          "/".join("%.1f" % v for v in per), bpt, ct(dec), ct(pre)))
print("checksums differing from the one-process run: %d" % bad)
sys.exit(1 if bad else 0)
PYEOF
[ $? -eq 0 ] || fail=1
exit $fail
