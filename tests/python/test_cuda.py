"""tests/python/test_cuda.py - engram.cuda (issue #23).

Everywhere: the absence contract (engram.cuda imports; available() False,
why() a non-empty reason, Layer(...) raises RuntimeError naming it) where
no GPU answers, and where the extension cannot be imported at all; the
module's flags and sizes (FMA_ONLY, SERIAL_GATE, NO_GRAPH, GEMV_MAX,
BLOCK), the extension's and the fallback's, are the numbers engram_cuda.h
defines.

On a GPU (skipped elsewhere; needs torch with CUDA): engram.cuda.Layer.apply
on torch CUDA tensors (float32, bfloat16) of a W = 64 and a W = 5120 model,
n = 1, 8, 300, against the CPU engram.Layer.apply on the same inputs, with
cuda/test_cuda.cu's measure: masked tokens bit-identical, >= 99.5% of the
unmasked values equal to the CPU's or within one BF16 step of it (the share
test_cuda holds the GPU to against the CPU path; the figures are printed),
none beyond 4 steps of the operands.  Rows given as CUDA tensors, as a
table's strided slice of a (n, 48, 264) buffer and as host NumPy arrays
come from the model file itself (a GGUF parse here and np.memmap: not the
library's reader) and must give the tokens= path's bits.  The residual is
updated in place; the caller's stream is honoured; bad arguments are
refused before anything runs.  Under torch.cuda.graph capture: replays
equal eager applies bit for bit, what a replay cannot repeat is refused and
the capture goes on, eager applies on other streams work after it.

Models: ENGRAM_TEST_M64 / ENGRAM_TEST_M5120 / ENGRAM_TEST_PLE name built
files; otherwise they are built with ENGRAM_BIN (default build/engram) into
a temporary folder.  Runs under pytest or as a script
(`python tests/python/test_cuda.py`: every test_* function, a summary).
"""
import ast
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

import engram
import engram.cuda

try:
    import pytest
except ImportError:  # plain-script mode
    pytest = None

try:
    import torch
except ImportError:
    torch = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Skip(Exception):
    pass


def skip(why):
    if pytest is not None and not _SCRIPT:
        pytest.skip(why)
    raise Skip(why)


_SCRIPT = False


def need_gpu():
    if not engram.cuda.available():
        skip("engram.cuda not available: %s" % engram.cuda.why())
    if torch is None or not torch.cuda.is_available():
        skip("torch with CUDA is not importable")


# ------------------------------------------------------------------ models

_models = {}
_MODEL_ARGS = {
    "m64": (["--base", "20000", "--width", "64", "--fill", "normal", "--seed", "5"], "ENGRAM_TEST_M64"),
    "m5120": (["--base", "5000", "--width", "5120", "--fill", "normal", "--seed", "5"], "ENGRAM_TEST_M5120"),
    "ple": (["--arch", "qwen4exp", "--base", "20011", "--width", "64", "--fill", "normal", "--seed", "3"],
            "ENGRAM_TEST_PLE"),
}
_tmp = None


def model_path(name):
    global _tmp
    if name in _models:
        return _models[name]
    args, env = _MODEL_ARGS[name]
    p = os.environ.get(env)
    if not p:
        exe = os.environ.get("ENGRAM_BIN", os.path.join(ROOT, "build", "engram"))
        if not os.path.exists(exe):
            skip("no model: set %s or ENGRAM_BIN (%s is not there)" % (env, exe))
        if _tmp is None:
            _tmp = tempfile.mkdtemp(prefix="engram_cuda_test_")
        p = os.path.join(_tmp, name + ".gguf")
        subprocess.run([exe, "build", p] + args, check=True, stdout=subprocess.DEVNULL)
    _models[name] = p
    return p


