"""The type stub (python/engram/__init__.pyi) and the docstrings against the
module as built: every public class, function and constant of engram is in
the stub, every name the stub promises exists, each class's public methods
and attributes match, and every one of them has a docstring whose first
line is its signature (what help() shows)."""
import ast
import inspect
import os

import engram

STUB = os.path.join(os.path.dirname(__file__), "..", "..", "python", "engram", "__init__.pyi")


def stub_names():
    tree = ast.parse(open(STUB).read())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for b in node.body:
                if isinstance(b, ast.FunctionDef):
                    members.add(b.name)
                elif isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name):
                    members.add(b.target.id)
            classes[node.name] = members
            top.add(node.name)
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    return top, classes


def public(obj):
    return {n for n in dir(obj) if not n.startswith("_") or n in ("__enter__", "__exit__", "__init__")}


def test_module_names_match_the_stub():
    top, classes = stub_names()
    runtime = {n for n in dir(engram) if not n.startswith("_") and n not in ("cuda",)
               and not inspect.ismodule(getattr(engram, n))} | {"__version__"}
    aliases = {"ArrayLike", "Tokens", "StepRequest"}
    assert runtime - top == set(), "in the module, not in the stub"
    assert (top - aliases) - runtime == set(), "in the stub, not in the module"


def test_class_members_match_the_stub():
    _, classes = stub_names()
    for name, members in classes.items():
        cls = getattr(engram, name)
        if issubclass(cls, BaseException):
            continue
        got = public(cls) - {"__init__"}
        want = members - {"__init__", "__iter__", "__next__"}
        assert got - want == set(), f"{name}: in the module, not in the stub"
        assert want - got == set(), f"{name}: in the stub, not in the module"


def test_docstrings_name_their_signature():
    _, classes = stub_names()
    for name in ("Model", "Layer", "History", "Pool", "Session", "Step", "Prefill"):
        cls = getattr(engram, name)
        assert cls.__doc__ and len(cls.__doc__) > 80, name
        for m in public(cls):
            if m in ("__enter__", "__exit__", "__init__"):
                continue
            doc = getattr(cls, m).__doc__
            assert doc and len(doc) > 8, f"{name}.{m} has no docstring"
            if callable(getattr(cls, m)):
                assert doc.startswith(m + "("), f"{name}.{m}: first line is not its signature: {doc[:40]!r}"
    for exc in ("Error", "ArgumentError", "DataError", "ModelError", "NotFoundError", "TimeoutError",
                "CancelledError", "ClosedError", "BusyError"):
        assert getattr(engram, exc).__doc__, exc


def test_help_renders():
    text = inspect.getdoc(engram.Model) + "".join(
        inspect.getdoc(getattr(engram.Model, m)) or "" for m in ("hash", "rows", "layer"))
    for word in ("tokens", "history", "mask", "out", "dtype", "threads"):
        assert word in text
