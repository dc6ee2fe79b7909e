"""Faces that import on first use (PEP 562) from one list: the face's
`if TYPE_CHECKING:` block, which tools read as imports and which `lazy_names`
reads from the source (no import, no JAX) as the map from each public name to the
module that defines it. A name is written once, as its import."""

import ast
import importlib
from pathlib import Path


def lazy_names(face: str) -> dict[str, tuple[str, str | None]]:
    """The names a face imports under `if TYPE_CHECKING:`, each with where it lives.

    **Arguments:**

    - `face`: the path of the face's `__init__.py` (its `__file__`).

    **Returns:**

    `{name: (module, attribute)}`, the module relative to the face's package, in the
    block's order: `from ._flow import solve_flow as solve_flow` gives
    `("._flow", "solve_flow")`; a subpackage or module, `from . import sweep as
    sweep` (or under a short name, `from . import paper001 as paper`), gives
    `(".sweep", None)`. Anything else in the block is a `ValueError`, raised when
    the face is imported.
    """
    tree = ast.parse(Path(face).read_text(encoding="utf-8"), face)
    block = next((node for node in tree.body if isinstance(node, ast.If)
                  and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"),
                 None)
    imports = [(node, alias) for node in getattr(block, "body", [])
               for alias in getattr(node, "names", [None])]
    wrong = next(((node.lineno, alias.name if alias else "name") for node, alias in imports
                  if not (isinstance(node, ast.ImportFrom) and node.level >= 1
                          and (node.module is None or alias.asname == alias.name))), None)
    for bad, message in (
        (block is None, f"{face} has no `if TYPE_CHECKING:` block of its lazy names."),
        (wrong is not None, f"{face}:{wrong and wrong[0]}: the lazy names are written `from "
                            f".module import {wrong and wrong[1]} as {wrong and wrong[1]}` (a "
                            "re-export, as tools read it), one a line."),
    ):
        if bad:
            raise ValueError(message)
    names = {}
    for node, alias in imports:
        if node.module is None:  # `from . import module as name`
            names[alias.asname or alias.name] = ("." * node.level + alias.name, None)
        else:
            names[alias.name] = ("." * node.level + node.module, alias.name)
    return names


def load(package: str, where: tuple[str, str | None]):
    """The object `lazy_names` placed at `where`, imported now."""
    module, attribute = where
    value = importlib.import_module(module, package)
    return value if attribute is None else getattr(value, attribute)
