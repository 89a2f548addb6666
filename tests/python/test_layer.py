"""engram.Layer.apply bit for bit against `engram apply` (its OUT files), in
place and zero-copy: float32 NumPy, torch float32, torch bfloat16, NumPy
uint16 BF16 bits; V4.1 layers 1 and 14 at W = 64 and W = 5120, masks, a
history, threads 1 and 3; PLE with its state carried across calls."""
import numpy as np
import pytest

import engram

torch = pytest.importorskip("torch")


def write_ints(path, values):
    with open(path, "w") as f:
        f.write("\n".join(str(int(v)) for v in values) + "\n")
    return str(path)


def bf16_bits(x):
    """float32 -> BF16 bit patterns (uint16), round to nearest even."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def cli_apply(cli, tmp_path, model, layer, tokens, resid, mask=None, history=None, threads=None,
              bf16=False, chunk=None):
    """`engram apply` on resid (float32 or BF16 bits as uint16): OUT as the
    same dtype and shape."""
    fin, fout = tmp_path / "in.bin", tmp_path / "out.bin"
    resid.tofile(fin)
    args = ["apply", model, "--layer", layer, "--tokens", write_ints(tmp_path / "tok.txt", tokens),
            "--residual-in", fin, "--residual-out", fout]
    if mask is not None:
        args += ["--mask", write_ints(tmp_path / "mask.txt", mask)]
    if history is not None:
        args += ["--history", ",".join(str(int(i)) for i in history)]
    if threads is not None:
        args += ["--threads", threads]
    if chunk is not None:
        args += ["--chunk", chunk]
    if bf16:
        args += ["--residual-bf16"]
    cli(*args)
    return np.fromfile(fout, dtype=resid.dtype).reshape(resid.shape)


def case(m, n, seed, masked=True):
    rng = np.random.default_rng(seed)
    S, W = m.info["streams"], m.info["width"]
    tokens = rng.integers(0, m.info["vocab"], n)
    tokens[rng.integers(0, n, n // 4)] = rng.integers(0, 30, n // 4)
    mask = (rng.integers(0, 6, n) != 2).astype(np.uint8) if masked else None
    x = (rng.standard_normal((n, S, W)) * 2).astype(np.float32)
    return tokens, mask, x


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def torch_bits(t):
    """a torch bfloat16 / float32 tensor's bits as uint16 / float32 numpy"""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def apply_all_kinds(layer, tokens, x, xb, **kw):
    """apply on float32 numpy, torch float32, uint16 numpy and torch
    bfloat16: the four results (each in place, zero-copy)"""
    a = x.copy()
    r = layer.apply(tokens, a, **kw)
    assert r is a
    t = torch.from_numpy(x.copy())
    p = t.data_ptr()
    assert layer.apply(tokens, t, **kw) is t and t.data_ptr() == p
    u = xb.copy()
    layer.apply(tokens, u, **kw)
    tb = torch.from_numpy(xb.copy().view(np.int16)).view(torch.bfloat16)
    layer.apply(tokens, tb, **kw)
    return a, t.numpy(), u, torch_bits(tb)


def check_v41(cli, tmp_path, path, layer_no, n, seed, threads=(1, 3), history=(-1, -1, -1)):
    m = engram.Model(path)
    tokens, mask, x = case(m, n, seed)
    xb = bf16_bits(x)
    want = cli_apply(cli, tmp_path, path, layer_no, tokens, x, mask, history)
    want_b = cli_apply(cli, tmp_path, path, layer_no, tokens, xb, mask, history, bf16=True)
    assert not same_bits(want, x)
    # masked tokens untouched
    assert same_bits(want[mask == 0], x[mask == 0])
    for th in threads:
        layer = m.layer(layer_no, threads=th)
        h = m.history()
        h.ids = history
        h2 = h.copy()
        a = x.copy()
        layer.apply(tokens, a, mask=mask, history=h)
        assert same_bits(a, want), (layer_no, th)
        # the history is advanced in place: each call gets a copy of the start
        hs = [h2.copy() for _ in range(4)]
        a = x.copy()
        layer.apply(tokens, a, mask, hs[0])
        t = torch.from_numpy(x.copy())
        layer.apply(tokens, t, mask=mask, history=hs[1])
        u = xb.copy()
        layer.apply(tokens, u, mask=mask, history=hs[2])
        tb = torch.from_numpy(xb.copy().view(np.int16)).view(torch.bfloat16)
        layer.apply(tokens, tb, mask=mask, history=hs[3], threads=th)
        assert same_bits(a, want)
        assert same_bits(t.numpy(), want)
        assert same_bits(u, want_b)
        assert same_bits(torch_bits(tb), want_b)
        assert all(g.ids == h.ids for g in hs)
        layer.close()
    return m


