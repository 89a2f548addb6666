"""Shared fixtures of the Python binding's tests (tests/python).

Run from the repository root after `make lib build/engram python`:

    /usr/bin/python3 -m pytest tests/python -q

ENGRAM_BUILD names the build directory (default: build): the module is
imported from $ENGRAM_BUILD/python and the CLI, which builds the models and
gives the known answers, is $ENGRAM_BUILD/engram.

Models are built once per pytest session into a temporary directory (removed
at the end), on first use:
    v41_path        V4.1, W = 64 (the demo's shape), base 20000, seed 5
    v41_wide_path   V4.1 at the real width W = 5120, base 5000
    ple_path        Qwen3.8 PLE (qwen4exp), W = 64, base 20011, seed 3
build_model(name, *args) builds (once) any other `engram build` model.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("ENGRAM_BUILD", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
ENGRAM = os.path.join(BUILD, "engram")
sys.path.insert(0, os.path.join(BUILD, "python"))

import engram  # noqa: E402  (from $ENGRAM_BUILD/python)

MODELS = {
    "v41": ["--base", "20000", "--width", "64", "--fill", "normal", "--seed", "5"],
    "v41_wide": ["--base", "5000", "--width", "5120", "--fill", "normal", "--seed", "5"],
    "ple": ["--arch", "qwen4exp", "--base", "20011", "--width", "64", "--fill", "normal",
            "--seed", "3"],
}


def run_cli(*args, check=True, input=None):
    """Runs $ENGRAM_BUILD/engram with args; returns the CompletedProcess
    (stdout and stderr as bytes)."""
    p = subprocess.run([ENGRAM] + [str(a) for a in args], input=input,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and p.returncode != 0:
        raise AssertionError("engram %s: exit %d: %s" % (" ".join(map(str, args)), p.returncode,
                                                        p.stderr.decode(errors="replace")))
    return p


@pytest.fixture(scope="session")
def engram_exe():
    if not os.access(ENGRAM, os.X_OK):
        pytest.skip("no %s (make build/engram)" % ENGRAM)
    return ENGRAM


@pytest.fixture(scope="session")
def cli(engram_exe):
    """cli(*args, check=True, input=None) -> CompletedProcess of the engram CLI."""
    return run_cli


@pytest.fixture(scope="session")
def model_dir():
    d = tempfile.mkdtemp(prefix="engram-pytest-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def build_model(model_dir, engram_exe):
    """build_model(name, *build_args) -> path: `engram build` once a session."""
    built = {}

    def build(name, *args):
        if name not in built:
            path = os.path.join(model_dir, name + ".gguf")
            run_cli("build", path, *(args or MODELS[name]))
            built[name] = path
        return built[name]
    return build


@pytest.fixture(scope="session")
def v41_path(build_model):
    return build_model("v41")


@pytest.fixture(scope="session")
def v41_wide_path(build_model):
    return build_model("v41_wide")


@pytest.fixture(scope="session")
def ple_path(build_model):
    return build_model("ple")