def gguf_tables(path):
    """The file offsets of the tables' raw rows, from a GGUF parse of our own
    (blk.N.engram_embd.weight: I8 [264, rows]), keyed by the layer N."""
    with open(path, "rb") as f:
        buf = f.read(64 << 20)
    at = [4]
    assert buf[:4] == b"GGUF"
    fmts = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}

    def rd(fmt):
        v = struct.unpack_from("<" + fmt, buf, at[0])[0]
        at[0] += struct.calcsize("<" + fmt)
        return v

    def rstr():
        n = rd("Q")
        s = buf[at[0]:at[0] + n]
        at[0] += n
        return s.decode()

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd("I"), rd("Q")
            if et in fmts:
                at[0] += n * struct.calcsize(fmts[et])
                return None
            return [rval(et) for _ in range(n)]
        return rd(fmts[t])

    rd("I")
    nt, nkv = rd("Q"), rd("Q")
    kv = {}
    for _ in range(nkv):
        k = rstr()
        kv[k] = rval(rd("I"))
    tens = {}
    for _ in range(nt):
        name = rstr()
        dims = [rd("Q") for _ in range(rd("I"))]
        rd("I")
        tens[name] = (dims, rd("Q"))
    align = kv.get("general.alignment") or 32
    data = (at[0] + align - 1) // align * align
    out = {}
    for name, (dims, off) in tens.items():
        if name.endswith(".engram_embd.weight"):
            assert dims[0] == 264
            out[int(name.split(".")[1])] = data + off
    return out


def raw_rows(path, layer, ids):
    """Raw rows (len(ids), 24, 264) uint8 of `layer`'s table, read from the file."""
    off = gguf_tables(path)[layer]
    mm = np.memmap(path, np.uint8, "r")
    idx = off + ids.astype(np.int64)[..., None] * 264 + np.arange(264)
    return np.ascontiguousarray(mm[idx])


# ------------------------------------------------------------------ measure

def ulp_bf16(a):
    """cuda/test_cuda.cu's ulp_bf16: 2^(ilogb(a) - 7), ilogb at least -126."""
    a = np.abs(a)
    _, e = np.frexp(a)
    ex = np.where(a > 0, e - 1, -133)
    return np.ldexp(1.0, np.maximum(ex, -126) - 7)


def compare(x0, xc, xg, mask):
    """x0 input, xc CPU result, xg GPU result: float64 numpy (n, S*W);
    returns (total, exact, within1, beyond4, masked_changed) as test_cuda counts."""
    keep = mask != 0
    masked_changed = int(np.sum(np.any(xg[~keep] != x0[~keep], axis=1))) if (~keep).any() else 0
    c, g, x = xc[keep], xg[keep], x0[keep]
    d = np.abs(c - g)
    within1 = d <= ulp_bf16(np.maximum(np.abs(c), np.abs(g)))
    opq = ulp_bf16(np.maximum(np.maximum(np.abs(x), np.abs(c - x)), np.maximum(np.abs(c), np.abs(g))))
    return c.size, int(np.sum(d == 0)), int(np.sum(within1)), int(np.sum(d > 4 * opq)), masked_changed


def bits(t):
    """A CPU copy of a tensor's bits (int16 for bf16, int32 for f32)."""
    t = t.detach().cpu()
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).numpy().copy()


