#!/usr/bin/python3
"""ple_gguf_writer.py - a second, independent writer of qwen4exp files
(issue #22: "a PLE file written by a second writer opens and hashes
identically").  Nothing of engram's C is used: the layout is derived here
(primes after BASE by trial division, offsets, rows padded to 128, the
multipliers by splitmix64, SPEC.md section 10) and the GGUF v3 file is
packed with struct.  It makes other choices than engram's builder where
the format allows them: the vocabulary as a token list (no vocab_size key),
an image token id, the arrays in other integer types (I64 multipliers, U32
offsets, I32 sizes), general.alignment 64, the weights before the table,
and F16 keys.  The table is a hole but for ROWS rows whose BF16 values are
a formula (row r, value c: printed by --print-row).

usage: ple_gguf_writer.py OUT BASE WIDTH [ROW...]
"""
import struct
import sys

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
VOCAB, EOS, IMAGE = 248320, 248044, 248056


def prime(n):
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def layout(base):
    sizes, p = [], base
    while len(sizes) < 16:
        p += 1
        if prime(p):
            sizes.append(p)
    offsets = [sum(sizes[:h]) for h in range(16)]
    rows = (sum(sizes) + 127) // 128 * 128
    half = ((2**63 - 1) // VOCAB) // 2
    mult = [2 * (mix((1234 + GAMMA * (j + 1) + GAMMA) & M64) % half) + 1 for j in range(3)]
    return sizes, offsets, rows, mult


def cell(r, c):
    """BF16 bits of row r, value c: finite, varied."""
    x = (r * 2654435761 + c * 40503) & 0xFFFFFFFF
    return (x & 0x807F) | ((0x70 + (x >> 16) % 32) << 7)


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def arr(etype, fmt, values):
    return struct.pack("<IQ", etype, len(values)) + b"".join(struct.pack(fmt, v) for v in values)


def main():
    out, base, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    filled = [int(a) for a in sys.argv[4:]]
    sizes, offsets, rows, mult = layout(base)
    U32, I32, F32, STR, ARR, U64, I64 = 4, 5, 6, 8, 9, 10, 11
    kvs = [
        kv("general.architecture", STR, gstr("qwen4exp")),
        kv("general.alignment", U32, struct.pack("<I", 64)),
        kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, VOCAB) +
           b"".join(gstr("t%d" % i) for i in range(VOCAB))),
        kv("qwen4exp.ple.head_vocab_sizes", ARR, arr(I32, "<i", sizes)),
        kv("qwen4exp.ple.head_offsets", ARR, arr(U32, "<I", offsets)),
        kv("qwen4exp.ple.layer_multipliers", ARR, arr(I64, "<q", mult)),
        kv("qwen4exp.ple.eos_token_id", U32, struct.pack("<I", EOS)),
        kv("qwen4exp.ple.image_token_id", U32, struct.pack("<I", IMAGE)),
        kv("qwen4exp.ple.conv_kernel", U32, struct.pack("<I", 4)),
        kv("qwen4exp.ple.heads_per_ngram", U32, struct.pack("<I", 8)),
        kv("qwen4exp.ple.ngram_size", U32, struct.pack("<I", 3)),
        kv("qwen4exp.ple.layers", ARR, arr(U32, "<I", [1])),
        kv("qwen4exp.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", 1e-6)),
        kv("qwen4exp.embedding_length_per_layer_input", U32, struct.pack("<I", 160)),
    ]
    F32T, F16T, BF16T = 0, 1, 30
    W = width
    tensors = [  # name, type, dims, bytes
        ("blk.1.ple_key.weight", F16T, [2560, 4 * W], 2560 * 4 * W * 2),
        ("blk.1.ple_value.weight", BF16T, [2560, W], 2560 * W * 2),
        ("blk.1.ple_norm_key.weight", F32T, [4 * W], 4 * W * 4),
        ("blk.1.ple_norm_query.weight", F32T, [4 * W], 4 * W * 4),
        ("blk.1.ple_norm_conv.weight", F32T, [4 * W], 4 * W * 4),
        ("blk.1.ple_conv1d.weight", F32T, [4, 4 * W], 16 * W * 4),
        ("per_layer_token_embd.weight", BF16T, [160, rows], rows * 320),
    ]
    align = 64
    rel, infos, off = [], b"", 0
    for name, t, dims, nbytes in tensors:
        off = (off + align - 1) // align * align
        rel.append(off)
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", t, off)
        off += nbytes
    head = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    start = (len(head) + align - 1) // align * align
    with open(out, "wb") as f:
        f.write(head)
        f.truncate(start + off)  # every tensor a hole (zeros) ...
        norms = struct.pack("<f", 1.0) * (4 * W)
        for k in (2, 3, 4):  # ... but the norms (1 + w, w = 0)
            f.seek(start + rel[k])
            f.write(norms)
        for r in filled:  # ... and the rows asked for
            f.seek(start + rel[6] + r * 320)
            f.write(b"".join(struct.pack("<H", cell(r, c)) for c in range(160)))


if __name__ == "__main__":
    if sys.argv[1] == "--print-row":  # the values of row R as floats, one line
        r = int(sys.argv[2])
        print(" ".join(repr(struct.unpack("<f", struct.pack("<I", cell(r, c) << 16))[0])
                       for c in range(160)))
    else:
        main()
