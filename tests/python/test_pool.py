"""engram.Pool / Session / Step / Prefill against independent paths.

Known answers: Model.hash + Model.rows (plain positional reads of the file,
not the pool's reader) for every row a step or prefill delivers, and
Layer.apply(tokens) (its own hash and reader) for every apply.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python/test_pool.py

The models are built with build/engram (ENGRAM_BUILD names another build
directory) into a temporary directory once per run.
"""
import errno
import gc
import sys
import threading

import numpy as np
import pytest

import engram


@pytest.fixture(scope="session")
def models(v41_path, ple_path):
    # conftest's session models (V4.1 W = 64 base 20000 seed 5; PLE W = 64
    # base 20011 seed 3), built once for every test file that uses them
    # (conftest skips where there is no engram binary)
    return {"v4": v41_path, "ple": ple_path}


@pytest.fixture(scope="session")
def v4(models):
    return engram.Model(models["v4"])


@pytest.fixture(scope="session")
def ple(models):
    return engram.Model(models["ple"])


@pytest.fixture(params=["v4", "ple"])
def model(request, v4, ple):
    return v4 if request.param == "v4" else ple


def is_ple(m):
    return m.info["member"] == "qwen3.8-ple"


def tokens_for(m, rng, n):
    return rng.integers(0, m.info["vocab"], size=n).astype(np.int64)


def mask_for(m, rng, n):
    """None half the time; else a mask with some masked / padding tokens."""
    if rng.random() < 0.5:
        return None
    if is_ple(m):
        return rng.choice([engram.MASK_PAD, engram.MASK_TEXT, engram.MASK_IMAGE], size=n, p=[0.2, 0.6, 0.2]).astype(np.uint8)
    return (rng.random(n) > 0.25).astype(np.uint8)


def ref_rows(m, ids, dtype, mask):
    """Per table, [n][rows][values] from plain preads; masked tokens' rows 0."""
    f = m.info
    rpt = 24 if not is_ple(m) else 16
    out = []
    for t in range(f["tables"]):
        r = np.zeros((ids.shape[0], rpt, f["row_values"]), np.float32 if dtype == "float32" else np.uint16)
        for i in range(ids.shape[0]):
            if mask is not None and mask[i] == 0:
                continue
            r[i] = m.rows(t, ids[i, t * rpt:(t + 1) * rpt], dtype=dtype)
        out.append(r)
    return out


def hist_ids(m, h):
    return tuple(h.ids) if not is_ple(m) else tuple(h.ids)


def sess_hist(m, s):
    h = s.history
    return h if not is_ple(m) else h[:2]


# ------------------------------------------------------------- steps' rows


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_step_rows_equal_preads(model, dtype):
    m = model
    rng = np.random.default_rng(11 if dtype == "bfloat16" else 12)
    h = m.history()
    checked = 0
    with engram.Pool(m) as pool, pool.session() as s:
        for it in range(24):
            k = it % engram.MAX_DRAFT + 1
            tok = tokens_for(m, rng, k)
            mask = mask_for(m, rng, k)
            st = s.step(tok, mask=mask, dtype=dtype)
            ids = m.hash(tok, history=h.copy(), mask=mask)
            ref = ref_rows(m, ids, dtype, mask)
            order = [1, 0] if m.info["tables"] == 2 and it % 2 else list(range(m.info["tables"]))
            for t in order:
                got = st.wait(t)
                assert got.shape == ref[t].shape and got.dtype == ref[t].dtype
                assert np.array_equal(got.view(np.uint32 if dtype == "float32" else np.uint16),
                                      ref[t].view(np.uint32 if dtype == "float32" else np.uint16)), (it, t)
                assert st.poll(t)
                checked += 1
            # whole buffer: the views are views of out
            assert st.out.shape[0] == k and st.k == k
            j = int(rng.integers(0, k + 1))
            st.commit(j)
            assert st.state == "committed"
            m.hash(tok[:j], history=h, mask=None if mask is None else mask[:j])
            assert sess_hist(m, s) == hist_ids(m, h)
    assert checked >= 24


def test_raw_dtype(model):
    m = model
    rng = np.random.default_rng(3)
    with engram.Pool(m) as pool, pool.session() as s:
        tok = tokens_for(m, rng, 3)
        st = s.step(tok, dtype="raw")
        bf = ref_rows(m, m.hash(tok), "bfloat16", None)
        for t in range(m.info["tables"]):
            v = st.wait(t)
            if is_ple(m):  # PLE raw = its BF16 bytes
                assert v.dtype == np.uint16 and np.array_equal(v, bf[t])
            else:
                assert v.dtype == np.uint8 and v.shape == (3, 24, 264)
        st.abort()