def inputs(n, S, W, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = ((torch.rand(n, S, W, generator=g) - 0.5) * 8).to(torch.bfloat16)  # BF16 values, as test_cuda
    return x.to(dtype)


FIGURES = []


# ------------------------------------------------------------------ absence

def test_absent_contract():
    """Where no GPU answers (CI): available() False, why() a reason, Layer() refuses with it."""
    if engram.cuda.available():
        skip("a CUDA device is available here")
    why = engram.cuda.why()
    assert isinstance(why, str) and why
    for arg in (None, object()):
        try:
            engram.cuda.Layer(arg)
        except RuntimeError as e:
            assert why in str(e), (why, str(e))
        else:
            raise AssertionError("engram.cuda.Layer did not raise")


def test_absent_when_extension_missing():
    """engram.cuda imports when engram._engram_cuda cannot be imported."""
    code = (
        "import sys; sys.modules['engram._engram_cuda'] = None\n"
        "import engram.cuda as c\n"
        "assert c.available() is False\n"
        "w = c.why(); assert isinstance(w, str) and '_engram_cuda' in w, w\n"
        "try:\n"
        "    c.Layer(None)\n"
        "except RuntimeError as e:\n"
        "    assert w in str(e), str(e)\n"
        "else:\n"
        "    raise SystemExit('no RuntimeError')\n"
        "print('ok', w)\n")
    # the child finds engram where this process did (conftest may have put it on sys.path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr


def header_constants(path=None):
    """engram_cuda.h's ENGRAM_CUDA_* numbers, read from the header itself."""
    path = path or os.path.join(ROOT, "include", "engram_cuda.h")
    with open(path) as f:
        text = f.read()
    return {k: int(v) for k, v in re.findall(r"^#define ENGRAM_CUDA_([A-Z_]+)\s+(\d+)u?\b", text, re.M)}


def test_constants_match_header():
    """engram.cuda's flags and sizes are engram_cuda.h's, both the
    extension's and the fallback's (the extension absent); FAST_SUMS
    (removed, #25) is gone from both."""
    want = header_constants()
    names = ("FMA_ONLY", "SERIAL_GATE", "NO_GRAPH", "GEMV_MAX", "BLOCK")
    assert set(names) <= set(want), want
    assert "FAST_SUMS" not in want, want
    got = {k: getattr(engram.cuda, k) for k in names}
    assert got == {k: want[k] for k in names}, (got, want)
    assert not hasattr(engram.cuda, "FAST_SUMS") and "FAST_SUMS" not in engram.cuda.__all__
    code = (
        "import sys; sys.modules['engram._engram_cuda'] = None\n"
        "import engram.cuda as c\n"
        "assert not hasattr(c, 'FAST_SUMS') and 'FAST_SUMS' not in c.__all__\n"
        "print(repr({k: getattr(c, k) for k in %r}))\n" % (names,))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ast.literal_eval(r.stdout.strip()) == {k: want[k] for k in names}, (r.stdout, want)


# ------------------------------------------------------------------ GPU

def _case(m, L, g, path, dtype, n, seed):
    """One (model, dtype, n): CPU vs GPU, and the rows paths vs tokens=."""
    S, W = L.info["streams"], L.info["width"]
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, m.info["vocab"], n).astype(np.int64)
    mask = (np.arange(n) % 5 != 3).astype(np.uint8)
    x0 = inputs(n, S, W, dtype, seed)
    xc = x0.clone()
    L.apply(tokens, xc, mask=mask)
    # tokens=, host mask, default stream
    xg = x0.cuda()
    ptr = xg.data_ptr()
    r = g.apply(xg, tokens=tokens, mask=mask, sync=True)
    assert r is xg and xg.data_ptr() == ptr
    flat = lambda t: t.detach().float().cpu().numpy().astype(np.float64).reshape(n, -1)
    total, exact, within1, beyond4, masked_changed = compare(flat(x0), flat(xc), flat(xg), mask)
    FIGURES.append("W=%d %s n=%d: %d outputs vs CPU: %.4f%% exact, %.4f%% within one BF16 step, "
                   "%d beyond 4 steps; masked changed %d" % (W, str(dtype).replace("torch.", ""), n, total,
                                                             100.0 * exact / total, 100.0 * within1 / total,
                                                             beyond4, masked_changed))
    print(FIGURES[-1])
    assert masked_changed == 0
    assert within1 >= 0.995 * total, FIGURES[-1]
    assert beyond4 == 0, FIGURES[-1]
    keep = mask != 0
    assert (bits(xg)[~keep] == bits(x0)[~keep]).all()
    ref = bits(xg)
    # rows from the file: (n, 24, 264) on the device, a device mask
    ids = m.hash(tokens, mask=mask)  # (n, 48): table 0's 24 ids, then table 1's
    t = L.info["table"]
    raw = raw_rows(path, L.info["layer"], ids[:, 24 * t:24 * t + 24])
    xr = x0.cuda()
    g.apply(xr, rows=torch.from_numpy(raw).cuda(), mask=torch.from_numpy(mask).cuda(), sync=True)
    assert (bits(xr) == ref).all(), "rows= (device) differs from tokens="
    # a step's (n, 48, 264) buffer, the table's strided slice
    both = np.concatenate([raw_rows(path, lay, ids[:, 24 * k:24 * k + 24])
                           for k, lay in enumerate(m.info["layers"])], axis=1)
    step = torch.from_numpy(both).cuda()
    xs = x0.cuda()
    g.apply(xs, rows=step[:, 24 * t:24 * t + 24], mask=mask, sync=True)
    assert (bits(xs) == ref).all(), "rows= (a (n, 48, 264) slice) differs from tokens="
    # host rows (NumPy), uploaded by the module
    xh = x0.cuda()
    g.apply(xh, rows=both[:, 24 * t:24 * t + 24], mask=mask)
    g.sync()
    assert (bits(xh) == ref).all(), "rows= (host) differs from tokens="


