#!/usr/bin/python3
"""`engram apply` on a PLE model against an independent computation.

  ple_apply_cli_check.py MODEL TOKENS MASK X_IN X_OUT

Everything engram's output is compared with is derived here from the
model file's bytes: a minimal GGUF v3 walk finds the keys (the layout:
multipliers, head offsets and sizes, EOS, epsilon) and the tensors; the
tokens are hashed by SPEC.md section 10's formula (a padding position,
mask 0, hashed as EOS); the 16 rows of each token are read from the
table's bytes; and the layer is computed in float64 by
tests/ple_apply_ref.py's reference (the one test_ple_apply.sh trusts),
over the whole stream in one pass from a zero state.  X_IN and X_OUT are
float32 [N][4][W].  Checks, as ple_apply_ref.py's check does for the
residual: masked positions bit for bit; >= 99.9% of the other outputs
within one BF16 step of the float64 result and all within two steps of
the update's operands.  Prints the figures; exit 1 on a failure.
"""
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ple_apply_ref  # noqa: E402

K = 2560


def gguf(path):
    """The keys (name -> value) and tensors (name -> (type, dims, offset))."""
    f = open(path, "rb")
    data = f.read(4 << 20)
    pos = [24]
    magic, ver, nt, nkv = struct.unpack_from("<IIQQ", data, 0)
    assert magic == 0x46554747 and ver == 3, (hex(magic), ver)
    scal = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def rd(fmt):
        v = struct.unpack_from(fmt, data, pos[0])
        pos[0] += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        n = rd("<Q")
        s = data[pos[0]:pos[0] + n].decode("utf-8", "replace")
        pos[0] += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            return [value(et) for _ in range(n)]
        return rd(scal[t])

    keys = {}
    for _ in range(nkv):
        name = string()
        keys[name] = value(rd("<I"))
    tensors = {}
    for _ in range(nt):
        name = string()
        nd = rd("<I")
        dims = [rd("<Q") for _ in range(nd)]
        tensors[name] = (rd("<I"), dims, rd("<Q"))
    align = keys.get("general.alignment", 32)
    start = (pos[0] + align - 1) // align * align
    return keys, {k: (t, d, start + o) for k, (t, d, o) in tensors.items()}


def tensor(path, tensors, name, count, bf16):
    t, dims, off = tensors[name]
    assert t == (30 if bf16 else 0), (name, t)  # GGML BF16 = 30, F32 = 0
    a = np.fromfile(path, dtype="<u2" if bf16 else "<f4", count=count, offset=off)
    assert a.size == count, name
    return a


def ple_rows(keys, tokens, mask):
    """SPEC.md section 10's hash, written from the formula: [N][16] global rows."""
    mult = [int(m) for m in keys["qwen4exp.ple.layer_multipliers"]]
    offs = [int(o) for o in keys["qwen4exp.ple.head_offsets"]]
    sizes = [int(s) for s in keys["qwen4exp.ple.head_vocab_sizes"]]
    eos = int(keys["qwen4exp.ple.eos_token_id"])
    ids = [int(t) if m else eos for t, m in zip(tokens, mask)]  # padding hashes as EOS
    out = np.zeros((len(ids), 16), dtype=np.int64)
    for i, t0 in enumerate(ids):
        t1 = ids[i - 1] if i >= 1 else eos
        t2 = eos if t1 == eos else (ids[i - 2] if i >= 2 else eos)
        bi = (t0 * mult[0]) ^ (t1 * mult[1])
        tri = bi ^ (t2 * mult[2])
        for h in range(16):
            out[i, h] = offs[h] + (bi if h < 8 else tri) % sizes[h]
    return out


def main(model, tok_path, mask_path, x_in_path, x_out_path):
    keys, tensors = gguf(model)
    tokens = [int(x) for x in open(tok_path).read().split()]
    mask = np.array([int(x) for x in open(mask_path).read().split()], dtype=np.uint8)
    N = len(tokens)
    assert mask.size == N
    _, (kdim, C), _ = tensors["blk.1.ple_key.weight"]
    W, T = C // 4, int(keys["qwen4exp.ple.conv_kernel"])
    assert kdim == K
    eps = float(keys["qwen4exp.attention.layer_norm_rms_epsilon"])
    rows = ple_rows(keys, tokens, mask)
    _, _, toff = tensors["per_layer_token_embd.weight"]
    e = np.zeros((N, K), dtype="<u2")
    with open(model, "rb") as f:
        for i in range(N):
            for h in range(16):
                f.seek(toff + 320 * int(rows[i, h]))
                e[i, h * 160:(h + 1) * 160] = np.frombuffer(f.read(320), dtype="<u2")
    F = 3 * (T - 1)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "meta"), "w") as m:
            m.write("W %d\nT %d\nN %d\neps %r\n" % (W, T, N, eps))
        tensor(model, tensors, "blk.1.ple_key.weight", C * K, 1).tofile(os.path.join(d, "key.bf16"))
        tensor(model, tensors, "blk.1.ple_value.weight", W * K, 1).tofile(os.path.join(d, "value.bf16"))
        for n in ("key", "query", "conv"):
            tensor(model, tensors, "blk.1.ple_norm_%s.weight" % n, C, 0).tofile(os.path.join(d, "norm_%s.f32" % n))
        tensor(model, tensors, "blk.1.ple_conv1d.weight", C * T, 0).tofile(os.path.join(d, "conv.f32"))
        e.tofile(os.path.join(d, "rows.bf16"))
        mask.tofile(os.path.join(d, "mask.u8"))
        x_raw = np.fromfile(x_in_path, dtype="<f4").reshape(N, C)
        x_raw.tofile(os.path.join(d, "x_in.f32"))
        np.zeros((F, C), dtype="<f4").tofile(os.path.join(d, "state_in.f32"))
        _, _, _, _, _, x_in, ref, g, y, _, _, _ = ple_apply_ref.reference(d)
    got = np.fromfile(x_out_path, dtype="<f4").reshape(N, C)
    fails = 0
    for t in range(N):
        if not mask[t] and got[t].tobytes() != x_raw[t].tobytes():
            print("position %d is masked but its residual changed" % t)
            fails += 1
    um = mask.astype(bool)
    gd, rf = got[um].astype(np.float64), ref[um]
    diff = np.abs(gd - rf)
    steps = diff / ple_apply_ref.ulp_bf16(np.maximum(np.abs(rf), np.abs(gd)))
    ops = np.maximum.reduce([np.abs(x_in[um]), np.abs(g[um]), np.abs(y[um]), np.abs(rf)])
    opsteps = diff / ple_apply_ref.ulp_bf16(ops)
    within = float(np.mean(steps <= 1.0))
    print("W %d, %d positions (%d masked), %d outputs: %.4f%% within one BF16 step of float64 "
          "(max %.3f steps), max %.3f steps of the operands" %
          (W, N, N - int(um.sum()), steps.size, 100 * within, float(steps.max()), float(opsteps.max())))
    if within < 0.999 or not np.all(opsteps <= 2.0):
        print("FAIL: fewer than 99.9% within one step, or some beyond two steps of the operands")
        fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit("usage: ple_apply_cli_check.py MODEL TOKENS MASK X_IN X_OUT")
    sys.exit(main(*sys.argv[1:]))