def test_out_argument(v4):
    m = v4
    rng = np.random.default_rng(4)
    with engram.Pool(m) as pool, pool.session() as s:
        tok = tokens_for(m, rng, 2)
        out = np.full((2, 48, 256), 7, np.float32)
        st = s.step(tok, dtype="float32", out=out)
        assert st.out is out
        v = st.wait(0)
        assert np.shares_memory(v, out)
        ref = ref_rows(m, m.hash(tok), "float32", None)
        assert np.array_equal(v, ref[0]) and np.array_equal(st.wait(1), ref[1])
        st.abort()
        with pytest.raises(ValueError):
            s.step(tok, out=np.zeros((2, 48, 255), np.uint16))
        with pytest.raises(TypeError):
            s.step(tok, out=np.zeros((2, 48, 256), np.float32))  # bfloat16 wants uint16
        with pytest.raises(ValueError):
            s.step(tok, out=np.zeros((2, 48, 512), np.uint16)[:, :, ::2])
        ro = np.zeros((2, 48, 256), np.uint16)
        ro.flags.writeable = False
        with pytest.raises(ValueError):
            s.step(tok, out=ro)
        with pytest.raises(ValueError):
            s.step([])
        with pytest.raises(ValueError):
            s.step(list(range(engram.MAX_DRAFT + 1)))
        with pytest.raises(engram.ArgumentError):
            s.step([m.info["vocab"]])
        with pytest.raises(ValueError):
            s.step(tok, dtype="f16")
        assert s.history == (-1, -1, -1)  # nothing began


def test_out_torch(v4):
    torch = pytest.importorskip("torch")
    m = v4
    tok = [17, 4242, 99]
    with engram.Pool(m) as pool, pool.session() as s:
        out = torch.zeros((3, 48, 256), dtype=torch.bfloat16)
        st = s.step(tok, out=out)
        v = st.wait(1)
        assert isinstance(v, torch.Tensor) and v.shape == (3, 24, 256)
        st.wait(0)
        st.commit()
        bits = out.view(torch.int16).numpy().view(np.uint16)
        ref = ref_rows(m, m.hash(tok), "bfloat16", None)
        assert np.array_equal(bits[:, :24], ref[0]) and np.array_equal(bits[:, 24:], ref[1])


# ------------------------------------------------------------- applies


def layers_of(m):
    return [m.layer(L) for L in (m.info["layers"] if not is_ple(m) else [m.info["layers"][0]])]


def test_step_apply_equals_layer_apply(model):
    m = model
    rng = np.random.default_rng(21)
    S, W = m.info["streams"], m.info["width"]
    layers = layers_of(m)
    h = m.history()
    state = layers[0].new_state() if is_ple(m) else None
    with engram.Pool(m) as pool, pool.session() as s:
        for it in range(16):
            k = it % 4 + 1
            tok = tokens_for(m, rng, k)
            mask = mask_for(m, rng, k)
            st = s.step(tok, mask=mask)
            x = rng.standard_normal((k, S, W)).astype(np.float32)
            ref = x.copy()
            ref_rows_x = x.copy()
            for t, L in enumerate(layers):
                rows = st.wait(t)
                st.apply(L, x)
                kw = {"state": state.copy()} if is_ple(m) else {}
                L.apply(None, ref_rows_x, rows=rows, mask=mask, **kw)
                hk = {"state": state} if is_ple(m) else {}
                L.apply(tok, ref, mask=mask, history=h.copy(), **hk)
            if not is_ple(m):
                m.hash(tok, history=h, mask=mask)
            else:
                m.hash(tok, history=h, mask=mask)
            assert np.array_equal(x.view(np.uint32), ref.view(np.uint32)), it
            assert np.array_equal(ref_rows_x.view(np.uint32), ref.view(np.uint32)), it
            st.commit()  # PLE: the session's state advances with the tokens


