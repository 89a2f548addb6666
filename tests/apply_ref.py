#!/usr/bin/python3
"""Independent reference for `engram apply` (SPEC.md sections 3, 6, 7, 8),
in numpy float64.  It parses the GGUF file itself, hashes the tokens,
reads and decodes the rows, projects them and applies the gate on its own;
nothing here calls engram or shares its code.

  apply_ref.py gen DIR N SEED MODEL    write DIR/{tokens,mask,history,resid.f32}
  apply_ref.py check MODEL LAYER DIR OUT.f32 [KV.f32]
      compares engram's output (and projection) with the reference:
      masked tokens bit for bit; >= 99.9% of the other outputs within one
      BF16 step of the output and all within two steps of the update's
      operands (see check()); the same for the float64 gate on engram's own
      projection; a stream of zeros (d = +0) gated with
      sigmoid(0.001); the projection within gamma_K * sum|e_i w_i| of the
      float64 sum (gamma_K = K u / (1 - K u), u = 2^-24: the bound of an F32
      sum of K exact products).  Prints the figures; exit 1 on a failure.
"""
import os
import struct
import sys

import numpy as np

K = 6144
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- GGUF

class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.d[self.p:self.p + n].decode("utf-8", "replace")
        self.p += n
        return s


SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def value(r, t):
    if t in SCALAR:
        return r.take(SCALAR[t])
    if t == 8:
        return r.string()
    if t == 9:
        et, n = r.take("I"), r.take("Q")
        if et in SCALAR:
            size = struct.calcsize(SCALAR[et])
            arr = np.frombuffer(r.d, dtype="<" + SCALAR[et], count=n, offset=r.p)
            r.p += n * size
            return arr
        return [value(r, et) for _ in range(n)]
    raise ValueError("GGUF value type %d" % t)


def parse_gguf(path):
    with open(path, "rb") as f:
        head = f.read(64 << 20)  # the header (keys, token map, tensor infos)
    r = Reader(head)
    if r.take("4s") != b"GGUF":
        raise ValueError("not GGUF")
    version = r.take("I")
    assert version in (2, 3)
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = value(r, r.take("I"))
    tensors = {}
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        ttype, off = r.take("I"), r.take("Q")
        tensors[name] = (dims, ttype, off)
    align = int(kv.get("general.alignment", 32))
    data = (r.p + align - 1) // align * align
    return kv, {n: (d, t, data + o) for n, (d, t, o) in tensors.items()}


def load_model(path):
    kv, tensors = parse_gguf(path)
    g = lambda k: kv["deepseek41.engram." + k]
    primes = [int(x) for x in g("primes")]
    mult = [int(x) for x in g("multipliers")]
    return {
        "path": path,
        "map": np.asarray(g("token_map"), dtype=np.int64),
        "pad": int(g("pad_id")),
        "primes": [primes[:24], primes[24:]],
        "mult": [mult[:4], mult[4:]],
        "tensors": tensors,
    }


# ---------------------------------------------------------------- hash (SPEC 6)

def hash_stream(M, tokens, mask, hist, table):
    """Row ids [n][24] of one table; hist = 3 compressed ids newest first."""
    h3 = list(hist)
    out = []
    m, p = M["mult"][table], M["primes"][table]
    for tok, mk in zip(tokens, mask):
        cur = int(M["map"][tok]) if mk else -1
        ids, dead = [], False
        for x in [cur] + h3:
            dead = dead or x < 0
            ids.append(M["pad"] if dead else x)
        h = (ids[0] * m[0]) & MASK64
        off, rows = 0, []
        for j in range(1, 4):
            h ^= (ids[j] * m[j]) & MASK64
            for k in range(8):
                prime = p[(j - 1) * 8 + k]
                rows.append(h % prime + off)
                off += prime
        out.append(rows)
        h3 = [cur, h3[0], h3[1]]
    return out


# ---------------------------------------------------------------- rows (SPEC 7)

def e4m3_table():
    t = np.zeros(256)
    for c in range(256):
        e, mant = (c >> 3) & 15, c & 7
        v = (8 + mant) * 2.0 ** (e - 10) if e else mant * 2.0 ** -9
        t[c] = -v if c & 0x80 else v
    return t


E4M3 = e4m3_table()


