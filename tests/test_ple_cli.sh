#!/bin/sh
# test_ple_cli.sh - the engram command on a PLE (qwen4exp) model (issue #22):
# `info` names the member (text and JSON); `hash` gives SPEC.md section 10's
# known rows on Qwen3.8's full-size layout (a sparse file) and 16 ids per
# line; `rows` prints each row's 160 BF16 values as an independent reader
# of the file's bytes (Python) finds them; a file from a second,
# independent writer (tests/ple_gguf_writer.py) opens and hashes as
# engram's own; `verify` lists rows holding NaN or infinity (poked at
# offsets computed here), also past 4 GiB in a sparse file; `bench io`
# counts the rows that straddle blocks as this script does; `apply` agrees
# with an independent float64 computation (tests/ple_apply_cli_check.py)
# and gives the same bits whatever --threads and --chunk; `run` refuses
# the file naming the member.
# Usage: tests/test_ple_cli.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
E="$BUILD/engram"
tmpdir ple-cli
FULL="$T/full.gguf"; DEMO="$T/demo.gguf"
"$E" build "$FULL" --arch qwen4exp --width 64 >/dev/null || bad "build the full-size sparse file"
"$E" build "$DEMO" --arch qwen4exp --base 20011 --width 64 --fill normal --seed 3 >/dev/null || bad "build the demo"

expect_rc 0 "qwen3.8-ple member" "info names the member" "$E" info "$FULL"
grep -q "320001536 of 160 BF16 values" "$T/out" && ok || bad "info: the full-size row count"
"$E" info "$FULL" --json > "$T/info.json" 2>"$T/err"
/usr/bin/python3 - "$T/info.json" <<'PY' && ok || bad "info --json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["member"] == "qwen3.8-ple" and d["rows"] == 320001536 and d["row_bytes"] == 320
assert d["rows_per_token"] == 16 and d["vocab"] == 248320 and d["eos"] == 248044
assert d["state_floats"] == 9 * 4 * 64
PY

