#!/usr/bin/python3
"""Pools the per-round figures of several `engram bench io --csv` files.

Independent of bench_io.c's summary: reads only the raw "round" rows
(engram_iops, fio_same_size_iops, fio_batched_iops, in round order per
depth), recomputes each round's ratio = engram / max(the two same-size fio
runs of that round), and prints per file and pooled: the median ratio, the
share of rounds at >= 0.95, and a bootstrap 95% interval of the median
(rounds resampled with replacement, 20,000 draws, fixed seed) and of the
ratio of means.  Usage: pool.py run1.csv run2.csv ...
"""
import csv
import sys

import numpy as np


def rounds(path):
    got = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["section"] != "round" or not row["what"].endswith("_iops"):
                continue
            d = int(row["depth"])
            got.setdefault(d, {}).setdefault(row["what"], []).append(float(row["value"]))
    out = {}
    for d, w in got.items():
        e = np.array(w["engram_iops"])
        f = np.maximum(np.array(w["fio_same_size_iops"]), np.array(w["fio_batched_iops"]))
        assert len(e) == len(f)
        keep = f > 0
        out[d] = (e[keep], f[keep])
    return out


def ci(x, stat, rng, draws=20000):
    idx = rng.integers(0, len(x), size=(draws, len(x)))
    s = np.array([stat(x[i]) for i in idx])
    return np.percentile(s, [2.5, 97.5])


def main(paths):
    rng = np.random.default_rng(25)
    pooled = {}
    for p in paths:
        for d, (e, f) in sorted(rounds(p).items()):
            r = e / f
            pooled.setdefault(d, []).append((e, f))
            print(f"{p} depth {d:3d}: rounds {len(r):3d}  median {np.median(r):.3f}  "
                  f"[{r.min():.2f}, {r.max():.2f}]  >=0.95 in {np.mean(r >= 0.95) * 100:.0f}%  "
                  f"engram median {np.median(e):.0f}/s  fio median {np.median(f):.0f}/s")
    for d, parts in sorted(pooled.items()):
        e = np.concatenate([a for a, _ in parts])
        f = np.concatenate([b for _, b in parts])
        r = e / f
        lo, hi = ci(r, np.median, rng)
        both = np.stack([e, f], 1)
        idx = rng.integers(0, len(r), size=(20000, len(r)))
        rom = both[idx, 0].sum(1) / both[idx, 1].sum(1)
        mlo, mhi = np.percentile(rom, [2.5, 97.5])
        print(f"pooled depth {d:3d}: rounds {len(r):3d}  median ratio {np.median(r):.3f} "
              f"(95% bootstrap {lo:.3f}-{hi:.3f})  sum(engram)/sum(fio) {e.sum() / f.sum():.3f} "
              f"({mlo:.3f}-{mhi:.3f})  rounds >= 0.95: {np.mean(r >= 0.95) * 100:.0f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
