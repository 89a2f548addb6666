"""engram.Model: hash and rows bit for bit against the CLI (`engram hash`,
`engram rows`), on V4.1 at W = 64 and W = 5120 and on a PLE model; History
carried across cut points; info; the docstrings help() shows."""
import os
import pydoc

import numpy as np
import pytest

import engram

torch = pytest.importorskip("torch")

MODELS = ["v41_path", "v41_wide_path", "ple_path"]


def write_ints(path, values):
    with open(path, "w") as f:
        f.write("\n".join(str(int(v)) for v in values) + "\n")
    return path


def cli_hash(cli, model, tmp_path, tokens, mask=None, history=None):
    args = ["hash", model, "--tokens", write_ints(tmp_path / "tok.txt", tokens)]
    if mask is not None:
        args += ["--mask", write_ints(tmp_path / "mask.txt", mask)]
    if history is not None:
        args += ["--history", ",".join(str(int(i)) for i in history)]
    out = cli(*args).stdout.decode().split("\n")
    rows = [list(map(int, line.split())) for line in out if line.strip()]
    return np.array(rows, dtype=np.uint32).reshape(len(tokens), -1)


def cli_rows(cli, model, tmp_path, table, ids):
    out = cli("rows", model, "--table", table, "--rows",
              write_ints(tmp_path / "ids.txt", ids)).stdout.decode().split("\n")
    # %.9g names a float32 exactly
    vals = [[np.float32(float(v)) for v in line.split()] for line in out if line.strip()]
    return np.array(vals, dtype=np.float32)


