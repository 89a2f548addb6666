#!/bin/sh
# test_ple_build.sh - `engram build --arch qwen4exp` against independent
# references: the file read by @huggingface/gguf (tests/gguf_dump.mjs, with
# each key's value type) and checked by plain Python, which derives the
# layout itself (the primes after --base by trial division, offsets, rows
# padded to 128, the multipliers by splitmix64) and requires every key of
# SPEC.md section 10 with its type and value, the tensors' names, types,
# shapes and offsets, and the table's values (BF16, sigma 0.05) or its
# hole.  On the full-size base: SPEC's 16 sizes and 3 multipliers as
# written there, and SPEC's known rows hashed by Python from the metadata
# the independent parser read.  Then the CLI's rules: one seed one file,
# --arch deepseek41 the default, V4.1-only options refused (exit 2,
# nothing written).
# Usage: tests/test_ple_build.sh BUILD_DIR
set -u
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
ENGRAM="$BUILD/engram"
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
tmpdir ple-build
check() { # check DESCRIPTION COMMAND...
    d=$1; shift
    if "$@" >"$T/out" 2>"$T/err"; then ok; else bad "$d"; sed 's/^/    /' "$T/out" "$T/err" | head -8 >&2; fi
}

cat >"$T/check.py" <<'EOF'
# check.py DUMP.json FILE BASE WIDTH FILL [known]: the qwen4exp file as the
# independent parser read it, against a layout derived here.
import json, math, os, struct, sys

dump, path, base, width, fill = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
known = len(sys.argv) > 6
d = json.load(open(dump))
md, ty = d["metadata"], d["types"]
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
VOCAB, EOS = 248320, 248044

def prime(n):
    if n < 2: return False
    if n % 2 == 0: return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0: return False
        i += 2
    return True

def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)

sizes, p = [], base
while len(sizes) < 16:
    p += 1
    if prime(p): sizes.append(p)
offsets = [sum(sizes[:h]) for h in range(16)]
rows = (sum(sizes) + 127) // 128 * 128
half = ((2**63 - 1) // VOCAB) // 2
mult = [2 * (mix((1234 + GAMMA * (j + 1) + GAMMA) & M64) % half) + 1 for j in range(3)]
if known:  # SPEC section 10, as written there
    assert sizes == [20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                     20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171], sizes
    assert rows == 320001536 and sum(sizes) == 320001446
    assert mult == [23703573157769, 20109073645365, 8052911324071], mult

U32, F32, STR, ARR, U64 = 4, 6, 8, 9, 10
want = {
    "general.architecture": ([STR], "qwen4exp"),
    "qwen4exp.vocab_size": ([U32], VOCAB),
    "qwen4exp.embedding_length_per_layer_input": ([U32], 160),
    "qwen4exp.ple.layers": ([ARR, U32], [1]),
    "qwen4exp.ple.ngram_size": ([U32], 3),
    "qwen4exp.ple.heads_per_ngram": ([U32], 8),
    "qwen4exp.ple.conv_kernel": ([U32], 4),
    "qwen4exp.ple.eos_token_id": ([U32], EOS),
    "qwen4exp.ple.layer_multipliers": ([ARR, U64], mult),
    "qwen4exp.ple.head_offsets": ([ARR, U64], offsets),
    "qwen4exp.ple.head_vocab_sizes": ([ARR, U64], sizes),
}
for k, (t, v) in want.items():
    assert ty.get(k) == t, (k, ty.get(k), t)
    got = md[k]
    got = [int(x) for x in got] if isinstance(got, list) else got
    assert got == v, (k, got, v)
assert ty["qwen4exp.attention.layer_norm_rms_epsilon"] == [F32]
assert struct.pack("<f", md["qwen4exp.attention.layer_norm_rms_epsilon"]) == struct.pack("<f", 1e-6)
assert "qwen4exp.ple.image_token_id" not in md
keys = {k for k in md if k not in ("version", "tensor_count", "kv_count")}
assert keys == set(want) | {"qwen4exp.attention.layer_norm_rms_epsilon", "general.name"}, keys

BF16, F32T, W4, K = 30, 0, 4 * width, 2560
tensors = [("per_layer_token_embd.weight", BF16, [160, rows]),
           ("blk.1.ple_key.weight", BF16, [K, W4]), ("blk.1.ple_value.weight", BF16, [K, width]),
           ("blk.1.ple_norm_key.weight", F32T, [W4]), ("blk.1.ple_norm_query.weight", F32T, [W4]),
           ("blk.1.ple_norm_conv.weight", F32T, [W4]), ("blk.1.ple_conv1d.weight", F32T, [4, W4])]
got = [(t["name"], t["type"], [int(x) for x in t["shape"]]) for t in d["tensors"]]
assert got == tensors, got
size = os.path.getsize(path)
off = [int(t["offset"]) for t in d["tensors"]]
assert off[0] % 4096 == 0
end = 0
for (name, typ, shape), o in zip(tensors, off):
    n = math.prod(shape) * (2 if typ == BF16 else 4)
    assert o >= end, name
    end = o + n
assert end <= size

def bf16(b):
    return [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in range(0, len(b), 2)]

with open(path, "rb") as f:
    # the table: sample rows (normal: sigma 0.05 within 3.5 sigma; zero: a hole)
    step = max(1, rows // 200)
    vals = []
    for r in range(0, rows, step):
        f.seek(off[0] + 320 * r)
        vals += bf16(f.read(320))
    if fill == "zero":
        assert all(v == 0 for v in vals)
    else:
        m = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - m) ** 2 for v in vals) / len(vals))
        assert abs(m) < 0.002 and 0.048 < sd < 0.052 and max(map(abs, vals)) < 0.176, (m, sd)
    # the norms: 1 + w, w small
    f.seek(off[3])
    nk = struct.unpack("<%df" % W4, f.read(4 * W4))
    assert all(0.8 < v < 1.2 for v in nk)
    if known:  # SPEC's known rows, hashed here from the metadata read by @huggingface/gguf
        m0, m1, m2 = mult
        seq, lag1, lag2 = [9707, 11, 220], EOS, EOS
        spec = [[16410909, 152932897, 169641436, 300984276], [18158303, 159566246, 175132467, 307699687],
                [15029315, 143479041, 162897307, 308764256]]
        for i, t in enumerate(seq):
            bi = (t * m0) ^ (lag1 * m1)
            tri = bi ^ (lag2 * m2)
            r = [offsets[h] + (bi if h < 8 else tri) % sizes[h] for h in range(16)]
            assert [r[0], r[7], r[8], r[15]] == spec[i], (i, r)
            f.seek(off[0] + 320 * r[15])
            assert f.read(320) == bytes(320)
            lag1, lag2 = t, lag1
