"""The members' source as declared, read without importing it (nor JAX: seconds under
load, BENCHMARKS.md, "Measured claims behind design choices"): the one reader of the
source for what the command line shows before JAX loads (`class_head`, `class_params`,
`declared`).

Only plain declarations are read: literals, `Param(…)` calls, names bound at the top
of a module or imported from a sibling, tuples of them. Anything else says "not
declared plainly" (`NotDeclared`) and the caller imports the module instead; a test
checks that every experiment's parameters read here are its own."""

import ast
import builtins
import functools
import importlib
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple

from . import base

_ROOT = Path(__file__).resolve().parent.parent  # the jaxattn package
#: Modules imported for real: they load neither JAX nor the experiments.
_LIGHT = {"jaxattn.experiments.base": base}


class NotDeclared(Exception):
    """A value the source does not declare plainly enough to read without running it."""


def declared(module: str, name: str, *, keys: bool = False) -> Any:
    """The literal value bound to `name` at the top of `module` (a dotted name in
    `jaxattn`), or with `keys` the literal keys of the dict bound to it, read from the
    source without importing it.

    **Returns:**

    The value, or a `NotDeclared` error when the source does not bind `name` to a
    literal (a test compares it with the imported value).
    """
    node = _module(module).binding(name)
    if keys and isinstance(node, ast.Dict):
        node = ast.Tuple([k for k in node.keys if k is not None], ast.Load())
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise NotDeclared(f"{module}.{name} is not a literal.") from None


class _Class(NamedTuple):
    """A class as its source declares it: its module and its `ast.ClassDef`."""

    module: "_Module"
    node: ast.ClassDef


def _class_attribute(cls, attr: str) -> Any:
    """`cls.attr` as the class body (or its bases', first base first) binds it, or a
    `NotDeclared` (an `AttributeError` from a class imported for real)."""
    if not isinstance(cls, _Class):  # a class imported for real (`AbstractExperiment`)
        return getattr(cls, attr)
    for node in cls.node.body:
        if _bound_name(node) == attr and node.value is not None:
            return cls.module.evaluate(node.value)
    for parent in cls.node.bases:
        try:
            return _class_attribute(cls.module.evaluate(parent), attr)
        except (NotDeclared, AttributeError):
            pass
    raise NotDeclared(f"no {attr} declared")


def _bound_name(node: ast.stmt) -> str | None:
    """The one plain name an assignment statement binds, if it is one."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    elif isinstance(node, ast.AnnAssign):
        target = node.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


class _Module:
    """One module of `jaxattn` as its source declares it: its top-level names
    evaluated on demand (`_module`: each parsed once)."""

    def __init__(self, dotted: str):
        path = _ROOT.joinpath(*dotted.split(".")[1:])
        self.path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        self.dotted = dotted
        self.package = dotted if path.is_dir() else dotted.rpartition(".")[0]
        self.tree = ast.parse(self.path.read_text(encoding="utf-8"), str(self.path))

    def binding(self, name: str) -> ast.AST:
        """The last top-level statement that binds `name` (its value for an
        assignment)."""
        for node in reversed(self.tree.body):
            if _bound_name(node) == name and node.value is not None:
                return node.value
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
            if isinstance(node, ast.Import | ast.ImportFrom) and any(
                    (a.asname or a.name.split(".")[0]) == name for a in node.names):
                return node
        raise NotDeclared(f"{self.dotted} binds no {name}")

    def lookup(self, name: str) -> Any:
        """The value of the top-level `name`: evaluated, imported (from the standard
        library, or from a sibling read the same way), or a `_Class`."""
        node = self.binding(name)
        if isinstance(node, ast.ClassDef):
            return _Class(self, node)
        if not isinstance(node, ast.Import | ast.ImportFrom):
            return self.evaluate(node)
        if isinstance(node, ast.Import):  # `import math`: the module itself
            dotted, original = name, None
        else:
            original = next(a.name for a in node.names if (a.asname or a.name) == name)
            package = self.package.rsplit(".", node.level - 1)[0]
            dotted = node.module if node.level == 0 else f"{package}.{node.module}"
        if dotted in _LIGHT:
            return getattr(_LIGHT[dotted], original)
        if isinstance(node, ast.ImportFrom) and node.level and node.module:  # a sibling
            return _module(dotted).lookup(original)
        # the standard library's modules are imported (never a third-party one: JAX)
        if str(dotted).split(".")[0] not in sys.stdlib_module_names:
            raise NotDeclared(f"import {dotted}")
        module = importlib.import_module(dotted)
        return module if original is None else getattr(module, original)

    def evaluate(self, expr: ast.expr) -> Any:
        """`expr` evaluated with the top-level names it uses (a name it binds itself,
        as a comprehension's, is left to it)."""
        names = {}
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and node.id not in names and not hasattr(builtins,
                                                                                   node.id):
                try:
                    names[node.id] = self.lookup(node.id)
                except NotDeclared:
                    pass
        if any(isinstance(v, _Class) for v in names.values()) and not isinstance(expr, ast.Name):
            raise NotDeclared("a class read from the source is used in an expression")
        code = compile(ast.Expression(expr), str(self.path), "eval")
        return eval(code, {"__builtins__": builtins, **names})  # our own source


@functools.cache
def _module(dotted: str) -> _Module:
    return _Module(dotted)


def class_head(module: str, cls: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values bound to `names` at the head of class `cls` in the module
    `module` of `jaxattn.experiments` (its class body up to its first method): no
    import, and only the class's head is parsed.

    **Returns:**

    `{name: value}` for the names found (none when the module has no such class).
    """
    path = _ROOT / "experiments" / f"{module}.py"
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"class {cls}(")), None)
    if start is None:
        return {}
    end = next((i for i in range(start + 1, len(lines)) if _ends_head(lines[i])), len(lines))
    node = ast.parse("\n".join(lines[start:end]) + "\n    pass").body[0]
    return {target.id: ast.literal_eval(statement.value) for statement in node.body
            if isinstance(statement, ast.Assign) for target in statement.targets
            if isinstance(target, ast.Name) and target.id in names}


def _ends_head(line: str) -> bool:
    """Whether `line` ends a class's head: its first method or the next top-level
    statement."""
    return line.startswith(("    def ", "    @")) or (line[:1] not in ("", " ", "#", ")"))


def class_params(module: str, cls: str) -> tuple[base.Param, ...] | None:
    """The parameters of the experiment class `cls` of `jaxattn.experiments.<module>`
    (its `all_params()`), read from its source and its bases' without importing them;
    `None` when they are not declared plainly (the caller then imports it)."""
    try:
        found = _module(f"jaxattn.experiments.{module}").lookup(cls)
        shape = types.SimpleNamespace(params=tuple(_class_attribute(found, "params")),
                                      base_params=tuple(_class_attribute(found, "base_params")))
        return base.AbstractExperiment.all_params(shape)
    except (NotDeclared, NameError, TypeError, AttributeError, KeyError):
        return None