# SPEC section 10's known rows: heads 0, 7, 8, 15 of each prefix's last token
for seq in "9707:16410909 152932897 169641436 300984276" \
           "9707 11:18158303 159566246 175132467 307699687" \
           "9707 11 220:15029315 143479041 162897307 308764256"; do
    toks=${seq%%:*}; want=${seq#*:}
    echo "$toks" | "$E" hash "$FULL" --tokens - > "$T/h" 2>"$T/err" || bad "hash '$toks'"
    got=$(tail -1 "$T/h" | awk '{print $1, $8, $9, $16}')
    [ "$got" = "$want" ] && ok || bad "hash '$toks': $got, SPEC says $want"
done
[ "$(awk '{print NF}' "$T/h" | sort -u)" = 16 ] && ok || bad "hash: 16 ids per line"
# a mask entry 0 hashes its token as padding, i.e. as EOS
printf '9707 248044\n' | "$E" hash "$FULL" --tokens - > "$T/eos" 2>/dev/null
printf '9707 5\n' > "$T/tk"; printf '1 0\n' > "$T/mk"
"$E" hash "$FULL" --tokens "$T/tk" --mask "$T/mk" > "$T/pad" 2>/dev/null
cmp -s "$T/eos" "$T/pad" && ok || bad "hash: a masked token hashes as EOS"
expect_rc 1 "248320" "hash: an id >= vocab" sh -c "echo 248320 | '$E' hash '$FULL' --tokens -"
expect_rc 2 "V4.1 models only" "hash --summary" sh -c "echo 5 | '$E' hash '$FULL' --tokens - --summary"

# rows: the file's BF16 values, read independently
"$E" rows "$DEMO" --table 0 0 1 4242 321407 > "$T/rows" 2>"$T/err" || bad "rows"
/usr/bin/python3 - "$DEMO" "$T/rows" <<'PY' && ok || bad "rows: values differ from the file's bytes"
import json, struct, subprocess, sys
import numpy as np
path, out = sys.argv[1], sys.argv[2]
# the table: per_layer_token_embd.weight, found by a minimal GGUF v3 walk
f = open(path, "rb"); data = f.read(1 << 20)
def rd(fmt, o): return struct.unpack_from(fmt, data, o)
magic, ver, nt, nkv = rd("<IIQQ", 0); o = 24
def skip_val(t, o):
    sizes = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
    if t == 8: (n,) = rd("<Q", o); return o + 8 + n
    if t == 9:
        (et, n) = rd("<IQ", o); o += 12
        for _ in range(n): o = skip_val(et, o)
        return o
    return o + sizes[t]
align = 32
for _ in range(nkv):
    (n,) = rd("<Q", o); key = data[o+8:o+8+n].decode(); o += 8 + n
    (t,) = rd("<I", o); o += 4
    if key == "general.alignment": (align,) = rd("<I", o)
    o = skip_val(t, o)
tensors = {}
for _ in range(nt):
    (n,) = rd("<Q", o); name = data[o+8:o+8+n].decode(); o += 8 + n
    (nd,) = rd("<I", o); o += 4 + 8 * nd
    (t, off) = rd("<IQ", o); o += 12
    tensors[name] = off
start = (o + align - 1) // align * align
base = start + tensors["per_layer_token_embd.weight"]
rows = [0, 1, 4242, 321407]
got = np.loadtxt(out, dtype=np.float64, ndmin=2)
assert got.shape == (4, 160), got.shape
for i, r in enumerate(rows):
    f.seek(base + r * 320)
    b = np.frombuffer(f.read(320), dtype="<u2").astype(np.uint32) << 16
    want = b.view(np.float32)
    # %.9g round-trips a float32: read back as float32, the same bits
    assert np.array_equal(want.view(np.uint32), got[i].astype(np.float32).view(np.uint32)), r
assert np.any(got != 0)
PY
expect_rc 1 "out of range" "rows: past the table" "$E" rows "$DEMO" --table 0 321408
expect_rc 2 "one table" "rows: --table 1" "$E" rows "$DEMO" --table 1 0

# a second, independent writer (tests/ple_gguf_writer.py: its own layout
# derivation and GGUF packing, other key types, order and alignment, the
# vocabulary as a token list): the file opens and hashes as engram's own
PYW="$T/py.gguf"
/usr/bin/python3 tests/ple_gguf_writer.py "$PYW" 19999999 64 0 5 320001535 || bad "the Python writer"
"$E" info "$PYW" --json > "$T/pyinfo.json" 2>"$T/err" || bad "info on the Python writer's file"
/usr/bin/python3 - "$T/info.json" "$T/pyinfo.json" <<'PY' && ok || bad "info: the two writers' files differ in the family's numbers"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("member", "vocab", "eos", "ngram", "heads", "rows_per_token", "row_bytes", "row_values",
          "layer", "rows", "width", "streams", "state_floats"):
    assert a[k] == b[k], (k, a[k], b[k])
PY
head -c 20000 data/gpl3.tok > "$T/stream"
"$E" hash "$FULL" --tokens "$T/stream" > "$T/h_ours" 2>"$T/err" || bad "hash: engram's file"
"$E" hash "$PYW" --tokens "$T/stream" > "$T/h_py" 2>"$T/err" || bad "hash: the Python writer's file"
[ -s "$T/h_ours" ] && cmp -s "$T/h_ours" "$T/h_py" && ok || bad "hash: the two writers' files hash differently"
echo "9707 11 220" | "$E" hash "$PYW" --tokens - | tail -1 | awk '{print $1, $8, $9, $16}' > "$T/k"
[ "$(cat "$T/k")" = "15029315 143479041 162897307 308764256" ] && ok || bad "hash: SPEC's rows on the Python writer's file: $(cat "$T/k")"
for r in 0 5 320001535; do
    "$E" rows "$PYW" --table 0 $r > "$T/r" 2>"$T/err"
    /usr/bin/python3 tests/ple_gguf_writer.py --print-row $r > "$T/w"
    /usr/bin/python3 - "$T/r" "$T/w" <<'PY' && ok || bad "rows $r of the Python writer's file"
import sys
import numpy as np
a, b = (np.loadtxt(p, dtype=np.float64, ndmin=1).astype(np.float32) for p in sys.argv[1:3])
assert a.shape == (160,) and np.array_equal(a.view(np.uint32), b.view(np.uint32))
PY
done

# verify: a clean file passes; NaN and infinities poked into known rows
# (at offsets computed here from the table offset info prints and 320 x
# row) are listed exactly, value index and bits, and exit 1
expect_rc 0 "table 0: 321408 rows, 0 invalid" "verify: the clean demo" "$E" verify "$DEMO"
[ "$(grep -c 'row' "$T/out")" = 1 ] && ok || bad "verify: the clean demo lists rows"
# each file's table offset as info --json prints it
table_off() { "$E" info "$1" --json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["table_offset"])'; }
poke() { # FILE ROW VALUE BITS: one BF16 value, little-endian, at table_off + 320 x ROW + 2 x VALUE
    /usr/bin/python3 - "$@" "$(table_off "$1")" <<'PY'
import struct, sys
path, row, val, bits, off = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 16), int(sys.argv[5])
with open(path, "r+b") as f:
    f.seek(off + 320 * row + 2 * val)
    f.write(struct.pack("<H", bits))
PY
}
BADF="$T/bad.gguf"; cp "$DEMO" "$BADF"
poke "$BADF" 4242 17 7fc1 && poke "$BADF" 300000 159 ff80 && poke "$BADF" 321407 0 7f80 &&
    poke "$BADF" 5 0 7f7f && poke "$BADF" 6 3 ff7f || bad "poke values into the copy"
