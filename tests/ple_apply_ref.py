#!/usr/bin/python3
"""Independent reference for the PLE output stage (SPEC.md section 10,
"Consumption"; src/output/ple_apply.h), in numpy float64.  It reads a case
written by `test_ple_apply --dump DIR W N SEED` (weights, rows, mask,
residual and state in, and engram's residual and state out after a run in
random chunks) and recomputes the whole sequence in one pass, in the
SPEC's own terms; nothing here shares engram's code or its order of
operations.

  ple_apply_ref.py check DIR

Checks: masked positions' residual bit for bit; >= 99.9% of the other
outputs within one BF16 step of the float64 result (a step: the BF16
quantum of max(|ref|, |got|), as tests/apply_ref.py defines it), and all
within two steps of the update's operands max(|x|, |g|, |y|, |ref|) (where
x + g + y cancels, a step of the small result is no bound); the state's
frames the same way, their operands being |n| or, where v_i is small
after cancellation, alpha sum|e w| rn |gamma_conv| (zero frames for masked
positions exactly +0); a
residual stream of zeros gets alpha = sigmoid(0) = 0.5 (sign(0) = 0).
Prints the figures; exit 1 on a failure.
"""
import os
import sys

import numpy as np

K = 2560
DILATION = 3


def load(d, name, dtype, shape=None):
    a = np.fromfile(os.path.join(d, name), dtype=dtype)
    if dtype == "<u2":  # BF16 bit patterns -> exact float64
        a = (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype == "<f4":
        a = a.astype(np.float64)
    return a.reshape(shape) if shape is not None else a


def ulp_bf16(a):
    a = np.abs(a)
    ex = np.floor(np.log2(np.where(a > 0, a, 2.0 ** -133)))
    return np.exp2(np.maximum(ex, -126) - 7)


def rmsnorm(v, eps):
    return v / np.sqrt(np.mean(v * v) + eps)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def reference(d):
    meta = dict(line.split() for line in open(os.path.join(d, "meta")))
    W, T, N, eps = int(meta["W"]), int(meta["T"]), int(meta["N"]), float(meta["eps"])
    C, F = 4 * W, DILATION * (T - 1)
    wk = load(d, "key.bf16", "<u2", (C, K))
    wv = load(d, "value.bf16", "<u2", (W, K))
    gk = load(d, "norm_key.f32", "<f4")
    gq = load(d, "norm_query.f32", "<f4")
    gc = load(d, "norm_conv.f32", "<f4")
    conv = load(d, "conv.f32", "<f4", (C, T))  # GGUF [T, C]: tap k of channel c at [c][k]
    rows = load(d, "rows.bf16", "<u2", (N, K))
    mask = np.fromfile(os.path.join(d, "mask.u8"), dtype=np.uint8)
    x_in = load(d, "x_in.f32", "<f4", (N, C))
    state = load(d, "state_in.f32", "<f4", (F, C))
    frames = [state[f] for f in range(F)]  # oldest first; position t's frame is frames[F + t]
    # each frame's scale for error bounds: |n| where n is not small, else
    # what the F32 sums behind it could lose (v's terms |e_i w_i|)
    scales = [np.abs(state[f]) for f in range(F)]
    out = x_in.copy()
    g_all = np.zeros((N, C))
    y_all = np.zeros((N, C))
    alphas = np.full((N, 4), np.nan)
    for t in range(N):
        if not mask[t]:
            frames.append(np.zeros(C))  # padding: gated value and convolution input zero
            scales.append(np.zeros(C))
            continue
        e = rows[t]
        k = wk @ e
        v = wv @ e
        g = np.zeros(C)
        for j in range(4):
            sl = slice(j * W, (j + 1) * W)
            kj = rmsnorm(k[sl], eps) * gk[sl]
            qj = rmsnorm(x_in[t, sl], eps) * gq[sl]
            s = float(np.dot(kj, qj)) / np.sqrt(W)
            a = sigmoid(np.sign(s) * np.sqrt(max(abs(s), 1e-6)))  # np.sign(0) = 0
            alphas[t, j] = a
            g[sl] = a * v
        frames.append(rmsnorm(g, eps) * gc)
        vmag = np.abs(wv) @ np.abs(e)
        rn = 1.0 / np.sqrt(np.mean(g * g) + eps)
        scales.append(np.maximum(np.abs(frames[-1]), np.repeat(alphas[t], W) * np.tile(vmag, 4) * rn * np.abs(gc)))
        c = np.zeros(C)
        for tap in range(T):
            c += conv[:, tap] * frames[F + t - (T - 1 - tap) * DILATION]
        y = c * sigmoid(c)
        g_all[t], y_all[t] = g, y
        out[t] = x_in[t] + g + y
    last = (lambda v: np.array(v[-F:])) if F else (lambda v: np.zeros((0, C)))
    return W, N, F, C, mask, x_in, out, g_all, y_all, alphas, last(frames), last(scales)


def check(d):
    W, N, F, C, mask, x_in, ref, g, y, alphas, ref_state, state_scale = reference(d)
    got = np.fromfile(os.path.join(d, "x_out.f32"), dtype="<f4").reshape(N, C)
    got_state = np.fromfile(os.path.join(d, "state_out.f32"), dtype="<f4").reshape(F, C)
    x_raw = np.fromfile(os.path.join(d, "x_in.f32"), dtype="<f4").reshape(N, C)
    fails = 0
    for t in range(N):
        if not mask[t] and got[t].tobytes() != x_raw[t].tobytes():
            print("position %d is masked but its residual changed" % t)
            fails += 1
    um = mask.astype(bool)
    gd = got[um].astype(np.float64)
    rf = ref[um]
    diff = np.abs(gd - rf)
    steps = diff / ulp_bf16(np.maximum(np.abs(rf), np.abs(gd)))
    ops = np.maximum.reduce([np.abs(x_in[um]), np.abs(g[um]), np.abs(y[um]), np.abs(rf)])
    opsteps = diff / ulp_bf16(ops)
    rel = diff / np.maximum(ops, 1e-300)
    within = float(np.mean(steps <= 1.0))
    print("W %d, %d positions (%d masked), %d outputs" % (W, N, N - int(um.sum()), steps.size))
    print("  residual vs float64: %.4f%% within one BF16 step (max %.4f steps); max %.4f steps of the "
          "operands; max |err| / max|operand| = %.3g (%.2f F32 ulps); max |err| = %.3g" %
          (100 * within, float(steps.max()), float(opsteps.max()), float(rel.max()),
           float(rel.max()) * 2 ** 23, float(diff.max())))
    if within < 0.999 or not np.all(opsteps <= 2.0):
        print("FAIL: fewer than 99.9% within one step, or some beyond two steps of the operands")
        fails += 1
    sd = np.abs(got_state.astype(np.float64) - ref_state)
    ssteps = sd / ulp_bf16(np.maximum(np.abs(ref_state), np.abs(got_state)))
    sopsteps = sd / ulp_bf16(np.maximum(state_scale, np.abs(got_state)))
    swithin = float(np.mean(ssteps <= 1.0)) if ssteps.size else 1.0
    mx = lambda v: float(v.max()) if v.size else 0.0
    print("  state (%d frames) vs float64: %.4f%% within one BF16 step (max %.4f steps); max %.4f steps "
          "of its operands; max |err| %.3g" % (F, 100 * swithin, mx(ssteps), mx(sopsteps), mx(sd)))
    if swithin < 0.999 or mx(sopsteps) > 2.0:
        print("FAIL: the state differs")
        fails += 1
    # masked positions among the last F: their frames are exactly +0
    for f in range(F):
        t = N - F + f
        if 0 <= t < N and not mask[t] and (np.any(got_state[f] != 0) or np.any(np.signbit(got_state[f]))):
            print("FAIL: frame %d (masked position %d) is not all +0" % (f, t))
            fails += 1
    # the zero stream (test_ple_apply puts one at position 1, stream 2)
    zero = [(t, j) for t in range(N) for j in range(4) if mask[t] and not np.any(x_in[t, j * W:(j + 1) * W])]
    for t, j in zero:
        print("  position %d stream %d is all zeros: reference alpha = %.17g" % (t, j, alphas[t, j]))
        if alphas[t, j] != 0.5:
            fails += 1
    if not zero:
        print("FAIL: no zero stream in the case")
        fails += 1
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2]))
    sys.exit("usage: ple_apply_ref.py check DIR")