def _m64(layer):
    """The m64 model (W = 64) and one of its layers: (path, model, layer,
    streams, width)."""
    path = model_path("m64")
    m = engram.Model(path)
    L = m.layer(layer)
    return path, m, L, L.info["streams"], L.info["width"]


def _dev_rows(path, m, L, tokens):
    """The raw rows of tokens for L's table, read from the file and put on
    the device: (n, 24, 264) uint8."""
    t = L.info["table"]
    return torch.from_numpy(raw_rows(path, L.info["layer"], m.hash(tokens)[:, 24 * t:24 * t + 24])).cuda()


def test_apply_vs_cpu():
    need_gpu()
    for name in ("m64", "m5120"):
        path = model_path(name)
        m = engram.Model(path)
        for layer in (1, 14):
            L = m.layer(layer)
            with engram.cuda.Layer(L) as g:
                assert g.info["width"] == m.info["width"] and g.layer is L
                for dtype in (torch.float32, torch.bfloat16):
                    for n in (1, 8, 300):
                        if name == "m5120" and layer == 14 and n != 300:
                            continue  # table 1 of the big model: the GEMM path only
                        _case(m, L, g, path, dtype, n, seed=n * 7 + layer)
            L.close()


def test_stream_honoured():
    """apply(stream=s) queues on s: its input, written on s after a delay,
    is what it reads (on another stream it would race and read zeros)."""
    need_gpu()
    path, m, L, S, W = _m64(1)
    n = 64
    tokens = np.arange(n) * 37 + 11
    mask = np.ones(n, np.uint8)
    raw = _dev_rows(path, m, L, tokens)
    x0 = inputs(n, S, W, torch.float32, 3)
    with engram.cuda.Layer(L) as g:
        ref = x0.cuda()
        g.apply(ref, rows=raw, sync=True)
        for as_int in (False, True):
            s = torch.cuda.Stream()
            x0g = x0.cuda()
            x = torch.zeros_like(x0g)
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                if hasattr(torch.cuda, "_sleep"):
                    torch.cuda._sleep(200_000_000)
                x.copy_(x0g)
            g.apply(x, rows=raw, mask=mask, stream=s.cuda_stream if as_int else s)
            s.synchronize()
            assert (bits(x) == bits(ref)).all(), "the apply did not follow the stream's work"
            g.sync(stream=s)
        # and on the stream current in torch (a `with torch.cuda.stream(s)` block)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = x0.cuda()
            g.apply(x, rows=raw, stream=torch.cuda.current_stream())
        s.synchronize()
        assert (bits(x) == bits(ref)).all()
    L.close()


def test_nonfinite_recorded():
    """A token whose residual is not finite is left untouched; sync() names it."""
    need_gpu()
    path, m, L, S, W = _m64(1)
    n = 12
    tokens = np.arange(n) + 100
    x0 = inputs(n, S, W, torch.float32, 9)
    x0[5, 1, 3] = float("nan")
    x = x0.cuda()
    with engram.cuda.Layer(L) as g:
        g.apply(x, tokens=tokens)
        try:
            g.sync()
        except engram.DataError as e:
            assert "token 5" in str(e), str(e)
        else:
            raise AssertionError("no DataError")
        g.sync()  # reported once
        b, b0 = bits(x), bits(x0)
        assert (b[5] == b0[5]).all()
        assert (b[4] != b0[4]).any()
        # sync=True raises at once
        x = x0.cuda()
        try:
            g.apply(x, tokens=tokens, sync=True)
        except engram.DataError:
            pass
        else:
            raise AssertionError("no DataError with sync=True")
    L.close()


def _torch_cudart():
    """torch's own CUDA runtime (the libcudart.so its process mapped), through
    ctypes: the same library handle, so the same per-thread last error."""
    import ctypes
    torch.zeros(1, device="cuda")  # torch's runtime loaded and its context made
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "libcudart.so" in ln and ln.split()[-1].startswith("/")})
    if not paths:
        skip("torch's CUDA runtime is not a shared library mapped here")
    lib = ctypes.CDLL(paths[0])
    for name in ("cudaSetDevice", "cudaPeekAtLastError", "cudaGetLastError"):
        getattr(lib, name).restype = ctypes.c_int
    return lib, paths[0]