def test_v41_w64_layer1(cli, tmp_path, v41_path):
    check_v41(cli, tmp_path, v41_path, 1, 50, 1, history=(17, -1, 4))


def test_v41_w64_layer14(cli, tmp_path, v41_path):
    # more than the binding's 1024 tokens a round: the history carried inside
    check_v41(cli, tmp_path, v41_path, 14, 1100, 2, threads=(3,))


def test_v41_w5120(cli, tmp_path, v41_wide_path):
    check_v41(cli, tmp_path, v41_wide_path, 1, 5, 3, threads=(2,), history=(5, 6, 7))
    check_v41(cli, tmp_path, v41_wide_path, 14, 4, 4, threads=(1,))


def test_v41_cut_anywhere(cli, tmp_path, v41_path):
    """calls of any size with the History carried = one `engram apply`"""
    m = engram.Model(v41_path)
    tokens, mask, x = case(m, 90, 9)
    want = cli_apply(cli, tmp_path, v41_path, 1, tokens, x, mask, chunk=7)
    layer = m.layer(1, threads=1)
    rng = np.random.default_rng(1)
    for _ in range(3):
        cuts = sorted(set(rng.integers(0, 91, 5).tolist()) | {0, 90})
        h = m.history()
        a = x.copy()
        for s, e in zip(cuts, cuts[1:]):
            layer.apply(tokens[s:e], a[s:e], mask=mask[s:e], history=h)
        assert same_bits(a, want), cuts
    # no mask: all applied
    want = cli_apply(cli, tmp_path, v41_path, 1, tokens, x)
    a = x.copy()
    layer.apply(list(map(int, tokens)), a)
    assert same_bits(a, want)


def test_v41_rows_route(v41_path):
    """apply from rows= (Model.rows: plain positional reads) = apply from
    tokens (hashed and read through the reader)"""
    m = engram.Model(v41_path)
    tokens, mask, x = case(m, 20, 12)
    ids = m.hash(tokens, mask=mask)
    for layer_no, cols in ((1, slice(0, 24)), (14, slice(24, 48))):
        layer = m.layer(layer_no, threads=1)
        t = layer_no // 14
        want = x.copy()
        layer.apply(tokens, want, mask=mask)
        rb = m.rows(t, ids[:, cols].ravel(), "bfloat16").reshape(20, 24, 256)
        rf = m.rows(t, ids[:, cols].ravel()).reshape(20, 24, 256)
        for rows in (rb, rf, torch.from_numpy(rf),
                     torch.from_numpy(rb.view(np.int16)).view(torch.bfloat16)):
            a = x.copy()
            layer.apply(None, a, mask=mask, rows=rows)
            assert same_bits(a, want)
        # each token's rows contiguous, tokens strided: accepted
        big = np.zeros((20, 30, 256), np.uint16)
        big[:, :24] = rb
        a = x.copy()
        layer.apply(None, a, mask=mask, rows=big[:, :24])
        assert same_bits(a, want)


def test_default_threads(v41_path):
    """threads= left out: one worker per CPU of the process's affinity mask
    (engram_default_threads), counted here by os.sched_getaffinity"""
    import os
    m = engram.Model(v41_path)
    assert m.layer(1).info["threads"] == min(256, len(os.sched_getaffinity(0)))  # ENGRAM_APPLY_MAX_THREADS
    assert m.layer(1, threads=1).info["threads"] == 1


