"""The faces that import on first use (`jaxattn`, `jaxattn.experiments`) list each
name once, as its import under `if TYPE_CHECKING:`; `lazy_names` reads that block,
every listed name resolves to the object the import names, and `import jaxattn`
loads no JAX."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import jaxattn as ja
from jaxattn._lazy import lazy_names


@pytest.mark.parametrize("face", [ja, ja.experiments])
def test_every_listed_name_is_the_imported_object(face):
    names = lazy_names(face.__file__)
    assert names and set(names) <= set(face.__all__)
    for name, (module, attribute) in names.items():
        target = importlib.import_module(module, face.__name__)
        want = target if attribute is None else getattr(target, attribute)
        assert getattr(face, name) is want, name
    for name in face.__all__:
        assert getattr(face, name) is not None


def test_the_face_imports_no_application():
    """The applications (`experiments`, `sweep`, `bench`, `cli`) import the library:
    the face reaches them by name only, so no import runs up from it."""
    tree = ast.parse(Path(ja.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module is None for alias in node.names}
    assert not imported & set(ja._APPLICATIONS)
    assert all(hasattr(ja, name) for name in ja._APPLICATIONS)


def test_import_loads_no_jax():
    code = "import sys, jaxattn, jaxattn.experiments; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("block, message", [
    ("import os", "one a line"),
    ("from ._flow import solve_flow", "solve_flow as solve_flow"),
    ("from ._flow import solve_flow as solve", "solve_flow as solve_flow"),
])
def test_a_block_not_written_as_re_exports_is_refused(tmp_path, block, message):
    face = tmp_path / "__init__.py"
    face.write_text(f"from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    {block}\n",
                    encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        lazy_names(str(face))
    face.write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no `if TYPE_CHECKING:` block"):
        lazy_names(str(face))
