#!/usr/bin/env python3
"""Independent reference for the CLI tests: plain Python integers and exact
fractions, reading the model through the JSON that tests/gguf_dump.mjs
(@huggingface/gguf) prints and the raw bytes of the file.  Shares nothing
with the C library.

  oracle.py hash DUMP.json TOKENS [--mask FILE] [--history A,B,C]
  oracle.py rows DUMP.json MODEL TABLE ROW...

Output formats are the ones `engram hash` / `engram rows` promise.
"""
import json
import sys
from fractions import Fraction

MASK64 = (1 << 64) - 1
LAYERS = (1, 14)


def load(dump_path):
    with open(dump_path) as f:
        d = json.load(f)
    md = d["metadata"]
    key = lambda k: md["deepseek41.engram." + k]
    primes = [int(x) for x in key("primes")]
    mult = [int(x) for x in key("multipliers")]
    return {
        "map": [int(x) for x in key("token_map")],
        "pad": int(key("pad_id")),
        "primes": [primes[0:24], primes[24:48]],
        "mult": [mult[0:4], mult[4:8]],
        "tensors": {t["name"]: t for t in d["tensors"]},
    }


def hash_rows(L, ids):
    """ids: [current, previous, ...] compressed ids, -1 = dead."""
    v, dead = [], False
    for x in ids:
        dead = dead or x < 0
        v.append(L["pad"] if dead else x)
    out = []
    for t in range(2):
        m, p = L["mult"][t], L["primes"][t]
        h = (v[0] * m[0]) & MASK64
        offset = 0
        for j in range(1, 4):
            h ^= (v[j] * m[j]) & MASK64
            for k in range(8):
                prime = p[(j - 1) * 8 + k]
                out.append(h % prime + offset)
                offset += prime
    return out


def cmd_hash(args):
    L = load(args[0])
    tokens = [int(x) for x in open(args[1]).read().split()]
    mask = [1] * len(tokens)
    hist = [-1, -1, -1]
    i = 2
    while i < len(args):
        if args[i] == "--mask":
            mask = [int(x) for x in open(args[i + 1]).read().split()]
        elif args[i] == "--history":
            hist = [int(x) for x in args[i + 1].split(",")]
        i += 2
    seq = []  # compressed ids of the whole stream, -1 where masked
    for tok, mk in zip(tokens, mask):
        seq.append(L["map"][tok] if mk else -1)
    lines = []
    for i in range(len(seq)):
        ids = []
        for lag in range(4):
            pos = i - lag
            ids.append(seq[pos] if pos >= 0 else hist[-pos - 1])
        lines.append(" ".join(str(r) for r in hash_rows(L, ids)))
    sys.stdout.write("".join(line + "\n" for line in lines))


def bf16_value(code, scale):
    """Exact value rounded to BF16 (ties to even), as a Fraction; None if invalid."""
    if code & 0x7F == 0x7F or scale == 255:
        return None
    sign = -1 if code & 0x80 else 1
    e, m = (code >> 3) & 15, code & 7
    v = Fraction(8 + m) * Fraction(2) ** (e - 10) if e else Fraction(m) * Fraction(2) ** -9
    v *= Fraction(2) ** (scale - 127)
    if v >= 2 ** 128:
        return None
    if v == 0:
        return Fraction(0), sign
    if v >= Fraction(2) ** -126:
        ex = v.numerator.bit_length() - v.denominator.bit_length()
        if Fraction(2) ** ex > v:
            ex -= 1
        quantum = Fraction(2) ** (ex - 7)
    else:
        quantum = Fraction(2) ** -133
    return round(v / quantum) * quantum, sign  # round() on Fraction: ties to even


def cmd_rows(args):
    L = load(args[0])
    table = int(args[2])
    t = L["tensors"]["blk.%d.engram_embd.weight" % LAYERS[table]]
    base = int(t["offset"])
    with open(args[1], "rb") as f:
        for r in args[3:]:
            f.seek(base + int(r) * 264)
            raw = f.read(264)
            vals = []
            for j in range(256):
                res = bf16_value(raw[j], raw[256 + j // 32])
                if res is None:
                    sys.exit("row %s invalid" % r)
                mag, sign = res
                x = float(mag)
                vals.append("%.9g" % (-x if sign < 0 else x))
            print(" ".join(vals))


if __name__ == "__main__":
    {"hash": cmd_hash, "rows": cmd_rows}[sys.argv[1]](sys.argv[2:])
