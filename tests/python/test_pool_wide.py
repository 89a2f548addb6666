"""Sessions on the W = 5120 model (the real width): step rows (both tables,
BF16 and F32) equal Model.rows of Model.hash (plain preads), Step.apply and
Layer.apply(rows=view) equal Layer.apply(tokens) on copies, and a prefill's
rows and Prefill.apply over its chunks equal the same: the binding's
sessions at the width where the projection is 315 MB of weights."""
import numpy as np

import engram


def ref(m, ids, t, dtype, mask=None):
    r = np.zeros((ids.shape[0], 24, 256), np.float32 if dtype == "float32" else np.uint16)
    for i in range(ids.shape[0]):
        if mask is None or mask[i]:
            r[i] = m.rows(t, ids[i, 24 * t:24 * t + 24], dtype=dtype)
    return r


def test_steps_and_prefill_at_w5120(v41_wide_path):
    m = engram.Model(v41_wide_path)
    W = m.info["width"]
    assert W == 5120
    rng = np.random.default_rng(5120)
    L1, L14 = m.layer(1, threads=2), m.layer(14, threads=2)
    h = m.history()
    with engram.Pool(m) as pool, pool.session() as s:
        for k, dtype in ((1, "bfloat16"), (3, "float32"), (8, "bfloat16")):
            tok = rng.integers(0, m.info["vocab"], k)
            mask = (np.arange(k) % 3 != 2).astype(np.uint8)
            ids = m.hash(tok, history=h.copy(), mask=mask)
            x = rng.standard_normal((k, 4, W)).astype(np.float32)
            want = x.copy()
            hh = h.copy()
            L1.apply(tok, want, mask=mask, history=hh)
            L14.apply(tok, want, mask=mask, history=h.copy())
            with s.step(tok, mask=mask, dtype=dtype) as st:
                for t in (0, 1):
                    got = st.wait(t)
                    assert np.array_equal(got, ref(m, ids, t, dtype, mask)), (k, dtype, t)
                y = x.copy()
                L1.apply(None, y, rows=st.wait(0), mask=mask)
                L14.apply(None, y, rows=st.wait(1), mask=mask)
                assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (k, dtype)
                z = x.copy()
                st.apply(L1, z)
                st.apply(L14, z)
                assert np.array_equal(z.view(np.uint32), want.view(np.uint32)), (k, dtype)
                st.commit()
            m.hash(tok, history=h, mask=mask)
            assert s.history == h.ids
        # a prompt of 150 tokens in chunks of 64: rows and Prefill.apply
        tok = rng.integers(0, m.info["vocab"], 150)
        ids = m.hash(tok, history=h.copy())
        x = rng.standard_normal((150, 4, W)).astype(np.float32)
        want = x.copy()
        L1.apply(tok, want, history=h.copy())
        y = x.copy()
        seen = 0
        with s.prefill(tok, chunk=64) as pf:
            for t, c, rows in pf:
                sl = slice(pf.first, pf.first + pf.n_tokens)
                assert np.array_equal(rows, ref(m, ids[sl], t, "bfloat16")), (t, c)
                if t == 0:
                    pf.apply(L1, y[sl])
                seen += 1
        assert seen == 6
        assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    L1.close()
    L14.close()