def test_zero_copy(v41_path):
    m = engram.Model(v41_path)
    layer = m.layer(1, threads=1)
    tokens, _, x = case(m, 6, 4, masked=False)
    # NumPy: the same memory, seen through a second view
    a = x.copy()
    ptr = a.ctypes.data
    view = np.frombuffer(a.data, dtype=np.float32).reshape(a.shape)  # another object
    mv = memoryview(a)
    before = view.copy()
    assert layer.apply(tokens, a) is a
    assert a.ctypes.data == ptr
    assert not same_bits(view, before)
    assert same_bits(view, a)
    assert np.frombuffer(mv, np.float32).tobytes() == a.tobytes()
    # a view of a bigger buffer: only its part changes
    big = np.zeros((10, 4, 64), np.float32)
    big[2:8] = x
    guard = big.copy()
    layer.apply(tokens, big[2:8])
    assert same_bits(big[:2], guard[:2]) and same_bits(big[8:], guard[8:])
    assert same_bits(big[2:8], a)
    # torch: same data_ptr, its numpy view and another tensor view see it
    for dt in (torch.float32, torch.bfloat16):
        t = torch.from_numpy(x.copy()).to(dt)
        p = t.data_ptr()
        alias = t.view(t.shape)
        flat = t.reshape(-1)
        before = t.clone()
        layer.apply(tokens, t)
        assert t.data_ptr() == p and alias.data_ptr() == p
        assert not torch.equal(alias, before)
        assert torch.equal(alias, t) and torch.equal(flat.view(t.shape), t)
    tn = torch.from_numpy(x.copy())
    npv = tn.numpy()
    layer.apply(tokens, tn)
    assert same_bits(npv, a)
    # bytearray / memoryview exporters
    ba = bytearray(x.tobytes())
    mvw = memoryview(ba).cast("f", x.shape)
    layer.apply(tokens, mvw)
    assert bytes(ba) == a.tobytes()


def ple_case(m, n, seed):
    tokens, mask, x = case(m, n, seed)
    return tokens, mask, x


@pytest.mark.parametrize("n", [70, 1030])
def test_ple_equals_cli(cli, tmp_path, ple_path, n):
    m = engram.Model(ple_path)
    layer_no = m.info["layers"][0]
    tokens, mask, x = ple_case(m, n, 21 + n)
    xb = bf16_bits(x)
    want = cli_apply(cli, tmp_path, ple_path, layer_no, tokens, x, mask, chunk=13)
    want_b = cli_apply(cli, tmp_path, ple_path, layer_no, tokens, xb, mask, bf16=True)
    assert not same_bits(want, x)
    for th in (1, 3):
        layer = m.layer(layer_no, threads=th)
        assert layer.info["state_floats"] == m.info["state_floats"]
        # one call, from a sequence start (no state, no history)
        for got in apply_all_kinds(layer, tokens, x, xb, mask=mask)[:2]:
            assert same_bits(got, want)
        for got in apply_all_kinds(layer, tokens, x, xb, mask=mask)[2:]:
            assert same_bits(got, want_b)
        # one call with a new state and history: the same, and they advance
        st = layer.new_state()
        assert st.dtype == np.float32 and st.shape == (m.info["state_floats"],) and not st.any()
        h = m.history()
        a = x.copy()
        layer.apply(tokens, a, mask=mask, history=h, state=st)
        assert same_bits(a, want)
        assert st.any()
        # cut anywhere, state and history carried = one call
        rng = np.random.default_rng(th)
        for _ in range(3):
            cuts = sorted(set(rng.integers(0, n + 1, 6).tolist()) | {0, n})
            st2, h2 = layer.new_state(), m.history()
            a = x.copy()
            for s, e in zip(cuts, cuts[1:]):
                layer.apply(tokens[s:e], a[s:e], mask=mask[s:e], history=h2, state=st2)
            assert same_bits(a, want), cuts
            assert same_bits(st2, st) and h2.ids == h.ids
        # BF16 residual in calls, state as a torch tensor
        stt = torch.zeros(m.info["state_floats"])
        h3 = m.history()
        tb = torch.from_numpy(xb.copy().view(np.int16)).view(torch.bfloat16)
        for s in range(0, n, 17):
            layer.apply(tokens[s:s + 17], tb[s:s + 17], mask=mask[s:s + 17], history=h3, state=stt)
        assert same_bits(torch_bits(tb), want_b)
        layer.close()


def test_ple_state_without_history_is_a_fresh_hash(ple_path):
    """state carried but no history: each call hashes from a sequence start,
    so it differs from one call (the history matters)"""
    m = engram.Model(ple_path)
    layer = m.layer(m.info["layers"][0], threads=1)
    tokens, _, x = ple_case(m, 20, 5)
    one = x.copy()
    layer.apply(tokens, one)
    st = layer.new_state()
    a = x.copy()
    layer.apply(tokens[:10], a[:10], state=st)
    layer.apply(tokens[10:], a[10:], state=st)
    assert same_bits(a[:10], one[:10])
    assert not same_bits(a[10:], one[10:])
    # layer 0 names PLE's one layer too
    l0 = m.layer(0, threads=1)
    b = x.copy()
    l0.apply(tokens, b)
    assert same_bits(b, one)
