"""Tests go through the public API where one exists: a test file imports a name from
a private module (`jaxattn._x`, `jaxattn.y._z`) only when no public namespace
exports it (the private pieces under test: blocked attention, the kernels' lanes,
the run folders' writers, …)."""

import ast
import importlib
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
#: The public namespaces: `ja` and each public folder's face.
PUBLIC = ("jaxattn", "jaxattn.metrics", "jaxattn.theory", "jaxattn.models", "jaxattn.explore",
          "jaxattn.sweep", "jaxattn.experiments", "jaxattn.meanfield", "jaxattn.spectral",
          "jaxattn.bench")


def _private_imports(path: Path):
    """`(line, module, name)` of each `from <private jaxattn module> import name`."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("jaxattn") \
                and any(part.startswith("_") for part in node.module.split(".")[1:]):
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def _public_home(name: str, obj) -> str | None:
    """The first public face that exports `obj` as `name` (in its `__all__` where it
    declares one)."""
    for face in PUBLIC:
        module = importlib.import_module(face)
        if name not in getattr(module, "__all__", (name,)):
            continue
        if getattr(module, name, None) is obj:
            return face
    return None


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: p.name)
def test_a_private_import_has_no_public_home(path):
    found = []
    for line, module, name in _private_imports(path):
        obj = getattr(importlib.import_module(module), name, None)
        if obj is not None and not isinstance(obj, type(importlib)):  # a module is private
            home = _public_home(name, obj)
            if home is not None:
                found.append(f"{path.name}:{line} imports {name} from {module}: use {home}")
    assert not found, "\n".join(found)
