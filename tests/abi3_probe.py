"""abi3_probe.py MODEL - run by every Python that tests/test_abi3.sh finds:
imports engram from build/python (PYTHONPATH) and uses it without NumPy,
through the buffer protocol alone (array.array, memoryview), printing a
digest of what it computed: every interpreter must print the same line."""
import array
import hashlib
import sys

import engram

m = engram.Model(sys.argv[1])
W, S = m.info["width"], m.info["streams"]
tokens = [(i * 7919 + 13) % 129280 for i in range(40)]
ids = array.array("I", bytes(4 * 48 * len(tokens)))
m.hash(tokens, out=memoryview(ids).cast("B").cast("I", (len(tokens), 48)))
x = array.array("f", [((i * 37) % 101 - 50) / 16.0 for i in range(len(tokens) * S * W)])
view = memoryview(x).cast("B").cast("f", (len(tokens), S, W))
with m.layer(1, threads=2) as layer:
    layer.apply(tokens, view)
try:
    layer.apply(tokens, view)
    print("closed layer accepted a call")
except engram.ClosedError:
    pass
print(engram.version(), hashlib.sha256(ids.tobytes()).hexdigest()[:16],
      hashlib.sha256(x.tobytes()).hexdigest()[:16])
