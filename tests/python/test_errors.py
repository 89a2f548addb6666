"""Errors as exceptions: the classes, errno / strerror / code / offset / row,
nothing touched when a call fails, closed and busy objects, and reference
counts and memory that stay balanced over 100,000 failing calls."""
import errno
import gc
import os
import shutil
import sys

import numpy as np
import pytest

import engram


@pytest.fixture(scope="module")
def tiny_path(build_model):
    """V4.1 tables only (W = 0): 3.4 MB, cheap to copy and corrupt"""
    return build_model("tiny", "--base", "100", "--width", "0", "--fill", "normal", "--seed", "1")


def test_hierarchy():
    E = engram
    assert issubclass(E.Error, OSError)
    for cls, bases in ((E.ArgumentError, (ValueError,)), (E.DataError, (ValueError,)),
                       (E.ModelError, ()), (E.NotFoundError, (FileNotFoundError,)),
                       (E.TimeoutError, (TimeoutError,)), (E.CancelledError, ()),
                       (E.ClosedError, (ValueError,)), (E.BusyError, ())):
        assert issubclass(cls, E.Error)
        for b in bases:
            assert issubclass(cls, b), (cls, b)


def test_missing_file(tmp_path):
    p = str(tmp_path / "no" / "such.gguf")
    with pytest.raises(engram.NotFoundError) as e:
        engram.Model(p)
    x = e.value
    assert isinstance(x, FileNotFoundError) and isinstance(x, OSError)
    assert x.errno == errno.ENOENT and x.code == -errno.ENOENT
    assert p in x.strerror and x.offset is None and x.row is None
    with pytest.raises(engram.NotFoundError):
        engram.Model(os.fsencode(p))  # bytes paths too
    with pytest.raises(TypeError):
        engram.Model(3)


@pytest.mark.parametrize("which", ["v41_path", "ple_path"])
def test_truncated_file(request, tmp_path, which):
    src = request.getfixturevalue(which)
    with open(src, "rb") as f:
        head = f.read(1 << 20)
    cut = tmp_path / "cut.gguf"
    seen = set()
    for size in (0, 3, 10, 24, 100, 700, 1000, 5000, 1 << 20):
        cut.write_bytes(head[:size])
        with pytest.raises(engram.Error) as e:
            engram.Model(str(cut))
        x = e.value
        assert isinstance(x, OSError)
        assert isinstance(x, engram.ModelError), (size, x)
        assert x.errno in (errno.EBADMSG, errno.EIO) and x.code == -x.errno
        assert x.offset is not None and 0 <= x.offset <= max(size, 8), (size, x.offset, x)
        assert str(cut) in x.strerror
        seen.add(x.offset)
    assert len(seen) >= 3  # the offsets follow the cut


def test_bad_row(tmp_path, tiny_path):
    """a row with a NaN code: DataError naming the row (.row)"""
    p = tmp_path / "bad.gguf"
    shutil.copyfile(tiny_path, p)
    m = engram.Model(str(p))
    off = m.info["table_info"][0]["offset"] + 7 * m.info["row_bytes"]
    m.close()
    with open(p, "r+b") as f:
        f.seek(off + 3)
        f.write(b"\x7f")
    m = engram.Model(str(p))
    m.rows(0, [6, 8])
    for dtype in ("float32", "bfloat16"):
        with pytest.raises(engram.DataError) as e:
            m.rows(0, [6, 7, 8], dtype)
        assert isinstance(e.value, ValueError)
        assert e.value.errno == errno.EDOM and e.value.row == 7 and "row 7" in str(e.value)
    # a layer without projection weights
    with pytest.raises(engram.Error) as e:
        m.layer(1)
    assert "projection" in str(e.value)


def test_token_out_of_range(v41_path, ple_path):
    for path in (v41_path, ple_path):
        m = engram.Model(path)
        V = m.info["vocab"]
        layer = m.layer(m.info["layers"][0], threads=1)
        for call in (lambda: m.hash([1, 2, 3, V, 5]),
                     lambda: layer.apply([1, 2, 3, V, 5], np.zeros((5, 4, 64), np.float32))):
            with pytest.raises(engram.ArgumentError) as e:
                call()
            x = e.value
            assert isinstance(x, ValueError) and isinstance(x, OSError)
            assert x.errno == errno.EINVAL and x.code == -errno.EINVAL
            assert "position 3" in x.strerror and str(V) in x.strerror, x.strerror
        # the residual and the History are untouched
        h = m.history()
        m.hash([7, 8], history=h)
        ids = h.ids
        x = np.ones((5, 4, 64), np.float32)
        with pytest.raises(engram.ArgumentError):
            layer.apply([1, 2, 3, 4, 2**31], x, history=h)
        assert h.ids == ids and (x == 1).all()
        layer.close()


def test_nan_residual(v41_path):
    m = engram.Model(v41_path)
    layer = m.layer(14, threads=1)
    for dtype in (np.float32, np.uint16):
        x = np.random.default_rng(1).standard_normal((4, 4, 64)).astype(np.float32)
        if dtype == np.uint16:
            x = (x.view(np.uint32) >> 16).astype(np.uint16)
            x[2, 1, 5] = 0x7FC0
        else:
            x[2, 1, 5] = np.inf
        keep = x.copy()
        with pytest.raises(engram.DataError) as e:
            layer.apply([1, 2, 3, 4], x)
        assert isinstance(e.value, ValueError)
        assert e.value.errno == errno.EDOM
        assert "token 2, stream 1, index 5" in str(e.value)
        assert x.tobytes() == keep.tobytes()
        # a masked token's NaN is not looked at
        layer.apply([1, 2, 3, 4], x, mask=[1, 1, 0, 1])
        assert x[2].tobytes() == keep[2].tobytes() and x.tobytes() != keep.tobytes()