def test_torch_error_kept():
    """A CUDA error torch's runtime holds pending (cudaSetDevice of a device
    that does not exist, made through torch's own libcudart) is still
    pending after a Layer's open, an apply and the close: engram.cuda links
    its own runtime statically and hides it (-Wl,--exclude-libs,ALL), so its
    clean-ups clear only its own errors.  Then a torch kernel launch reports
    that error (torch's launch check), which proves the ctypes handle was
    torch's runtime, and clears it."""
    need_gpu()
    path, m, L, S, W = _m64(1)
    n = 8
    tokens = np.arange(n) * 41 + 3
    raw = _dev_rows(path, m, L, tokens)
    x = inputs(n, S, W, torch.float32, 5).cuda()
    x0 = x.clone()
    lib, where = _torch_cudart()
    torch.cuda.synchronize()
    assert lib.cudaGetLastError() == 0, "an error was pending before the test"
    g = None
    try:
        invalid = lib.cudaSetDevice(1 << 20)
        assert invalid != 0 and lib.cudaPeekAtLastError() == invalid, (invalid, where)
        g = engram.cuda.Layer(L)
        assert lib.cudaPeekAtLastError() == invalid, "the open cleared torch's pending error"
        g.apply(x, rows=raw, sync=True)
        assert lib.cudaPeekAtLastError() == invalid, "the apply cleared torch's pending error"
        g.close()
        assert lib.cudaPeekAtLastError() == invalid, "the close cleared torch's pending error"
        try:
            torch.ones(4, device="cuda").add_(1)
            reported = None
        except RuntimeError as e:
            reported = str(e)
        assert reported is not None and "invalid device ordinal" in reported.lower(), \
            "torch's next launch did not report the error set through %s: %r" % (where, reported)
        assert lib.cudaGetLastError() == 0
    finally:
        # whatever failed above, no error of this test's is left for the next
        # test's torch calls, and the layers are closed
        lib.cudaGetLastError()
        if g is not None:
            g.close()
        L.close()
    assert not np.array_equal(bits(x), bits(x0))  # the apply ran
    FIGURES.append("torch's pending error (%d, set through %s) kept through engram.cuda's open, apply and close"
                   % (invalid, where))


def _raises(exc, words, f, *a, **kw):
    try:
        f(*a, **kw)
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError("%s not raised (%s)" % (exc.__name__, words))


def test_refusals():
    need_gpu()
    path, m, L, S, W = _m64(1)
    n = 4
    tokens = np.arange(n)
    g = engram.cuda.Layer(L)
    x0 = inputs(n, S, W, torch.float32, 1)
    xg = x0.cuda()
    before = bits(xg)
    _raises(ValueError, ["residual", "cpu"], g.apply, x0.clone(), tokens=tokens)       # a CPU tensor
    _raises(ValueError, ["residual"], g.apply, x0.numpy().copy(), tokens=tokens)       # a NumPy array
    _raises(TypeError, ["residual", "float16"], g.apply, xg.half(), tokens=tokens)
    _raises(ValueError, ["residual", "shape"], g.apply, xg.reshape(n, S * W), tokens=tokens)
    _raises(ValueError, ["residual", "contiguous"], g.apply, torch.zeros(n, S, 2 * W, device="cuda")[:, :, :W],
            tokens=tokens)
    _raises(TypeError, ["rows", "tokens"], g.apply, xg)
    _raises(ValueError, ["tokens"], g.apply, xg, tokens=tokens[:3])
    _raises(ValueError, ["mask"], g.apply, xg, tokens=tokens, mask=[1, 1])
    _raises(ValueError, ["mask"], g.apply, xg, tokens=tokens, mask=torch.ones(n, dtype=torch.float32).cuda())
    _raises(TypeError, ["rows", "uint8"], g.apply, xg, rows=torch.zeros(n, 24, 264, dtype=torch.int32).cuda())
    _raises(ValueError, ["rows", "shape"], g.apply, xg, rows=torch.zeros(n, 24, 256, dtype=torch.uint8).cuda())
    _raises(ValueError, ["flags"], g.apply, xg, tokens=tokens, flags=16)
    _raises(ValueError, ["flags"], g.apply, xg, tokens=tokens, flags=2)   # was FAST_SUMS (removed, #25)
    _raises(TypeError, ["stream"], g.apply, xg, tokens=tokens, stream="s")
    _raises(engram.ArgumentError, [], g.apply, xg, tokens=[0, 1, 2, m.info["vocab"]])
    bad = np.zeros((n, 24, 264), np.uint8)
    bad[2, 3, 10] = 0x7F  # E4M3FN NaN: does not decode
    _raises(engram.DataError, ["rows", "token 2"], g.apply, xg, rows=bad)
    torch.cuda.synchronize()
    assert (bits(xg) == before).all(), "a refused call wrote the residual"
    _raises(TypeError, ["layer"], engram.cuda.Layer, "not a layer")
    _raises(ValueError, ["device"], engram.cuda.Layer, L, device=99)
    g.close()
    _raises(engram.ClosedError, [], g.apply, xg, tokens=tokens)
    L.close()
    p = engram.Model(model_path("ple"))
    pl = p.layer(p.info["layers"][0])
    _raises(ValueError, ["PLE"], engram.cuda.Layer, pl)
    pl.close()