"$E" verify "$BADF" > "$T/v" 2>"$T/err"; rc=$?
cat > "$T/vwant" <<'EOF2'
table 0 row 4242: value 17: NaN (BF16 0x7fc1)
table 0 row 300000: value 159: -infinity (BF16 0xff80)
table 0 row 321407: value 0: +infinity (BF16 0x7f80)
EOF2
[ $rc = 1 ] && ok || bad "verify: the poked copy exits $rc, wanted 1"
grep -v '^table 0: ' "$T/v" | cmp -s - "$T/vwant" && ok || { bad "verify: the poked rows"; cat "$T/v" >&2; }
grep -q '^table 0: 321408 rows, 3 invalid' "$T/v" && ok || bad "verify: the summary of the poked copy"
# past 4 GiB in the sparse full-size file: one poked row, the rest holes skipped
SPF="$T/sparse.gguf"; cp --sparse=always "$FULL" "$SPF"
poke "$SPF" 320001535 159 7fff || bad "poke the sparse copy"
expect_rc 1 "table 0 row 320001535: value 159: NaN (BF16 0x7fff)" "verify: a row past 4 GiB in a sparse file" "$E" verify "$SPF"
grep -q "320001536 rows, 1 invalid; read 0.00" "$T/out" && ok || bad "verify: the sparse file's holes were read"
rm -f "$SPF"
expect_rc 2 "one table: --table 0" "verify --table 1 on PLE" "$E" verify "$DEMO" --table 1
expect_rc 0 "0 invalid" "verify --table 0 on PLE" "$E" verify "$DEMO" --table 0

# bench io: the sections run on the one table, 16 rows a step; the share of
# 320-byte rows that straddle two blocks, counted here from the table offset
"$E" bench io "$DEMO" --no-fio --depths 4 --seconds 0.2 --max-tokens 3000 --cache 1M \
    > "$T/bench" 2>"$T/err" && ok || { bad "bench io on the demo"; head -3 "$T/err" >&2; }