print("ok", rows, "rows", size, "bytes")
EOF

if ! command -v node >/dev/null 2>&1; then
    echo "test_ple_build.sh: node is absent: the @huggingface/gguf checks are skipped" >&2
    NODE=0
else
    NODE=1
fi

# ------------------------------------------------ a small model, normal fill
S="$T/small.gguf"
check "build a small qwen4exp model" "$ENGRAM" build "$S" --arch qwen4exp --base 2000 --width 24 --fill normal --seed 5
grep -q "qwen4exp, vocab 248320, 16 heads from base 2000, width 24, fill normal, seed 5" "$T/out" && ok ||
    bad "build's line: $(cat "$T/out")"
if [ $NODE = 1 ]; then
    check "dump the small model through @huggingface/gguf" sh -c "node tests/gguf_dump.mjs '$S' > '$T/s.json'"
    check "the small model: keys, tensors, values" "$PY" "$T/check.py" "$T/s.json" "$S" 2000 24 normal
fi

# ------------------------------------------------ full size, sparse (the default base)
F="$T/full.gguf"
check "build the full-size qwen4exp model (a hole)" "$ENGRAM" build "$F" --arch qwen4exp --width 8
used=$(du -k "$F" | cut -f1)
[ "$used" -lt 16384 ] && ok || bad "full-size file uses $used KiB"
if [ $NODE = 1 ]; then
    check "dump the full-size model" sh -c "node tests/gguf_dump.mjs '$F' > '$T/f.json'"
    check "the full-size model: SPEC's sizes, multipliers and known rows" \
        "$PY" "$T/check.py" "$T/f.json" "$F" 19999999 8 zero known
fi

# ------------------------------------------------ the default width
D="$T/w.gguf"
check "build with the default width" "$ENGRAM" build "$D" --arch qwen4exp --base 100
if [ $NODE = 1 ]; then
    check "dump the default-width model" sh -c "node tests/gguf_dump.mjs '$D' > '$T/w.json'"
    check "the default width is 2560" "$PY" "$T/check.py" "$T/w.json" "$D" 100 2560 zero
fi

# ------------------------------------------------ one seed, one file
check "rebuild with the same seed" "$ENGRAM" build "$T/again.gguf" --arch qwen4exp --base 2000 --width 24 --fill normal --seed 5
cmp -s "$S" "$T/again.gguf" && ok || bad "the same seed gave another file"
check "build with another seed" "$ENGRAM" build "$T/other.gguf" --arch qwen4exp --base 2000 --width 24 --fill normal --seed 6
cmp -s "$S" "$T/other.gguf" && bad "another seed gave the same file" || ok

# ------------------------------------------------ V4.1 stays the default
check "build V4.1 (default arch)" "$ENGRAM" build "$T/v41.gguf" --base 3000 --width 8 --fill random --seed 2
check "build V4.1 (--arch deepseek41)" "$ENGRAM" build "$T/v41b.gguf" --arch deepseek41 --base 3000 --width 8 --fill random --seed 2
cmp -s "$T/v41.gguf" "$T/v41b.gguf" && ok || bad "--arch deepseek41 differs from the default"
check "V4.1 model opens as V4.1" sh -c "'$ENGRAM' info '$T/v41.gguf' --json | grep -q '\"rows\"'"
expect_rc 0 "qwen4exp" "build --help names qwen4exp" "$ENGRAM" build --help

# ------------------------------------------------ refusals: exit 2, nothing written
N="$T/never.gguf"
for opts in "--tokenizer x.json" "--tokmap x.map" "--vocab 1000" "--compressed-vocab 100" \
            "--gguf-version 2" "--fill random" "--fill sparse" "--fill pool" "--width 0" \
            "--width 65537" "--base 1" "--base 200000000"; do
    # shellcheck disable=SC2086
    expect_rc 2 "" "build --arch qwen4exp $opts is refused" "$ENGRAM" build "$N" --arch qwen4exp $opts
    [ ! -e "$N" ] || { bad "build --arch qwen4exp $opts wrote $N"; rm -f "$N"; }
done
expect_rc 2 "option of --arch deepseek41" "the refusal names the architecture" \
    "$ENGRAM" build "$N" --tokenizer x.json --arch qwen4exp
expect_rc 2 "deepseek41 (V4.1, the default) or qwen4exp" "an unknown --arch" "$ENGRAM" build "$N" --arch llama
expect_rc 2 "" "--arch without a value" "$ENGRAM" build "$N" --arch
[ ! -e "$N" ] && ok || bad "a refused build wrote $N"
[ "$(ls "$T" | grep -c '\.tmp\.')" -eq 0 ] && ok || bad "a temporary was left behind"

finish test_ple_build.sh