def test_graph_capture():
    """apply on a stream under capture (torch.cuda.graph, its default global
    mode), after eager applies on another stream: each replay equals an
    eager apply of what the captured tensors hold then, bit for bit (new
    rows, residual and mask copied in; n = 1, 8 and 300: the decode paths
    and the GEMM's); what a replay cannot repeat (host rows, a host mask,
    tokens=, sync=True, sync()) is refused before the layer queues
    anything, and the capture goes on; the eager applies after it (on
    another stream than the warm-up's) work."""
    need_gpu()
    path, m, L, S, W = _m64(1)
    vocab = m.info["vocab"]
    rng = np.random.default_rng(41)

    def fresh(n, seed):
        tokens = rng.integers(0, vocab, n)
        raw = _dev_rows(path, m, L, tokens)
        mk = (rng.integers(0, 4, n) != 1).astype(np.uint8)
        mk[0] = 1  # a token the apply changes, whatever n
        return tokens, raw, torch.from_numpy(mk).cuda(), inputs(n, S, W, torch.bfloat16, seed).cuda()

    with engram.cuda.Layer(L) as g:
        side = torch.cuda.Stream()
        for n in (1, 8, 300):
            tokens, raw, mask, x = fresh(n, n)
            with torch.cuda.stream(side):  # the layer's last stream: not the capture's
                g.apply(x.clone(), rows=raw, stream=side)
            side.synchronize()
            rows_s, mask_s, x_s = raw.clone(), mask.clone(), x.clone()
            raw_h, mask_h = raw.cpu().numpy(), mask.cpu().numpy()  # host copies: not inside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                cur = torch.cuda.current_stream()
                _raises(engram.ArgumentError, ["capture", "CUDA tensors"], g.apply, x_s, rows=raw_h, stream=cur)
                _raises(engram.ArgumentError, ["capture", "CUDA tensors"], g.apply, x_s, rows=rows_s,
                        mask=mask_h, stream=cur)
                _raises(engram.ArgumentError, ["capture", "CUDA tensors"], g.apply, x_s, tokens=tokens,
                        stream=cur)
                _raises(engram.ArgumentError, ["capture", "sync"], g.apply, x_s, rows=rows_s, stream=cur,
                        sync=True)
                _raises(engram.ArgumentError, ["capture", "sync"], g.sync, stream=cur)
                g.apply(x_s, rows=rows_s, mask=mask_s, stream=cur)
            same = 0
            for k in range(3):
                # the eager reference on the legacy stream: at k = 0 the layer's
                # last stream is the warm-up's (side), so this apply waits on
                # the layer's event (which the binding before session t
                # recorded in the capture: on an H200 its wait then failed,
                # cudaErrorInvalidValue; run 85's probe)
                _, raw, mask, x = fresh(n, 100 + k)
                xr = x.clone()
                g.apply(xr, rows=raw, mask=mask, sync=True)
                rows_s.copy_(raw)
                mask_s.copy_(mask)
                x_s.copy_(x)
                graph.replay()
                torch.cuda.synchronize()
                assert (bits(x_s) == bits(xr)).all(), "n=%d: replay %d differs from an eager apply" % (n, k)
                assert (bits(x_s)[0] != bits(x)[0]).any(), "the replay left token 0 (unmasked) as it was"
                same += 1
            g.sync()
            FIGURES.append("graph capture W=%d n=%d: %d replays = eager applies, bit for bit; 5 refusals "
                           "under capture, the capture going on" % (W, n, same))
            print(FIGURES[-1])
            del graph
    L.close()


