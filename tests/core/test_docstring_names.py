"""The docstrings cannot point at names that do not exist: every backticked `ja.…`
name in a docstring of the package resolves from `import jaxattn as ja`, through
public names only (a docstring never sends a user into a private module)."""

import ast
import re
from pathlib import Path

import pytest

import jaxattn as ja

PACKAGE = Path(ja.__file__).parent
#: `ja.name.name…` at the start of a backticked span (a call's arguments may follow).
NAME = re.compile(r"`ja\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_names(path: Path) -> list[tuple[int, str]]:
    """`(line, dotted name)` of every backticked `ja.…` name in the file's docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, DOCUMENTED) and (doc := ast.get_docstring(node, clean=False)):
            line = node.body[0].lineno
            found += [(line, m.group(1)) for m in NAME.finditer(doc)]
    return found


def unresolved(dotted: str) -> str | None:
    """Why `ja.<dotted>` does not resolve publicly, or `None` when it does."""
    obj = ja
    for part in dotted.split("."):
        if part.startswith("_"):
            return f"`{part}` is private"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return f"no `{part}`"
    return None


FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_ja_name_in_a_docstring_resolves(path):
    bad = [f"{path.relative_to(PACKAGE)}:{line}: `ja.{name}`: {why}"
           for line, name in docstring_names(path) if (why := unresolved(name))]
    assert not bad, "\n".join(bad)


def test_the_check_finds_a_bad_name(tmp_path):
    """The scan reads module, class and function docstrings, and refuses unknown and
    private names."""
    source = tmp_path / "example.py"
    source.write_text('"""See `ja.solve_flow(dyn, x0, ts)`."""\n\n'
                      'class A:\n    """`ja.metrics.no_such_measure`"""\n\n'
                      '    def f(self):\n        """`ja._flow.solve_flow` and `ja.theory`"""\n',
                      encoding="utf-8")
    names = [name for _, name in docstring_names(source)]
    assert names == ["solve_flow", "metrics.no_such_measure", "_flow.solve_flow", "theory"]
    assert [unresolved(n) for n in names] == [None, "no `no_such_measure`",
                                              "`_flow` is private", None]
