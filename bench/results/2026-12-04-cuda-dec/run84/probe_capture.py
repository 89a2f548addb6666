"""run 84's probe (session t): engram.cuda.Layer.apply under torch.cuda.graph
capture, with whatever engram module PYTHONPATH names (the binding before
and after session t's change), printing what happens instead of asserting:
  A. an eager apply on a side stream, then a captured apply (the capture
     stream is not the layer's last stream): does the capture succeed, and
     does a replay equal an eager apply?
  B. a fresh layer: a captured apply first, then an eager apply on another
     stream: does the eager apply work?
Rows come from the model file (tests/python/test_cuda.py's GGUF parse)."""
import os
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "python"))
import test_cuda as T  # noqa: E402
import engram  # noqa: E402
import engram.cuda  # noqa: E402

path = T.model_path("m64")
m = engram.Model(path)
L = m.layer(1)
S, W = L.info["streams"], L.info["width"]
n = 8
tokens = np.arange(n) * 13 + 7
raw = torch.from_numpy(T.raw_rows(path, 1, m.hash(tokens)[:, :24])).cuda()
x0 = T.inputs(n, S, W, torch.bfloat16, 5).cuda()
print("engram from", engram.__file__, "torch", torch.__version__)


def attempt(what, f):
    try:
        r = f()
        print("%s: ok%s" % (what, "" if r is None else " (%s)" % r))
        return True
    except Exception as e:
        print("%s: %s: %s" % (what, type(e).__name__, str(e).splitlines()[0][:300]))
        return False


for case in ("A", "B"):
    g = engram.cuda.Layer(L)
    side = torch.cuda.Stream()
    if case == "A":
        with torch.cuda.stream(side):
            g.apply(x0.clone(), rows=raw, stream=side)
        side.synchronize()
    x_s = x0.clone()
    graph = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(graph):
            g.apply(x_s, rows=raw, stream=torch.cuda.current_stream())

    ok = attempt("%s: capture" % case, capture)
    if ok:
        def replay():
            x_s.copy_(x0)
            graph.replay()
            torch.cuda.synchronize()
            xr = x0.clone()
            g.apply(xr, rows=raw, sync=True)
            return "replay = eager apply: %s" % bool((T.bits(x_s) == T.bits(xr)).all())
        attempt("%s: replay" % case, replay)

    def eager_other():
        xe = x0.clone()
        with torch.cuda.stream(side):
            g.apply(xe, rows=raw, stream=side)
        g.sync(stream=side)
    attempt("%s: eager apply on another stream after the capture" % case, eager_other)
    attempt("%s: close" % case, g.close)
    try:
        torch.cuda.synchronize()
    except Exception as e:
        print("%s: torch.cuda.synchronize: %s" % (case, e))