def tokens_and_mask(m, n, seed):
    rng = np.random.default_rng(seed)
    vocab = m.info["vocab"]
    t = rng.integers(0, vocab, n)
    t[rng.integers(0, n, n // 5)] = rng.integers(0, 50, n // 5)  # small ids, repeats
    t[:3] = [0, vocab - 1, 1]
    mask = (rng.integers(0, 7, n) != 3).astype(np.uint8)
    return t, mask


@pytest.mark.parametrize("fixture", MODELS)
def test_hash_equals_cli(request, cli, tmp_path, fixture):
    path = request.getfixturevalue(fixture)
    m = engram.Model(path)
    ple = m.info["member"] == "qwen3.8-ple"
    n = 300
    tokens, mask = tokens_and_mask(m, n, 11)
    per = 16 if ple else 48
    want = cli_hash(cli, path, tmp_path, tokens)
    want_masked = cli_hash(cli, path, tmp_path, tokens, mask)
    assert want.shape == (n, per)
    assert not np.array_equal(want, want_masked)

    # one call, several input kinds
    for tk in (tokens, list(map(int, tokens)), tokens.astype(np.uint32), tokens.astype(np.int64),
               torch.from_numpy(tokens.astype(np.int32))):
        got = m.hash(tk)
        assert got.dtype == np.uint32 and got.shape == (n, per)
        assert np.array_equal(got, want)
    assert np.array_equal(m.hash(tokens, mask=mask), want_masked)
    assert np.array_equal(m.hash(tokens, mask=list(map(int, mask))), want_masked)
    assert np.array_equal(m.hash(tokens, mask=mask.astype(bool)), want_masked)

    # out=: filled in place, returned
    out = np.zeros((n, per), np.uint32)
    r = m.hash(tokens, mask=mask, out=out)
    assert r is out and np.array_equal(out, want_masked)
    out_t = torch.zeros((n, per), dtype=torch.int32)
    m.hash(tokens, mask=mask, out=out_t)
    assert np.array_equal(out_t.numpy().view(np.uint32), want_masked)

    # a stream cut anywhere with a History carried = one call
    rng = np.random.default_rng(5)
    for trial in range(4):
        cuts = sorted(set(rng.integers(0, n + 1, trial + 2).tolist()) | {0, n})
        h = m.history()
        parts = [m.hash(tokens[a:b], history=h, mask=mask[a:b]) for a, b in zip(cuts, cuts[1:])]
        assert np.array_equal(np.concatenate(parts), want_masked), cuts
    # token by token
    h = engram.History(m)
    parts = [m.hash(tokens[i:i + 1], h, mask[i:i + 1]) for i in range(40)]
    assert np.array_equal(np.concatenate(parts), want_masked[:40])


@pytest.mark.parametrize("fixture", ["v41_path", "v41_wide_path"])
def test_hash_history_equals_cli_history(request, cli, tmp_path, fixture):
    """History.ids after a prefix, given to `engram hash --history`, hashes
    the rest as the Python History does."""
    path = request.getfixturevalue(fixture)
    m = engram.Model(path)
    tokens, mask = tokens_and_mask(m, 120, 3)
    for cut in (1, 2, 3, 57, 119):
        h = m.history()
        m.hash(tokens[:cut], history=h, mask=mask[:cut])
        ids = h.ids
        assert len(ids) == 3
        rest = m.hash(tokens[cut:], history=h, mask=mask[cut:])
        assert np.array_equal(rest, cli_hash(cli, path, tmp_path, tokens[cut:], mask[cut:], ids))
        # a History set from ids hashes the same
        h2 = m.history()
        h2.ids = ids
        assert np.array_equal(m.hash(tokens[cut:], history=h2, mask=mask[cut:]), rest)
        assert h2.ids == h.ids
    # copy() is a snapshot; reset() a sequence start
    h = m.history()
    m.hash(tokens[:10], history=h)
    c = h.copy()
    m.hash(tokens[10:20], history=h)
    assert c.ids != h.ids
    h.reset()
    assert h.ids == (-1, -1, -1)


def test_ple_history_lags(cli, tmp_path, ple_path):
    m = engram.Model(ple_path)
    h = m.history()
    eos = m.info["eos"]
    assert h.ids == (eos, eos)
    m.hash([5, 6, 7], history=h)
    assert h.ids == (7, 6)
    h.reset()
    assert h.ids == (eos, eos)


@pytest.mark.parametrize("fixture", MODELS)
def test_rows_equal_cli(request, cli, tmp_path, fixture):
    path = request.getfixturevalue(fixture)
    m = engram.Model(path)
    info = m.info
    tokens, _ = tokens_and_mask(m, 12, 7)
    ids = m.hash(tokens)
    rv = info["row_values"]
    tables = [(0, ids.ravel())] if info["tables"] == 1 else \
        [(0, ids[:, :24].ravel()), (1, ids[:, 24:].ravel())]
    for t, tid in tables:
        tid = tid[:100]
        want = cli_rows(cli, path, tmp_path, t, tid)
        assert want.shape == (len(tid), rv)
        f = m.rows(t, tid)
        assert f.dtype == np.float32 and f.shape == (len(tid), rv)
        assert np.array_equal(f.view(np.uint32), want.view(np.uint32))
        b = m.rows(t, tid, "bfloat16")
        assert b.dtype == np.uint16 and b.shape == (len(tid), rv)
        assert np.array_equal(b.astype(np.uint32) << 16, f.view(np.uint32))
        assert np.array_equal(m.rows(t, list(map(int, tid)), dtype="float32"), f)
        # out=: float32 numpy and torch, BF16 as uint16 numpy and torch.bfloat16
        o = np.empty((len(tid), rv), np.float32)
        assert m.rows(t, tid, out=o) is o and np.array_equal(o, f)
        ot = torch.empty((len(tid), rv), dtype=torch.bfloat16)
        m.rows(t, tid, "bfloat16", out=ot)
        assert np.array_equal(ot.view(torch.int16).numpy().view(np.uint16), b)
        ou = np.empty((len(tid), rv), np.uint16)
        m.rows(t, tid, "bfloat16", ou)
        assert np.array_equal(ou, b)
        ot32 = torch.empty((len(tid), rv))
        m.rows(t, tid, out=ot32)
        assert np.array_equal(ot32.numpy(), f)
        # first and last rows of the table
        last = info["rows"][t] - 1
        want = cli_rows(cli, path, tmp_path, t, [0, last])
        assert np.array_equal(m.rows(t, [0, last]).view(np.uint32), want.view(np.uint32))
    assert m.rows(0, []).shape == (0, rv)


def test_info(v41_path, v41_wide_path, ple_path):
    i = engram.Model(v41_path).info
    assert (i["member"], i["width"], i["streams"], i["tables"], i["layers"], i["rows_per_token"],
            i["row_values"]) == ("deepseek-v4.1-engram", 64, 4, 2, [1, 14], 48, 256)
    assert i["file_bytes"] == os.path.getsize(v41_path)
    assert engram.Model(v41_wide_path).info["width"] == 5120
    p = engram.Model(ple_path).info
    assert (p["member"], p["tables"], p["rows_per_token"], p["row_values"]) == \
        ("qwen3.8-ple", 1, 16, 160)
    assert p["state_floats"] > 0 and p["eos"] is not None and p["compressed_vocab"] is None


def test_model_context_and_path(v41_path):
    with engram.Model(v41_path) as m:
        assert m.path == v41_path
        assert "v4.1" in repr(m)
    with pytest.raises(engram.ClosedError):
        m.hash([1])


def _doc(obj):
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def test_docstrings_render():
    d = _doc(engram.Model)
    for word in ("hash(tokens, history=None, mask=None, out=None)",
                 "rows(table, ids, dtype", "layer(layer, threads=None)", "history()", "close()",
                 "NotFoundError", "info"):
        assert word in d, word
    d = _doc(engram.Layer)
    for word in ("apply(tokens, residual, mask=None, history=None, threads=None, rows=None, "
                 "state=None)", "IN PLACE", "new_state()", "close()", "TypeError", "ValueError"):
        assert word in d, word
    d = _doc(engram.History)
    assert "History(model)" in d and "ids" in d and "reset()" in d
    assert engram.Error.__doc__ and engram.ArgumentError.__doc__
    assert engram.strerror.__doc__ and engram.version.__doc__
