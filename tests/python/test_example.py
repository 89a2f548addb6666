"""examples/torch_engram.py runs and its own check holds: every Engram
application of the pooled path (prefill chunks, decode steps) gives the same
bits as Layer.apply(tokens, copy) from an independently kept History.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python/test_example.py
"""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
engram = pytest.importorskip("engram")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "torch_engram.py")


@pytest.fixture(scope="module")
def model(v41_path):
    # the example's own model (base 20000, W = 64, normal fill, seed 5) is
    # conftest's v41, built once a session (conftest skips where there is
    # no engram binary)
    return v41_path


def run_example(*args):
    # the example imports the same engram package as this test
    env = dict(os.environ)
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(engram.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg, env.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, EXAMPLE] + list(args), capture_output=True, text=True,
                       env=env, timeout=120)
    return p


def checks_of(out):
    m = re.search(r"^check: OK \((\d+) Engram applications", out, re.M)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_example_check_passes(model, dtype):
    # prompts of 300 and 517 tokens in chunks of 128: 3 + 5 chunks, 2 tables
    # each; 4 decode steps of 2 sequences, 2 tables each
    p = run_example(model, "--dtype", dtype, "--decode", "4", "--chunk", "128", "--prompts", "300,517")
    assert p.returncode == 0, p.stdout + p.stderr
    assert checks_of(p.stdout) == 2 * (3 + 5) + 4 * 2 * 2, p.stdout


def test_example_short_prompt(model):
    # a prompt shorter than a chunk, and one that fills its chunks exactly
    p = run_example(model, "--decode", "2", "--chunk", "16", "--prompts", "5,32")
    assert p.returncode == 0, p.stdout + p.stderr
    assert checks_of(p.stdout) == 2 * (1 + 2) + 2 * 2 * 2, p.stdout
