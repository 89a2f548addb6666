"""engram: the on-disk hashed n-gram memory of DeepSeek V4.1 Flash (and its
family: Qwen3.8's PLE) for Python serving stacks.

A thin package over the C extension engram._engram (CPython's limited API:
one build for every Python >= 3.8).  Arrays are never copied where the
library writes: residuals and outputs are borrowed through the buffer
protocol (NumPy) or DLPack (PyTorch), and the GIL is released while rows
are read and layers applied.

    import engram, numpy as np
    m = engram.Model("model.gguf")
    layer = m.layer(1)
    x = np.zeros((n, 4, m.info["width"]), np.float32)
    layer.apply(tokens, x)                 # x updated in place

See help(engram.Model), help(engram.Layer), help(engram.Pool).
"""
from ._engram import *  # noqa: F401,F403
from ._engram import __version__, version, strerror  # noqa: F401