def bf16(x):
    """Round float64 values to BF16 (8 significant bits), ties to even,
    with BF16's subnormal quantum 2^-133 below 2^-126."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    ex = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    ex = np.maximum(ex, -126)
    q = np.exp2(ex - 7)
    return np.round(x / q) * q  # numpy rounds half to even


def decode_rows(M, table, rows):
    """[n][24] row ids -> [n][6144] float64 (exact BF16 values)."""
    name = "blk.%d.engram_embd.weight" % (1, 14)[table]
    base = M["tensors"][name][2]
    n = len(rows)
    out = np.zeros((n, K))
    with open(M["path"], "rb") as f:
        for i, rs in enumerate(rows):
            for c, r in enumerate(rs):
                f.seek(base + int(r) * 264)
                raw = np.frombuffer(f.read(264), dtype=np.uint8)
                codes, scales = raw[:256], raw[256:]
                assert not np.any((codes & 0x7F) == 0x7F) and not np.any(scales == 255)
                v = E4M3[codes] * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32))
                out[i, c * 256:(c + 1) * 256] = bf16(v)
    return out


# ---------------------------------------------------------------- projection, gate (SPEC 8)

def weights(M, table):
    layer = (1, 14)[table]
    dims, ttype, off = M["tensors"]["blk.%d.engram_kv.weight" % layer]
    assert ttype == 1 and dims[0] == K
    n_out = dims[1]
    w = np.memmap(M["path"], dtype="<f2", mode="r", offset=off, shape=(n_out, K))
    dq, tq, oq = M["tensors"]["blk.%d.engram_q_norm.weight" % layer]
    dk, tk, ok = M["tensors"]["blk.%d.engram_k_norm.weight" % layer]
    W, S = dq
    q = np.memmap(M["path"], dtype="<f4", mode="r", offset=oq, shape=(S, W)).astype(np.float64)
    k = np.memmap(M["path"], dtype="<f4", mode="r", offset=ok, shape=(S, W)).astype(np.float64)
    assert n_out == (S + 1) * W
    return w, q, k, W, S


def gate(x, kv, q, k, W, S):
    """x [S][W] float64, kv [(S+1)W] float64 -> (out [S][W], g [S])."""
    v = bf16(kv[S * W:])
    out = np.zeros((S, W))
    gs = []
    for s in range(S):
        ks = bf16(kv[s * W:(s + 1) * W])
        wq = q[s] * k[s]
        D = float(np.sum(x[s] * wq * ks))
        sxx = float(np.sum(x[s] * x[s]))
        skk = float(np.sum(ks * ks))
        d = D / np.sqrt(sxx / W + 1e-6) / np.sqrt(skk / W + 1e-6) / np.sqrt(W)
        z = np.copysign(np.sqrt(max(abs(d), 1e-6)), d)
        g = 1.0 / (1.0 + np.exp(-z))
        gs.append(g)
        out[s] = bf16(x[s] + g * v)
    return out, gs


# ---------------------------------------------------------------- commands

def gen(d, n, seed, model):
    M = load_model(model)
    dims = next(v[0] for name, v in M["tensors"].items() if name.endswith("engram_q_norm.weight"))
    W, S = int(dims[0]), int(dims[1])
    vocab = len(M["map"])
    rng = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    tokens = rng.integers(0, vocab, n)
    tokens[n // 2:] = tokens[:n - n // 2]  # repeats: duplicate rows within the stream
    mask = (rng.random(n) > 0.1).astype(int)
    mask[0] = 1
    np.savetxt(os.path.join(d, "tokens"), tokens, fmt="%d")
    np.savetxt(os.path.join(d, "mask"), mask, fmt="%d")
    cv = int(M["map"].max()) + 1
    with open(os.path.join(d, "history"), "w") as f:
        f.write("%d,%d,-1\n" % (rng.integers(0, cv), rng.integers(0, cv)))
    x = bf16(rng.normal(0, 2.0, (n, S, W))).astype(np.float32)
    x[0, 1, :] = 0.0  # token 0, stream 1: all zeros: d = +0
    x.tofile(os.path.join(d, "resid.f32"))


def ulp_bf16(a):
    a = np.abs(a)
    ex = np.floor(np.log2(np.where(a > 0, a, 2.0 ** -133)))
    return np.exp2(np.maximum(ex, -126) - 7)


def check(model, layer, d, out_path, kv_path=None):
    M = load_model(model)
    table = 0 if layer == 1 else 1
    tokens = [int(x) for x in open(os.path.join(d, "tokens")).read().split()]
    mask = [int(x) for x in open(os.path.join(d, "mask")).read().split()]
    hist = [int(x) for x in open(os.path.join(d, "history")).read().split(",")]
    n = len(tokens)
    w, q, k, W, S = weights(M, table)
    x = np.fromfile(os.path.join(d, "resid.f32"), dtype="<f4").reshape(n, S, W)
    out = np.fromfile(out_path, dtype="<f4").reshape(n, S, W)
    rows = hash_stream(M, tokens, mask, hist, table)
    e = decode_rows(M, table, rows)
    wf = np.asarray(w, dtype=np.float64)
    kv = e @ wf.T  # exact products, float64 sums
    mag = np.abs(e) @ np.abs(wf).T
    fails = 0
    # masked tokens: bit for bit
    for i in range(n):
        if not mask[i] and x[i].tobytes() != out[i].tobytes():
            print("token %d is masked but changed" % i)
            fails += 1
    kvc = None
    if kv_path:
        kvc = np.fromfile(kv_path, dtype="<f4").reshape(n, (S + 1) * W).astype(np.float64)
    # outputs in BF16 steps.  (1) end to end: the float64 reference of every
    # stage; a step is the BF16 quantum of the output, and for the bound on
    # all outputs the quantum of the update's operands, max(|x|, |g v|,
    # |out|): where x + g v cancels, a BF16 rounding of k or v that falls on
    # the other side of a tie (an F32 sum vs a float64 one) moves the output
    # by a step of its operands, many steps of the small result.  (2) the
    # gate alone: the float64 gate on engram's own projection (--kv-out).
    steps, opsteps, gsteps, gopsteps = [], [], [], []
    g_zero = None
    for i in range(n):
        if not mask[i]:
            continue
        xi = x[i].astype(np.float64)
        ref, gs = gate(xi, kv[i], q, k, W, S)
        if i == 0:
            g_zero = gs[1]
        got = out[i].astype(np.float64)
        diff = np.abs(got - ref)
        steps.append((diff / ulp_bf16(np.maximum(np.abs(ref), np.abs(got)))).ravel())
        gv = np.abs(np.asarray(gs)[:, None] * bf16(kv[i][S * W:])[None, :])
        opq = ulp_bf16(np.maximum.reduce([np.abs(xi), gv, np.abs(ref), np.abs(got)]))
        opsteps.append((diff / opq).ravel())
        if kvc is not None:
            ref2, gs2 = gate(xi, kvc[i], q, k, W, S)
            d2 = np.abs(got - ref2)
            gsteps.append((d2 / ulp_bf16(np.maximum(np.abs(ref2), np.abs(got)))).ravel())
            gv2 = np.abs(np.asarray(gs2)[:, None] * bf16(kvc[i][S * W:])[None, :])
            gopsteps.append((d2 / ulp_bf16(np.maximum.reduce([np.abs(xi), gv2, np.abs(ref2),
                                                               np.abs(got)]))).ravel())
        if not np.all(got == bf16(got)):
            print("token %d: an output is not a BF16 value" % i)
            fails += 1
    cat = lambda v: np.concatenate(v) if v else np.zeros(0)
    steps, opsteps, gsteps, gopsteps = cat(steps), cat(opsteps), cat(gsteps), cat(gopsteps)
    frac = lambda v, t: float(np.mean(v <= t)) if v.size else 1.0
    print("layer %d, W %d, S %d: %d tokens (%d masked), %d outputs" % (layer, W, S, n, n - sum(mask), steps.size))
    print("  end to end vs float64: %.4f%% exact, %.4f%% within one BF16 step of the output "
          "(max %.2f steps); max %.2f steps of the operands" %
          (100 * frac(steps, 0), 100 * frac(steps, 1), float(steps.max()) if steps.size else 0,
           float(opsteps.max()) if opsteps.size else 0))
    if frac(steps, 1) < 0.999 or not np.all(opsteps <= 2.0):
        print("FAIL: fewer than 99.9% within one step, or some beyond two steps of the operands")
        fails += 1
    if kvc is not None:
        print("  gate and update on engram's own projection: %.4f%% exact, %.4f%% within one step "
              "(max %.2f steps); max %.2f steps of the operands" %
              (100 * frac(gsteps, 0), 100 * frac(gsteps, 1), float(gsteps.max()) if gsteps.size else 0,
               float(gopsteps.max()) if gopsteps.size else 0))
        if frac(gsteps, 1) < 0.999 or not np.all(gopsteps <= 2.0):
            print("FAIL: the gate differs")
            fails += 1
    # d = +0: token 0's stream 1 is all zeros
    want = 1.0 / (1.0 + np.exp(-0.001))
    if g_zero is None or abs(g_zero - want) > 1e-15:
        print("FAIL: the zero stream's reference gate %r is not sigmoid(0.001)" % g_zero)
        fails += 1
    else:
        v = bf16(kv[0][S * W:])
        got0 = out[0, 1].astype(np.float64)
        ok0 = np.abs(got0 - bf16(want * v)) <= ulp_bf16(np.maximum(np.abs(got0), np.abs(want * v)))
        print("  d = +0 stream: g = sigmoid(0.001) = %.9f; %d of %d outputs within one step of bf16(g v)"
              % (want, int(np.sum(ok0)), W))
        if not np.all(ok0):
            fails += 1
    # the projection
    if kvc is not None:
        u = 2.0 ** -24
        gamma = K * u / (1 - K * u)
        ratio = np.abs(kvc - kv) / np.maximum(gamma * mag, 1e-300)
        beyond = int(np.sum(np.abs(kvc - kv) > gamma * mag))
        print("  projection: %d values, worst |F32 - float64| = %.3g of gamma_K sum|e w|, %d beyond" %
              (kvc.size, float(ratio.max()), beyond))
        if beyond:
            fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "gen":
        gen(a[1], int(a[2]), int(a[3]), a[4])
    elif a[0] == "check":
        sys.exit(check(a[1], int(a[2]), a[3], a[4], a[5] if len(a) > 5 else None))
    else:
        sys.exit("usage: see the docstring")
