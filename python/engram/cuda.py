"""engram.cuda: an Engram layer's output stage on an NVIDIA GPU, applied in
place to CUDA tensors (PyTorch, CuPy: borrowed through DLPack, never copied)
on the caller's stream.

This module always imports.  It is usable when the CUDA extension
(engram._engram_cuda: libengram-cuda, cuBLAS, the CUDA runtime) loads and a
CUDA device answers; otherwise available() is False, why() says why (the
extension's ImportError, e.g. libcublas.so.13 missing or a build without
nvcc, or the CUDA runtime's message such as "no CUDA device"), and making a
Layer raises RuntimeError naming that reason.  Importing engram.cuda does
not initialize CUDA; available(), why() and Layer() do (once).

    import engram, engram.cuda, torch
    m = engram.Model("model.gguf")
    g = engram.cuda.Layer(m.layer(1))          # weights uploaded (F16)
    x = torch.randn(n, 4, m.info["width"], device="cuda", dtype=torch.bfloat16)
    g.apply(x, tokens=ids)                     # x updated in place
    g.apply(x, rows=step_rows[:, :24], stream=torch.cuda.current_stream())
    g.sync()                                   # DataError names a non-finite token

DeepSeek V4.1 layers only: Qwen3.8 PLE's GPU path is internal to
libengram-cuda and not offered here yet (a PLE layer raises ValueError).
Accuracy (cuda/README.md): decode (n <= 64) sums in F32 in a fixed order,
larger n on the tensor cores with exact products promoted to F32 sums; not
the CPU's bits, the same accuracy.
"""

try:
    from . import _engram_cuda as _c
    _import_error = None
except ImportError as e:  # not built (no nvcc), libcublas or the driver library missing
    _c = None
    _import_error = e

__all__ = ["available", "why", "Layer", "FMA_ONLY", "SERIAL_GATE", "NO_GRAPH", "GEMV_MAX", "BLOCK"]

# engram_cuda.h's flags and sizes (the same numbers when the extension is absent)
FMA_ONLY = 1
SERIAL_GATE = 4
NO_GRAPH = 8
GEMV_MAX = 64
BLOCK = 2048

_probed = False
_reason = None


def why():
    """The reason engram.cuda cannot be used here (a non-empty str), or None
    when it can: the extension's ImportError text, or the CUDA runtime's
    ("no CUDA device", "CUDA driver version is insufficient ...")."""
    global _probed, _reason
    if _c is None:
        msg = str(_import_error) or type(_import_error).__name__
        if getattr(_import_error, "name", None) == __name__.rsplit(".", 1)[0] + "._engram_cuda":
            msg = "engram._engram_cuda is not installed (this build has no CUDA part: nvcc was not found): " + msg
        else:
            msg = "engram._engram_cuda did not load: " + msg
        return msg
    if not _probed:
        _reason = _c.probe()
        _probed = True
    return _reason


def available():
    """True if a CUDA device can be used through engram.cuda (see why())."""
    return why() is None


if _c is not None:
    Layer = _c.Layer
    FMA_ONLY, SERIAL_GATE, NO_GRAPH = _c.FMA_ONLY, _c.SERIAL_GATE, _c.NO_GRAPH
    GEMV_MAX, BLOCK = _c.GEMV_MAX, _c.BLOCK
else:
    class Layer:
        """engram.cuda.Layer(layer, device=0): not available in this
        installation; making one raises RuntimeError naming why()."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError("engram.cuda is not available: " + why())