/usr/bin/python3 - "$T/bench" "$(table_off "$DEMO")" <<'PY' && ok || bad "bench io: the straddling share"
import re, sys
text = open(sys.argv[1]).read(); off = int(sys.argv[2])
m = re.search(r"rows: 320 bytes at table offset (\d+) \+ 320 x row: (\d+) of 4096 \(([\d.]+)%\) span two (\d+)-byte blocks", text)
assert m, "no rows line"
assert int(m.group(1)) == off
blk = int(m.group(4))
cross = sum((off + 320 * k) // blk != (off + 320 * k + 319) // blk for k in range(4096))
assert int(m.group(2)) == cross, (m.group(2), cross)
PY
grep -q "decode steps: 16 random rows (the one table)" "$T/bench" && grep -q "steps, p50" "$T/bench" &&
    ok || bad "bench io: section (b) on PLE"
grep -q "^    gpl3.tok  *3000 |" "$T/bench" && ok || bad "bench io: section (c) on PLE"
expect_rc 0 "one table of" "bench io names the member's table" cat "$T/bench"

# apply: the demo's layer (W = 64) over 300 tokens with every 7th masked,
# against tests/ple_apply_cli_check.py (the model's bytes walked, hashed,
# read and computed in float64 independently); the same bits whatever
# --threads and --chunk (the state carried between calls), BF16 residual
# files the F32 output rounded; what is V4.1's refused
head -c 4000 data/gpl3.tok | tr -s ' \n' '\n' | grep . | head -300 > "$T/atok"
awk '{print (NR % 7 == 3) ? 0 : 1}' "$T/atok" > "$T/amask"
/usr/bin/python3 - "$T/xin.f32" "$T/xin.bf16" 300 256 <<'PY' || bad "write the residual"
import sys
import numpy as np
x = np.random.default_rng(5).normal(0, 1, (int(sys.argv[3]), int(sys.argv[4]))).astype(np.float32)
b = ((x.view(np.uint32) + 0x7fff + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
x = (b.astype(np.uint32) << 16).view(np.float32)  # BF16 values, so both files say the same
x[4, 128:192] = 0  # a zero stream: alpha = sigmoid(0)
b[4, 128:192] = 0
x.tofile(sys.argv[1]); b.tofile(sys.argv[2])
PY
A="--layer 1 --tokens $T/atok --mask $T/amask"
# shellcheck disable=SC2086
expect_rc 0 "PLE: " "apply on the PLE demo" "$E" apply "$DEMO" $A --residual-in "$T/xin.f32" --residual-out "$T/o1.f32"
/usr/bin/python3 tests/ple_apply_cli_check.py "$DEMO" "$T/atok" "$T/amask" "$T/xin.f32" "$T/o1.f32" > "$T/chk" 2>&1 &&
    ok || bad "apply: against the float64 computation"
sed 's/^/    /' "$T/chk"
for v in "--threads 2 --chunk 7" "--threads 1 --chunk 1" "--threads 2 --chunk 2048" "--threads 3 --chunk 256"; do
    # shellcheck disable=SC2086
    "$E" apply "$DEMO" $A --residual-in "$T/xin.f32" --residual-out "$T/o2.f32" $v >/dev/null 2>"$T/err" &&
        cmp -s "$T/o1.f32" "$T/o2.f32" && ok || bad "apply $v: not the same bits as one thread, chunks of 256"
done
# shellcheck disable=SC2086
"$E" apply "$DEMO" $A --residual-in "$T/xin.bf16" --residual-out "$T/o1.bf16" --residual-bf16 --chunk 5 \
    > /dev/null 2>"$T/err" || bad "apply --residual-bf16"
/usr/bin/python3 - "$T/o1.f32" "$T/o1.bf16" <<'PY' && ok || bad "apply --residual-bf16: not the F32 output rounded"
import sys
import numpy as np
f = np.fromfile(sys.argv[1], dtype="<f4").view(np.uint32)
b = np.fromfile(sys.argv[2], dtype="<u2")
want = ((f + 0x7fff + ((f >> 16) & 1)) >> 16).astype(np.uint16)
assert b.size == f.size and np.array_equal(b, want)
PY
# the real width, W = 2560: 40 tokens, two threads, calls of 3 tokens
D2560="$T/w2560.gguf"
"$E" build "$D2560" --arch qwen4exp --base 20011 --width 2560 --fill normal --seed 4 >/dev/null || bad "build W = 2560"
head -40 "$T/atok" > "$T/t40"; head -40 "$T/amask" > "$T/m40"
/usr/bin/python3 -c "import numpy as np; x = np.random.default_rng(1).normal(0, 1, (40, 10240)).astype(np.float32)
u = x.view(np.uint32); ((u + 0x7fff + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).tofile('$T/x40.f32')"
"$E" apply "$D2560" --layer 1 --tokens "$T/t40" --mask "$T/m40" --residual-in "$T/x40.f32" \
    --residual-out "$T/o40.f32" --threads 2 --chunk 3 > /dev/null 2>"$T/err" || bad "apply at W = 2560"
/usr/bin/python3 tests/ple_apply_cli_check.py "$D2560" "$T/t40" "$T/m40" "$T/x40.f32" "$T/o40.f32" > "$T/chk" 2>&1 &&
    ok || bad "apply at W = 2560: against the float64 computation"
sed 's/^/    /' "$T/chk"
rm -f "$D2560"
expect_rc 2 "one layer, 1: --layer 1" "apply --layer 14 on PLE" "$E" apply "$DEMO" --layer 14 --tokens x \
    --residual-in seed:1 --residual-out "$T/x"
expect_rc 2 "--kv-out writes V4.1's" "apply --kv-out on PLE" "$E" apply "$DEMO" --layer 1 --tokens x \
    --residual-in seed:1 --residual-out "$T/x" --kv-out "$T/kv"
expect_rc 2 "--history sets V4.1's" "apply --history on PLE" "$E" apply "$DEMO" --layer 1 --tokens x \
    --residual-in seed:1 --residual-out "$T/x" --history 1,2,3
expect_rc 2 "applied on the CPU here" "apply --device cuda on PLE" "$E" apply "$DEMO" --layer 1 --tokens x \
    --residual-in seed:1 --residual-out "$T/x" --device cuda
# shellcheck disable=SC2086
expect_rc 1 "307200 expected" "apply: a residual of the wrong size" "$E" apply "$DEMO" $A \
    --residual-in "$T/xin.bf16" --residual-out "$T/x"
[ ! -e "$T/x" ] && ok || bad "a refused apply wrote its output"

# (engram run on a PLE model: tests/test_ple_run.sh)
finish test_ple_cli.sh