# ------------------------------------------------------------------ script mode

def test_eager_graphs():
    """Eager applies into the same tensors: from the second on, one launch
    of the layer's graph of the call (engram_cuda.h); each equals the same
    apply with flags=NO_GRAPH (kernel by kernel), bit for bit, at n = 1, 8
    and 64 (BF16 and F32 residuals, a mask) and at 300 (never a graph)."""
    need_gpu()
    path, m, L, S, W = _m64(1)
    rng = np.random.default_rng(43)
    with engram.cuda.Layer(L) as g:
        for n, dtype in ((1, torch.bfloat16), (8, torch.float32), (64, torch.bfloat16), (300, torch.float32)):
            tokens = rng.integers(0, m.info["vocab"], n)
            raw = _dev_rows(path, m, L, tokens)
            mk = (rng.integers(0, 4, n) != 1).astype(np.uint8)
            mk[0] = 1
            mask = torch.from_numpy(mk).cuda()
            x = inputs(n, S, W, dtype, 7 + n).cuda()
            xa, xb = x.clone(), x.clone()
            for k in range(4):
                xa.copy_(x)
                g.apply(xa, rows=raw, mask=mask, sync=True)
                xb.copy_(x)
                g.apply(xb, rows=raw, mask=mask, flags=engram.cuda.NO_GRAPH, sync=True)
                assert np.array_equal(bits(xa), bits(xb)), (n, k)
                assert not np.array_equal(bits(xa), bits(x)), (n, k)  # the apply changed the residual


def _main():
    global _SCRIPT
    _SCRIPT = True
    print("engram", engram.version(), "python", sys.version.split()[0],
          "torch", getattr(torch, "__version__", None), "cuda available:", engram.cuda.available(),
          "why:", engram.cuda.why())
    passed = failed = skipped = 0
    for name, f in sorted(globals().items()):
        if not (name.startswith("test_") and callable(f)):
            continue
        try:
            f()
            passed += 1
            print("PASS", name)
        except Skip as e:
            skipped += 1
            print("SKIP", name, e)
        except Exception:
            import traceback
            failed += 1
            print("FAIL", name)
            traceback.print_exc()
    print("\n".join(FIGURES))
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


def test_pool_raw_steps():
    """Rows as engram.Pool delivers them (dtype "raw": [k][48][264] in host
    memory, each table's rows a strided view) and the same uploaded to the
    device, applied on the GPU: the tokens= path's bits, step by step, for
    a session decoding a stream (history carried by the session and by a
    History beside it)."""
    need_gpu()
    path, m, L, S, W = _m64(14)
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, m.info["vocab"], 40).astype(np.int64)
    h = m.history()
    with engram.Pool(m) as pool, pool.session() as s, engram.cuda.Layer(L) as g:
        at = 0
        while at < len(tokens):
            k = min(1 + at % engram.MAX_DRAFT, len(tokens) - at)
            tok = tokens[at:at + k]
            x0 = inputs(k, S, W, torch.bfloat16, at)
            ref = x0.cuda()
            g.apply(ref, tokens=tok, history=h.copy(), sync=True)
            with s.step(tok, dtype="raw") as st:
                view = st.wait(1)                       # (k, 24, 264) host, token stride 48 x 264
                assert view.shape == (k, 24, 264) and view.strides[0] == 48 * 264
                xh = x0.cuda()
                g.apply(xh, rows=view, sync=True)      # uploaded by the module
                xd = x0.cuda()
                dev = torch.from_numpy(np.ascontiguousarray(st.out)).cuda()
                g.apply(xd, rows=dev[:, 24:48], sync=True)
                st.commit()
            m.hash(tok, history=h)                      # h follows the session
            assert (bits(xh) == bits(ref)).all(), "host step rows differ from tokens= at %d" % at
            assert (bits(xd) == bits(ref)).all(), "device step rows differ from tokens= at %d" % at
            at += k
    L.close()


if __name__ == "__main__":
    sys.exit(_main())
