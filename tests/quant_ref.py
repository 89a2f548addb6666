#!/usr/bin/python3
"""Independent reference for `engram quantize` / `engram dequantize`: numpy
writes and reads the .npy files, the quantizer is exact rational arithmetic
(Fraction) over the table of all 127 E4M3 magnitudes, written from SPEC.md
section 7 and the policy in include/engram.h.  Shares nothing with the C code.

  quant_ref.py make DIR        inputs (in.npy, in.f32, in_bf16.npy, nan.npy,
                               inf.npy) and the expected rows (want.rows,
                               want_bf16.rows)
  quant_ref.py deq ROWS OUT.npy [--bf16]   checks a dequantized file
"""
import math
import os
import sys
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle import bf16_value  # noqa: E402  (the row decoder of the CLI tests)

FLT_MAX = Fraction((2 ** 24 - 1) * 2 ** 104)  # (2 - 2^-23) * 2^127

# Every E4M3FN magnitude, by code 0..126 (0x7F is NaN).
MAGS = []
for code in range(127):
    e, m = code >> 3, code & 7
    MAGS.append(Fraction(8 + m) * Fraction(2) ** (e - 10) if e else Fraction(m, 2 ** 9))


def nearest_code(y):
    """Magnitude code nearest to y (0 <= y <= 448), ties to the even code."""
    lo, hi = 0, 126
    while hi - lo > 1:  # MAGS is increasing: find MAGS[lo] <= y <= MAGS[hi]
        mid = (lo + hi) // 2
        if MAGS[mid] <= y:
            lo = mid
        else:
            hi = mid
    if y <= MAGS[lo]:
        return lo
    dl, dh = y - MAGS[lo], MAGS[hi] - y
    if dl < dh:
        return lo
    if dh < dl:
        return hi
    return lo if lo % 2 == 0 else hi


def quantize_row(vals):
    """vals: 256 Python floats (exact float32 values) -> 264 bytes."""
    out = bytearray(264)
    for b in range(8):
        block = vals[b * 32:(b + 1) * 32]
        amax = max(abs(Fraction(x)) for x in block)
        if amax == 0:
            e = 0
        else:
            e = -127
            while amax > 448 * Fraction(2) ** e:
                e += 1
        out[256 + b] = e + 127
        for j, x in enumerate(block):
            c = nearest_code(abs(Fraction(x)) / Fraction(2) ** e)
            while c > 0 and MAGS[c] * Fraction(2) ** e > FLT_MAX:
                c -= 1  # the documented saturation near FLT_MAX
            if math.copysign(1.0, x) < 0:
                c |= 0x80
            out[b * 32 + j] = c
    return bytes(out)


def make_inputs(rng):
    rows = []
    # Random rows over the whole exponent range, one scale per row.
    for _ in range(160):
        k = int(rng.integers(-150, 120))
        rows.append((rng.standard_normal(256) * 2.0 ** k).astype(np.float32))
    # Blocks of mixed magnitudes (small values flush inside a large block).
    for _ in range(20):
        v = rng.standard_normal(256) * np.exp2(rng.integers(-30, 30, 256))
        rows.append(v.astype(np.float32))
    r = np.zeros(256, np.float32)
    rows.append(r.copy())                                  # zeros
    r[::2] = -0.0
    rows.append(r.copy())                                  # negative zeros
    r = np.zeros(256, np.float32)
    r[:32] = 448.0
    r[32:64] = np.array([448.0] + [17.0, 19.0, 21.0, 23.0, 0.5, 9.0, 1 / 1024.0] * 4 + [0.0] * 3,
                        np.float32)                       # ties at scale 2^0
    for k, b in zip((-127, -100, 1, 50, 119), range(2, 7)):
        r[b * 32:(b + 1) * 32] = np.float32(448.0 * 2.0 ** k) * np.where(np.arange(32) % 2, -1, 1)
    rows.append(r.copy())                                  # +-448 * 2^k
    r = np.full(256, np.finfo(np.float32).max, np.float32)
    r[1::3] = -np.finfo(np.float32).max
    r[5] = 3.0e38
    rows.append(r.copy())                                  # near FLT_MAX: saturation
    r = np.array([1.4e-45 * i for i in range(256)], np.float32)
    rows.append(r.copy())                                  # float32 subnormals only
    r[0] = 1.0
    rows.append(r.copy())                                  # subnormals under a large max
    r = np.full(256, np.float32(448.0), np.float32)
    r[::2] = np.nextafter(np.float32(448.0), np.float32(1e9))
    rows.append(r.copy())                                  # just above 448 * 2^e
    return np.stack(rows).astype(np.float32)


def to_bf16_bits(a):
    """float32 -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def cmd_make(d):
    rng = np.random.default_rng(2026)
    x = make_inputs(rng)
    np.save(os.path.join(d, "in.npy"), x)
    x.tofile(os.path.join(d, "in.f32"))
    with open(os.path.join(d, "want.rows"), "wb") as f:
        for row in x:
            f.write(quantize_row([float(v) for v in row]))
    xb = to_bf16_bits(x[:40])
    np.save(os.path.join(d, "in_bf16.npy"), xb)
    with open(os.path.join(d, "want_bf16.rows"), "wb") as f:
        for row in xb:
            vals = (row.astype(np.uint32) << 16).view(np.float32)
            f.write(quantize_row([float(v) for v in vals]))
    bad = x[:3].copy()
    bad[2, 77] = np.nan
    np.save(os.path.join(d, "nan.npy"), bad)
    bad[2, 77] = 1.0
    bad[1, 200] = -np.inf
    np.save(os.path.join(d, "inf.npy"), bad)
    print("%d rows" % len(x))


def cmd_deq(path_rows, path_npy, bf16):
    raw = open(path_rows, "rb").read()
    got = np.load(path_npy)
    n = len(raw) // 264
    if got.shape != (n, 256):
        sys.exit("shape %r, expected (%d, 256)" % (got.shape, n))
    if bf16:
        if got.dtype != np.uint16:
            sys.exit("dtype %s, expected uint16" % got.dtype)
        got = (got.astype(np.uint32) << 16).view(np.float32)
    elif got.dtype != np.float32:
        sys.exit("dtype %s, expected float32" % got.dtype)
    bad = 0
    for r in range(n):
        row = raw[r * 264:(r + 1) * 264]
        for j in range(256):
            mag, sign = bf16_value(row[j], row[256 + j // 32])
            want = float(mag) * sign
            g = float(got[r, j])
            if g != want or math.copysign(1, g) != math.copysign(1, want):
                bad += 1
                if bad <= 5:
                    print("row %d col %d: got %r want %r" % (r, j, g, want))
    if bad:
        sys.exit("%d values differ" % bad)
    print("%d rows match" % n)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        cmd_make(sys.argv[2])
    else:
        cmd_deq(sys.argv[2], sys.argv[3], "--bf16" in sys.argv[4:])
