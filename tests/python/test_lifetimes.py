"""Lifetimes and races of the binding's objects, and the contract at its
edges: each case below is a defect a review found (reproduced first, then
fixed), kept so that it stays fixed.

- Model() failing must raise from memory it still owns (run under
  PYTHONMALLOC=debug, which fills freed memory: a use-after-free shows as a
  garbled message or a UnicodeDecodeError);
- a message with a path that is not UTF-8, or cut inside a character, is
  still the engram error;
- Model.close() on one thread while another reads rows or hashes through it
  is refused (BusyError) or comes after: never a crash;
- a residual whose __dlpack__ closes the layer (Python code running inside
  the argument conversion) gets ClosedError, not a crash;
- Layer.apply with more than one round (1,024 tokens) and a bad token late
  in the input touches nothing, and names the token's position in the call;
- Step.apply / Prefill.apply refuse a Layer of another Model;
- Layer.close() while engram.cuda pins the layer (_pin) is refused;
- NumPy integer scalars are tokens.
"""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import engram


def test_model_open_failure_under_debug_allocator(v41_path, tmp_path):
    code = (
        "import engram, sys\n"
        "for p in ('%s', b'%s/\\xffnope.gguf', '%s/x' + '\\u00e9' * 300 + '.gguf'):\n"
        "    try:\n"
        "        engram.Model(p)\n"
        "    except engram.Error as e:\n"
        "        assert isinstance(e, OSError) and e.errno in (2, 36), (e.errno, str(e))\n"
        "        print(type(e).__name__, e.errno)\n"
        "    else:\n"
        "        sys.exit('opened')\n" % (tmp_path / "missing.gguf", tmp_path, tmp_path))
    env = dict(os.environ, PYTHONMALLOC="debug", PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split()
    assert lines[0:4] == ["NotFoundError", "2", "NotFoundError", "2"], r.stdout
    # the long name: ENAMETOOLONG (36) from open, or ENOENT; either way an engram.Error
    assert lines[5] in ("2", "36"), r.stdout


def test_close_model_while_reading(v41_path):
    m = engram.Model(v41_path)
    ids = (np.arange(60000, dtype=np.int64) * 7) % m.info["rows"][0]
    outcome = {}

    def reader():
        try:
            m.rows(0, ids)
            outcome["rows"] = "ok"
        except engram.ClosedError:
            outcome["rows"] = "closed"  # close won the race before the call began

    th = threading.Thread(target=reader)
    th.start()
    closed = busy = 0
    while th.is_alive():
        try:
            m.close()
            closed += 1
            break
        except engram.BusyError:
            busy += 1
    th.join()
    assert outcome["rows"] in ("ok", "closed")
    if not closed:
        m.close()
    with pytest.raises(engram.ClosedError):
        m.hash([1])


def test_dlpack_that_closes_the_layer(v41_path):
    m = engram.Model(v41_path)
    layer = m.layer(1, threads=1)
    x = np.zeros((2, 4, m.info["width"]), np.float32)

    class Sneaky:
        """A residual whose export closes the layer (as another thread could
        while the GIL is given up inside a Python __dlpack__)."""

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            layer.close()
            return x.__dlpack__()

    with pytest.raises(engram.ClosedError):
        layer.apply([1, 2], Sneaky())
    with pytest.raises(engram.ClosedError):
        layer.apply(None, Sneaky(), rows=np.zeros((2, 24, 256), np.uint16))
    assert not x.any()
    m.close()  # the layer let go of the model


def test_late_bad_token_touches_nothing(v41_path, ple_path):
    for path in (v41_path, ple_path):
        m = engram.Model(path)
        layer = m.layer(m.info["layers"][0], threads=2)
        n = 1500
        tokens = np.arange(n, dtype=np.int64) % 1000 + 5
        tokens[1400] = m.info["vocab"]
        x = np.random.default_rng(3).standard_normal((n, 4, m.info["width"])).astype(np.float32)
        x0 = x.copy()
        h = m.history()
        ids0 = h.ids
        kw = {"state": layer.new_state()} if m.info["state_floats"] else {}
        with pytest.raises(engram.ArgumentError) as e:
            layer.apply(tokens, x, history=h, **kw)
        assert "position 1400" in str(e.value) and e.value.errno == 22, str(e.value)
        assert np.array_equal(x, x0) and h.ids == ids0
        if kw:
            assert not kw["state"].any()
        layer.close()
        m.close()


def test_step_apply_refuses_another_models_layer(v41_path, build_model):
    other = build_model("v41_seed9", "--base", "20000", "--width", "64", "--fill", "normal", "--seed", "9")
    m, m2 = engram.Model(v41_path), engram.Model(other)
    foreign = m2.layer(1, threads=1)
    own = m.layer(1, threads=1)
    x = np.zeros((1, 4, 64), np.float32)
    with engram.Pool(m) as pool, pool.session() as s:
        with s.step([7]) as st:
            st.wait(0)
            with pytest.raises(ValueError) as e:
                st.apply(foreign, x)
            assert "layer" in str(e.value) and not x.any()
            st.apply(own, x)
            st.commit()
        tokens = np.arange(40, dtype=np.int64) + 3
        xs = np.zeros((40, 4, 64), np.float32)
        with s.prefill(tokens, chunk=16) as pf:
            for t, c, rows in pf:
                if t == 0:
                    with pytest.raises(ValueError):
                        pf.apply(foreign, xs[pf.first:pf.first + pf.n_tokens])
    for L in (foreign, own):
        L.close()


def test_close_refused_while_pinned(v41_path):
    m = engram.Model(v41_path)
    layer = m.layer(1, threads=1)
    assert layer._pin() != 0
    with pytest.raises(engram.BusyError):
        layer.close()
    layer._unpin()
    layer.close()
    with pytest.raises(engram.ClosedError):
        layer._pin()


def test_numpy_integer_scalars_are_tokens(v41_path):
    m = engram.Model(v41_path)
    arr = np.array([5, 6, 7], np.int32)
    assert np.array_equal(m.hash(list(arr)), m.hash([5, 6, 7]))
    with pytest.raises(TypeError) as e:
        m.hash([5.0, 6, 7])
    assert "tokens[0]" in str(e.value)
