#!/usr/bin/python3
"""torch_engram - Engram in a PyTorch engine's forward pass, on the CPU.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_engram.py [MODEL]
        [--dtype bfloat16|float32] [--decode 8] [--chunk 128]

A copyable sketch for engine authors.  A toy decoder (an embedding, 16
transformer-ish blocks over a residual of 4 hyper-connection streams
(n, 4, W), a tied head) calls the engram binding where DeepSeek V4.1 has its
Engram layers: before block 1 (table 0) and before block 14 (table 1).

  * Prefill: two prompts, each in its own engram.Session of one engram.Pool.
    session.prefill(tokens, chunk=...) yields (table, chunk, rows) in the
    order the model needs them (table 0 chunk 0, table 1 chunk 0, table 0
    chunk 1, ...): the pool reads chunk c + 1 while the blocks run on chunk
    c.  Rows are applied to the chunk's residual in place, zero-copy (the
    tensor is handed over through DLPack): prefill.apply(layer, resid) for
    one prompt, Layer.apply(None, resid, rows=rows) for the other (the same
    result; the first also keeps the prefill's bookkeeping).
  * Decode: both sequences advance together, one token each per step.  The
    steps begin (pool.step_batch: both sessions' reads queued at once and
    merged) before any block runs, so the reads overlap blocks 0..13; table
    0 is waited for just before block 1 and table 1 just before block 14,
    then the steps commit (the sessions' histories take the token).

The check (what makes this more than a demo): before every Engram
application the residual is copied, and afterwards Layer.apply(tokens,
copy, history=h) - the binding hashing and reading the rows itself, with
plain reads, from a History kept by this script - must give the same bits
as the pooled path.  Exit 0 and "check: OK" when every comparison held.

MODEL: a DeepSeek V4.1 Engram GGUF of any width; without one a W = 64 model
is built into a temporary directory with build/engram (a few seconds) and
removed at exit.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import engram

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_BLOCKS = 16
ENGRAM_AT = {1: 0, 14: 1}  # block index -> Engram table (layers 1 and 14)


class Block(nn.Module):
    """Transformer-ish: mix the 4 streams, an RMS norm, a small MLP, write
    back into every stream with a learned per-stream gain."""

    def __init__(self, width, streams):
        super().__init__()
        self.mix = nn.Parameter(torch.full((streams,), 1.0 / streams))
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.gain = nn.Parameter(torch.full((streams, 1), 0.1))

    def forward(self, x):  # x: (n, S, W)
        h = torch.einsum("nsw,s->nw", x, self.mix.to(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.down(torch.nn.functional.gelu(self.up(h)))
        return x + self.gain.to(x.dtype) * h.unsqueeze(1)


class ToyDecoder(nn.Module):
    def __init__(self, model, dtype, threads=1):
        super().__init__()
        info = model.info
        self.W, self.S, self.vocab = info["width"], info["streams"], info["vocab"]
        torch.manual_seed(0)
        self.embed = nn.Embedding(self.vocab, self.W)
        self.blocks = nn.ModuleList(Block(self.W, self.S) for _ in range(N_BLOCKS))
        self.to(dtype)
        self.dtype = dtype
        self.model = model
        # the two Engram layers (projection weights in memory) and a pool
        # whose I/O thread reads rows for every session
        self.engram = {t: model.layer(b, threads=threads) for b, t in
                       ((1, 0), (14, 1))}
        self.pool = engram.Pool(model)
        self.checks = 0
        self.failures = []

    # -- the check --------------------------------------------------------
    def checked(self, table, resid, tokens, history, apply):
        """apply() updates resid in place; compare with Layer.apply on a copy
        (tokens hashed by the binding from `history`, which it advances)."""
        ref = resid.clone()
        apply()
        self.engram[table].apply(tokens, ref, history=history)
        self.checks += 1
        bits = torch.int16 if resid.dtype == torch.bfloat16 else torch.int32
        if not torch.equal(resid.view(bits), ref.view(bits)):
            self.failures.append("table %d, tokens %s..: %d values differ" %
                                 (table, list(tokens[:4]), int((resid.view(bits) != ref.view(bits)).sum())))

    def head(self, x):  # last position's logits (tied embedding)
        return x[:, 0].float() @ self.embed.weight.float().t()

    # -- prefill ----------------------------------------------------------
    def prefill(self, session, tokens, chunk, ref_hist, use_layer_rows):
        """Runs the prompt through the blocks chunk by chunk; returns the
        last position's logits."""
        x_last = None
        toks = torch.tensor(tokens)
        with session.prefill(tokens, chunk=chunk, dtype="bfloat16") as pf:
            x = None
            for table, c, rows in pf:
                lo = c * chunk
                part = tokens[lo:lo + rows.shape[0]]
                if table == 0:  # a new chunk: blocks 0..(1-1), then Engram
                    x = self.embed(toks[lo:lo + rows.shape[0]]).unsqueeze(1).repeat(1, self.S, 1)
                    x = x.contiguous()
                    x = self.run(x, 0, 1)
                layer = self.engram[table]
                if use_layer_rows:
                    self.checked(table, x, part, ref_hist[table],
                                 lambda: layer.apply(None, x, rows=rows))
                else:
                    self.checked(table, x, part, ref_hist[table],
                                 lambda: pf.apply(layer, x))
                if table == 0:
                    x = self.run(x, 1, 14)
                else:
                    x = self.run(x, 14, N_BLOCKS)
                    x_last = x[-1:]
        return self.head(x_last)

    def run(self, x, lo, hi):
        for b in range(lo, hi):
            x = self.blocks[b](x).contiguous()
        return x

    # -- decode -----------------------------------------------------------
    def decode_step(self, sessions, next_tok, ref_hist):
        """One token for each sequence; returns their logits."""
        steps = self.pool.step_batch([(s, [t]) for s, t in zip(sessions, next_tok)])
        try:
            x = self.embed(torch.tensor(next_tok)).unsqueeze(1).repeat(1, self.S, 1).contiguous()
            for b in range(N_BLOCKS):
                t = ENGRAM_AT.get(b)
                if t is not None:
                    for i, st in enumerate(steps):
                        xi = x[i:i + 1]  # (1, S, W), contiguous: a view, no copy
                        rows = st.wait(t)  # (1, 24, 256) BF16 bits
                        if i == 0:
                            self.checked(t, xi, [next_tok[i]], ref_hist[i][t],
                                         lambda: st.apply(self.engram[t], xi))
                        else:
                            self.checked(t, xi, [next_tok[i]], ref_hist[i][t],
                                         lambda: self.engram[t].apply(None, xi, rows=rows))
                x = self.blocks[b](x).contiguous()
            for st in steps:
                st.commit(1)
        except BaseException:
            for st in steps:
                st.abort()
            raise
        return self.head(x)

    def close(self):
        self.pool.close()
        for layer in self.engram.values():
            layer.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="V4.1 GGUF (default: build a W=64 one in a temp dir)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="the residual's dtype (bfloat16)")
    ap.add_argument("--decode", type=int, default=8, help="tokens to decode per sequence (8)")
    ap.add_argument("--chunk", type=int, default=128, help="prefill chunk tokens (128)")
    ap.add_argument("--prompts", default="300,517", help="the two prompts' lengths (300,517)")
    o = ap.parse_args()
    lengths = [int(v) for v in o.prompts.split(",")]
    if len(lengths) != 2 or min(lengths) < 1 or o.decode < 0 or not 1 <= o.chunk <= 2048:
        ap.error("--prompts: two positive lengths; --decode >= 0; --chunk 1 .. 2048")
    tmp = None
    t_start = time.perf_counter()
    try:
        if o.model is None:
            tmp = tempfile.mkdtemp(prefix="torch_engram.")
            o.model = os.path.join(tmp, "m64.gguf")
            subprocess.run([os.path.join(ROOT, "build", "engram"), "build", o.model, "--base", "20000",
                            "--width", "64", "--fill", "normal", "--seed", "5"], check=True,
                           stdout=subprocess.DEVNULL)
        return run(o, lengths, t_start)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def run(o, lengths, t_start):
    dtype = getattr(torch, o.dtype)
    model = engram.Model(o.model)
    net = ToyDecoder(model, dtype)
    vocab = net.vocab
    g = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    # reference histories: [sequence][table], advanced by the check's Layer.apply
    ref_hist = [[model.history(), model.history()] for _ in prompts]
    sessions = [net.pool.session() for _ in prompts]
    out = [list() for _ in prompts]
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = [net.prefill(s, p, o.chunk, ref_hist[i], use_layer_rows=(i == 1))
                  for i, (s, p) in enumerate(zip(sessions, prompts))]
        t_prefill = time.perf_counter() - t0
        nxt = [int(l.argmax()) for l in logits]
        t0 = time.perf_counter()
        for _ in range(o.decode):
            for i, t in enumerate(nxt):
                out[i].append(t)
            lg = net.decode_step(sessions, nxt, ref_hist)
            nxt = [int(v) for v in lg.argmax(-1)]
        t_decode = time.perf_counter() - t0
    # (a wrong session history after the prefill would have failed every
    # decode step's check: the steps hash from it, the reference from ref_hist)
    for s in sessions:
        s.close()
    net.close()
    model.close()
    print("model    %s (W %d, %d streams), residual %s, %d blocks, Engram before blocks 1 and 14" %
          (o.model, net.W, net.S, o.dtype, N_BLOCKS))
    print("prefill  2 prompts (%s tokens, chunks of %d): %.3f s" % (",".join(map(str, lengths)), o.chunk,
                                                                    t_prefill))
    print("decode   %d steps x 2 sequences: %.3f s; tokens %s | %s" % (o.decode, t_decode, out[0], out[1]))
    if net.failures:
        print("check: FAILED (%d of %d applications differ from Layer.apply on a copy)" %
              (len(net.failures), net.checks))
        for f in net.failures[:10]:
            print("  " + f)
        return 1
    print("check: OK (%d Engram applications, each the same bits as Layer.apply(tokens, copy)); %.1f s total"
          % (net.checks, time.perf_counter() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