def test_strerror():
    assert engram.strerror(errno.EINVAL) == engram.strerror(-errno.EINVAL)
    for c in (errno.EINVAL, errno.EIO, errno.EBADMSG, errno.EDOM, errno.ENOENT):
        s = engram.strerror(c)
        assert isinstance(s, str) and s
    assert len({engram.strerror(c) for c in (errno.EINVAL, errno.EIO, errno.EBADMSG, errno.EDOM)}) == 4
    assert isinstance(engram.strerror(0), str)
    with pytest.raises(TypeError):
        engram.strerror("x")
    assert engram.version() == engram.__version__


def test_closed_and_busy(v41_path):
    m = engram.Model(v41_path)
    layer = m.layer(1, threads=1)
    x = np.zeros((1, 4, 64), np.float32)
    with pytest.raises(engram.BusyError):
        m.close()
    m.hash([1])  # still open
    layer.apply([1], x)
    layer.close()
    layer.close()  # twice: fine
    for call in (lambda: layer.apply([1], x), lambda: layer.info, lambda: layer.new_state(),
                 lambda: layer._pin()):
        with pytest.raises(engram.ClosedError) as e:
            call()
        assert isinstance(e.value, ValueError)
    assert "closed" in repr(layer)
    m.close()
    for call in (lambda: m.hash([1]), lambda: m.rows(0, [1]), lambda: m.layer(1), lambda: m.info,
                 lambda: m.history(), lambda: engram.History(m)):
        with pytest.raises(engram.ClosedError):
            call()
    m.close()  # twice: fine
    # a layer in a with block; the model closes after it
    m = engram.Model(v41_path)
    with m.layer(14, threads=1) as ly:
        ly.apply([3], x)
        with pytest.raises(engram.BusyError):
            m.close()
    m.close()
    # a layer alive when the model is dropped keeps it usable
    ly = engram.Model(v41_path).layer(1, threads=1)
    gc.collect()
    ly.apply([4], x)
    with pytest.raises(TypeError):
        engram.Layer()


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_failing_calls_balance(v41_path):
    """100,000 failing calls (argument refusals and library errors): the
    arguments' reference counts unchanged, RSS flat"""
    m = engram.Model(v41_path)
    layer = m.layer(1, threads=1)
    V = m.info["vocab"]
    bad_tokens = [1, V, 3]
    tokens = [1, 2, 3]
    x = np.zeros((3, 4, 64), np.float32)
    xnan = x.copy()
    xnan[1, 2, 3] = np.nan
    x64 = np.zeros((3, 4, 64), np.float64)
    mask = np.ones(3, np.uint8)
    short_mask = [1, 1]
    h = m.history()
    out = np.zeros((3, 48), np.uint32)
    out_bad = np.zeros((3, 47), np.uint32)
    ids_bad = [m.info["rows"][0]]
    args = [m, layer, bad_tokens, tokens, x, xnan, x64, mask, short_mask, h, out, out_bad, ids_bad]
    calls = [
        (lambda: layer.apply(bad_tokens, x, mask=mask, history=h), engram.ArgumentError),
        (lambda: layer.apply(tokens, xnan, mask=mask), engram.DataError),
        (lambda: layer.apply(tokens, x64, history=h), TypeError),
        (lambda: layer.apply(tokens, x, mask=short_mask), ValueError),
        (lambda: m.hash(bad_tokens, history=h, out=out), engram.ArgumentError),
        (lambda: m.hash(tokens, out=out_bad), ValueError),
        (lambda: m.rows(0, ids_bad), engram.ArgumentError),
        (lambda: m.rows(0, tokens, "float32", out_bad), TypeError),
        (lambda: layer.apply(tokens, x, threads=0), ValueError),
    ]

    def run(k):
        for i in range(k):
            fn, exc = calls[i % len(calls)]
            try:
                fn()
            except exc:
                pass
            else:
                raise AssertionError("call %d did not fail" % (i % len(calls)))

    run(5000)
    gc.collect()
    refs = [sys.getrefcount(a) for a in args]
    before = rss_kib()
    run(100000)
    gc.collect()
    grown = rss_kib() - before
    assert [sys.getrefcount(a) for a in args] == refs
    assert grown < 4096, "RSS grew by %d KiB over 100,000 failing calls" % grown
    # and a successful call still works, the objects untouched
    assert (x == 0).all() and h.ids == (-1, -1, -1)
    layer.apply(tokens, x)


def test_close_while_applies_wait(v41_path):
    """Layer.close() on one thread while an apply runs and another waits:
    the waiting one either runs first or raises ClosedError (it ran on the
    freed layer and crashed before)"""
    import threading
    import time
    m = engram.Model(v41_path)
    n = 1500
    tok = np.arange(n) % 997
    for trial in range(3):
        layer = m.layer(1, threads=1)
        got = {}

        def run(key, x):
            try:
                layer.apply(tok, x)
                got[key] = "ok"
            except engram.ClosedError:
                got[key] = "closed"
            except BaseException as e:  # noqa: B902 - recorded, asserted below
                got[key] = repr(e)
        a = threading.Thread(target=run, args=("a", np.zeros((n, 4, 64), np.float32)))
        a.start()
        time.sleep(0.1)
        c = threading.Thread(target=layer.close)
        c.start()
        time.sleep(0.1)
        b = threading.Thread(target=run, args=("b", np.zeros((n, 4, 64), np.float32)))
        b.start()
        for t in (a, b, c):
            t.join()
        assert got["a"] in ("ok", "closed") and got["b"] in ("ok", "closed"), got
        with pytest.raises(engram.ClosedError):
            layer.apply([1], np.zeros((1, 4, 64), np.float32))
    m.close()