def test_step_apply_bf16_residual(v4):
    m = v4
    L = m.layer(14)
    rng = np.random.default_rng(5)
    tok = tokens_for(m, rng, 3)
    x = (rng.standard_normal((3, 4, 64)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    ref = x.copy()
    with engram.Pool(m) as pool, pool.session() as s:
        with s.step(tok) as st:
            with pytest.raises(engram.ArgumentError):
                st.apply(L, x)  # table 1 not waited for
            st.wait(1)
            st.apply(L, x)
            st.commit()
        with pytest.raises(engram.ArgumentError):
            st.apply(L, x.copy())  # ended
    with pytest.raises(engram.ClosedError):
        st.apply(L, x.copy())
    L.apply(tok, ref)
    assert np.array_equal(x, ref)


# ------------------------------------------------------------- prefill


def test_prefill_rows_equal_preads(model):
    m = model
    rng = np.random.default_rng(31)
    prompt = tokens_for(m, rng, 300)
    mask = mask_for(m, rng, 300) if is_ple(m) else (rng.random(300) > 0.1).astype(np.uint8)
    T = m.info["tables"]
    for dtype in ("bfloat16", "float32"):
        ids = m.hash(prompt, mask=mask)
        ref = ref_rows(m, ids, dtype, mask)
        seen = []
        with engram.Pool(m) as pool, pool.session() as s:
            pf = s.prefill(prompt, chunk=64, mask=mask, dtype=dtype)
            assert pf.chunks == 5
            for table, c, rows in pf:
                seen.append((table, c))
                assert not rows.flags.writeable
                a, n = pf.first, pf.n_tokens
                assert a == 64 * c and rows.shape[0] == n
                live = mask[a:a + n] != 0 if mask is not None else slice(None)
                assert np.array_equal(rows[live], ref[table][a:a + n][live]), (table, c)
            assert seen == [(t, c) for c in range(5) for t in range(T)]
            h = m.history()
            m.hash(prompt, history=h, mask=mask)
            assert sess_hist(m, s) == hist_ids(m, h)  # end committed it


def test_prefill_apply_equals_layer_apply(model):
    m = model
    rng = np.random.default_rng(32)
    S, W = m.info["streams"], m.info["width"]
    prompt = tokens_for(m, rng, 300)
    layers = layers_of(m)
    x = rng.standard_normal((300, S, W)).astype(np.float32)
    ref = x.copy()
    h = m.history()
    state = layers[0].new_state() if is_ple(m) else None
    for L in layers:  # V4.1: layer 1 then 14 on every token; PLE: its one layer
        kw = {"state": state} if is_ple(m) else {}
        L.apply(prompt, ref, history=h.copy(), **kw)
    m.hash(prompt, history=h)
    with engram.Pool(m) as pool, pool.session() as s:
        with s.prefill(prompt, chunk=64) as pf:
            for table, c, rows in pf:
                pf.apply(layers[table], x[pf.first:pf.first + pf.n_tokens])
        assert np.array_equal(x.view(np.uint32), ref.view(np.uint32))
        assert sess_hist(m, s) == hist_ids(m, h)
        # a step after the prompt continues as one Layer.apply would (PLE: the
        # convolution state committed at end)
        tok = tokens_for(m, rng, 3)
        y = rng.standard_normal((3, S, W)).astype(np.float32)
        yref = y.copy()
        with s.step(tok) as st:
            for t, L in enumerate(layers):
                st.wait(t)
                st.apply(L, y)
            st.commit()
        for L in layers:
            kw = {"state": state} if is_ple(m) else {}
            L.apply(tok, yref, history=h.copy(), **kw)
        assert np.array_equal(y.view(np.uint32), yref.view(np.uint32))


def test_prefill_context_and_cancel(v4):
    m = v4
    prompt = list(range(1000, 1300))
    with engram.Pool(m) as pool, pool.session() as s:
        with s.prefill(prompt, chunk=64) as pf:
            for table, c, rows in pf:
                if c == 2:
                    break
        assert s.history == (-1, -1, -1)  # cancelled: unchanged
        with pytest.raises(engram.CancelledError):
            next(pf)
        with pytest.raises(RuntimeError):
            with s.prefill(prompt, chunk=64) as pf:
                next(pf)
                raise RuntimeError("x")
        assert s.history == (-1, -1, -1)
        pf = s.prefill(prompt, chunk=64)
        with pytest.raises(engram.BusyError):
            s.step([1])
        with pytest.raises(engram.BusyError):
            s.prefill(prompt)
        del pf  # dealloc cancels
        gc.collect()
        pf = s.prefill(prompt, chunk=64)
        items = list(pf)
        assert len(items) == 10
        pf.end()  # a no-op after the iteration ended it
        # views kept past their item read the ring (other rows), never freed memory
        del pf
        gc.collect()
        assert sum(int(r.sum()) for _, _, r in items) > 0
        h = m.history()
        m.hash(prompt, history=h)
        assert s.history == tuple(h.ids)
        with pytest.raises(ValueError):
            s.prefill(prompt, chunk=0)
        with pytest.raises(engram.ArgumentError):
            s.prefill([1, 2, m.info["vocab"] + 5])


def test_prefill_timeout_zero(ple):
    m = ple
    prompt = list(range(500, 800))
    ref = ref_rows(m, m.hash(prompt), "bfloat16", None)[0]
    with engram.Pool(m) as pool, pool.session() as s:
        pf = s.prefill(prompt, chunk=64, timeout=0)
        got, timeouts = [], 0
        while True:
            try:
                table, c, rows = next(pf)
            except StopIteration:
                break
            except engram.TimeoutError:
                timeouts += 1  # nothing lost: ask again
                continue
            got.append(rows.copy())
        assert np.array_equal(np.concatenate(got), ref)
        assert s.history[:2] == (800 - 1, 800 - 2)


# ------------------------------------------------------------- batches


def test_step_batch_equals_alone(model):
    m = model
    rng = np.random.default_rng(41)
    prompts = [tokens_for(m, rng, int(rng.integers(1, 20))) for _ in range(5)]
    with engram.Pool(m) as pool:
        ss = [pool.session() for _ in range(5)]
        twins = [pool.session() for _ in range(5)]
        for s, t, p in zip(ss, twins, prompts):
            s.restore_tokens(p)
            t.restore_tokens(p)
        for it in range(6):
            reqs, alone = [], []
            for i, s in enumerate(ss):
                k = int(rng.integers(1, engram.MAX_DRAFT + 1))
                tok = tokens_for(m, rng, k)
                mask = mask_for(m, rng, k)
                reqs.append((s, tok) if mask is None else (s, tok, mask))
                alone.append(twins[i].step(tok, mask=mask))
            steps = (pool if it % 2 else ss[0]).step_batch(reqs)
            assert len(steps) == 5
            for st, a in zip(steps, alone):
                for t in range(m.info["tables"]):
                    assert np.array_equal(st.wait(t), a.wait(t))
                st.commit()
                a.commit()
            for s, t in zip(ss, twins):
                assert s.history == t.history
        st = pool.stats
        assert st["steps"] >= 60 and st["step_rows_read"] <= st["step_rows_requested"]
        # refusals: nothing begins
        with pytest.raises(ValueError):
            pool.step_batch([(ss[0], [1]), (ss[0], [2])])
        with pytest.raises(engram.ArgumentError):
            pool.step_batch([(ss[0], [1]), (ss[1], [m.info["vocab"]])])
        busy = ss[2].step([5])
        with pytest.raises(engram.BusyError):
            pool.step_batch([(ss[0], [1]), (ss[2], [2])])
        busy.abort()
        hist = [s.history for s in ss]
        again = pool.step_batch([(s, [7]) for s in ss])  # all could begin: none was left busy
        for st in again:
            st.abort()
        assert [s.history for s in ss] == hist
        with engram.Pool(m) as other:
            with pytest.raises(ValueError):
                other.step_batch([(ss[0], [1])])
        for s in ss + twins:
            s.close()


# ------------------------------------------------------------- snapshots


def test_snapshot_restore_continues(model):
    m = model
    rng = np.random.default_rng(51)
    S, W = m.info["streams"], m.info["width"]
    L = layers_of(m)[0]
    with engram.Pool(m) as pool, pool.session() as a, pool.session() as b:
        for _ in range(3):
            tok = tokens_for(m, rng, 3)
            with a.step(tok) as st:
                st.wait(0)
                st.apply(L, rng.standard_normal((3, S, W)).astype(np.float32))
                st.commit()
        snap = a.snapshot()
        assert isinstance(snap, bytes)
        assert len(snap) == (40 if not is_ple(m) else 40 + 4 * m.info["state_floats"])
        b.restore(memoryview(bytearray(snap)))
        assert b.history == a.history
        for _ in range(3):
            tok = tokens_for(m, rng, 2)
            x = rng.standard_normal((2, S, W)).astype(np.float32)
            xa, xb = x.copy(), x.copy()
            sa, sb = a.step(tok), b.step(tok)
            for t in range(m.info["tables"]):
                assert np.array_equal(sa.wait(t), sb.wait(t))
            sa.apply(L, xa)
            sb.apply(L, xb)
            sa.commit()
            sb.commit()
            assert np.array_equal(xa.view(np.uint32), xb.view(np.uint32))
        assert a.snapshot() == b.snapshot()
        with pytest.raises(engram.ArgumentError):
            b.restore(snap[:-1])
        with pytest.raises(engram.ArgumentError):
            b.restore(b"\0" * len(snap))
        assert b.snapshot() == a.snapshot()  # unchanged
        st = a.step([1])
        with pytest.raises(engram.BusyError):
            a.snapshot()
        st.abort()


# ------------------------------------------------------------- waits, ends, closes


def test_timeouts(v4):
    m = v4
    rng = np.random.default_rng(61)
    with engram.Pool(m) as pool, pool.session() as s:
        for _ in range(20):
            st = s.step(tokens_for(m, rng, 8))
            for t in (0, 1):
                tries = 0
                while True:
                    tries += 1
                    try:
                        v = st.wait(t, timeout=0)
                        break
                    except engram.TimeoutError as e:
                        assert e.errno == 110
                        assert tries < 10_000_000
                assert v.shape == (8, 24, 256)
            st.commit()
        st = s.step([3])
        st.wait(0, timeout=5.0)
        with pytest.raises(ValueError):
            st.wait(0, timeout=-1)
        with pytest.raises(ValueError):
            st.wait(2)
        st.abort()


def test_abort_then_wait_raises(v4):
    with engram.Pool(v4) as pool, pool.session() as s:
        st = s.step([1, 2])
        st.abort()
        assert st.state == "aborted"
        with pytest.raises(engram.CancelledError):
            st.wait(0)
        with pytest.raises(engram.CancelledError):
            st.poll(1)
        with pytest.raises(engram.ArgumentError):
            st.commit()
        st.abort()  # no-op
        assert s.history == (-1, -1, -1)
        st2 = s.step([3])
        with pytest.raises(engram.CancelledError):
            st.wait(0)  # never waits for a later step
        st2.commit()


def test_step_context_manager(v4):
    with engram.Pool(v4) as pool, pool.session() as s:
        with s.step([1, 2, 3]) as st:
            st.wait(0)
        assert st.state == "aborted" and s.history == (-1, -1, -1)
        with s.step([1, 2, 3]) as st:
            st.commit(2)
        assert st.state == "committed" and s.history != (-1, -1, -1)
        with pytest.raises(KeyError):
            with s.step([4]) as st:
                raise KeyError()
        s.step([5]).abort()  # the failed block's step was aborted: not busy
    assert s.closed and pool.closed


def test_closed_raise(v4):
    m = v4
    pool = engram.Pool(m)
    s = pool.session()
    s2 = pool.session()
    st = s2.step([1])
    s.close()
    s.close()
    for call in (lambda: s.step([1]), lambda: s.snapshot(), lambda: s.history, lambda: s.prefill([1, 2]),
                 lambda: s.restore_tokens([1]), lambda: s.restore(b"x" * 40)):
        with pytest.raises(engram.ClosedError) as e:
            call()
        assert e.value.errno == 9  # EBADF
    with pytest.raises(engram.BusyError):
        m.close()  # the pool holds the model
    pool.close()
    with pytest.raises(engram.ClosedError):
        pool.session()
    with pytest.raises(engram.ClosedError):
        pool.stats
    with pytest.raises(engram.ClosedError) as e:
        s2.step([2])  # the pool's ESHUTDOWN, or the step still in progress refused
    # a step whose reads were in flight at the close failed with ESHUTDOWN;
    # one whose reads had all come in before it keeps them (the close can
    # fall either side of them): then they are the model's rows
    try:
        got = st.wait(0)
    except engram.Error as e:
        assert e.errno == errno.ESHUTDOWN
    else:
        ids = m.hash([1], history=m.history())
        assert np.array_equal(got, ref_rows(m, ids, "bfloat16", None)[0])
    st.abort()
    with pytest.raises(engram.ClosedError) as e:
        s2.step([2])
    assert e.value.errno == 108  # ESHUTDOWN
    with pytest.raises(engram.BusyError):
        m.close()  # s2 still uses the pool's remains
    s2.close()
    del st
    # the model is free again (not closed here: the fixture shares it)


def test_model_released_after_pool(models):
    m = engram.Model(models["v4"])
    with engram.Pool(m) as pool:
        s = pool.session()
        pf = s.prefill(list(range(50)))
    with pytest.raises(engram.BusyError):
        m.close()
    s.close()
    with pytest.raises(engram.BusyError):
        m.close()  # the prefill still holds the pool's remains
    pf.cancel()
    m.close()
    with pytest.raises(engram.ClosedError):
        engram.Pool(m)


def test_pool_options(v4):
    with engram.Pool(v4, threads=4, cache_rows=1000, engine="auto") as pool:
        st = pool.stats
        assert st["depth"] == 4 and st["cache_rows"] >= 1000
        with pool.session() as s:
            for _ in range(2):
                x = s.step([1, 2, 3])
                x.wait(0)
                x.wait(1)
                x.abort()
        assert pool.stats["steps"] == 2
    with engram.Pool(v4, engine="buffered") as pool:
        assert pool.stats["engine"] == "buffered"
    with pytest.raises(ValueError):
        engram.Pool(v4, engine="fast")
    with pytest.raises(ValueError):
        engram.Pool(v4, threads=0)
    with pytest.raises(ValueError):
        engram.Pool(v4, cache_rows=-1)
    with pytest.raises(TypeError):
        engram.Session()


def test_dropped_steps_in_flight(v4):
    m = v4
    rng = np.random.default_rng(71)
    with engram.Pool(m) as pool, pool.session() as s:
        for i in range(1500):
            st = s.step(tokens_for(m, rng, int(rng.integers(1, 9))))
            if i % 3 == 0:
                st.wait(0)
            del st  # in flight: aborted by its dealloc
        assert s.history == (-1, -1, -1)
        tok = [9, 8, 7]
        st = s.step(tok)
        ref = ref_rows(m, m.hash(tok), "bfloat16", None)
        assert np.array_equal(st.wait(0), ref[0]) and np.array_equal(st.wait(1), ref[1])
        st.commit()
        # a kept view outlives its step (dropped, so aborted, once waited):
        # the array stays alive and holds the rows the wait delivered
        h = m.history()
        m.hash(tok, history=h)
        v = s.step([5]).wait(1)
        gc.collect()
        ref5 = ref_rows(m, m.hash([5], history=h), "bfloat16", None)
        assert v.shape == (1, 24, 256) and np.array_equal(v, ref5[1])


def test_threads_wait_both_tables_and_close(v4):
    m = v4
    rng = np.random.default_rng(81)
    with engram.Pool(m) as pool:
        s = pool.session()
        for _ in range(50):
            st = s.step(tokens_for(m, rng, 4))
            got = {}

            def w(t):
                got[t] = st.wait(t)

            ths = [threading.Thread(target=w, args=(t,)) for t in (0, 1)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            assert set(got) == {0, 1}
            st.commit()
        # close while another thread waits: the wait ends with an engram.Error
        errs = []
        for _ in range(30):
            s = pool.session()
            st = s.step(tokens_for(m, rng, 8))

            def w2():
                try:
                    st.wait(1)
                    st.wait(0)
                    errs.append("ok")  # both came in before the close
                except BaseException as e:  # every outcome is recorded, unexpected ones too
                    errs.append(type(e))

            th = threading.Thread(target=w2)
            th.start()
            s.close()
            th.join()
        assert len(errs) == 30
        assert all(e in ("ok", engram.CancelledError, engram.ClosedError) for e in errs), errs


def test_refcounts_and_memory(v4):
    m = v4

    def rss_kb():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    # the buffered engine (page cache): the binding's bookkeeping, not the disk
    with engram.Pool(m, engine="buffered") as pool, pool.session() as s:
        tok = np.array([1, 2], np.int64)
        for _ in range(500):  # warm up allocators
            st = s.step(tok)
            st.wait(0)
            st.wait(1)
            st.commit()
        del st
        gc.collect()
        rs, rp, rm = sys.getrefcount(s), sys.getrefcount(pool), sys.getrefcount(m)
        r0 = rss_kb()
        for i in range(10000):
            st = s.step(tok)
            st.wait(0)
            st.wait(1)
            st.commit()
            if i % 100 == 0:
                s.history
                pool.stats
        del st
        gc.collect()
        assert (sys.getrefcount(s), sys.getrefcount(pool), sys.getrefcount(m)) == (rs, rp, rm)
        assert rss_kb() - r0 < 5 * 1024
