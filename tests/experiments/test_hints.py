"""Error hints name only flags the command has (issue 43, point 7).

Every `--flag` written in a message string of an experiment's module (string
constants and f-strings, docstrings aside) is a flag of that experiment (`all_params`)
or a global flag of `jaxattn run`; a shared base module's (`theorem.py`,
`paper004.py`, …) is a flag of at least one member built on it (a base guards a
message on its member's parameters). A message made for another command is checked
against that command's parser (`ELSEWHERE`).
"""

import ast
import importlib
import inspect
import re

import pytest

from jaxattn.cli import main, parser
from jaxattn.experiments import EXPERIMENTS

#: The flags of `jaxattn run` itself, beside each experiment's parameters.
GLOBAL = {"--seed", "--out", "--no-progress"}
#: Functions of an experiment's module whose messages another command shows:
#: `(module, function) → command`; their flags are checked against its parser.
ELSEWHERE = {("jaxattn.experiments.loop_grid", "check_sizes"): "loop"}
#: A flag as a user would type it (upper case too: `--randomKQ` is not ours either).
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w]*(?:-\w+)*")


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.add(id(first.value))
    return out


def messages(module: str) -> list[tuple[str | None, int, str]]:
    """`(enclosing function, line, text)` of each string of `module`'s source that is no
    docstring; an f-string's text is its literal parts, `{}` for each field."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    skip = _docstrings(tree)
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
             for v in node.values}
    found = []

    def visit(node, function):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and function is None:
            function = node.name
        if id(node) not in skip and id(node) not in parts:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((function, node.lineno, node.value))
            elif isinstance(node, ast.JoinedStr):
                found.append((function, node.lineno, "".join(
                    v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def flags(experiment) -> set[str]:
    return {p.flag for p in experiment.all_params()} | GLOBAL


def _modules(experiment) -> list[str]:
    return [c.__module__ for c in type(experiment).__mro__
            if c.__module__.startswith("jaxattn.experiments.")]


def _command_flags(command: str) -> set[str]:
    sub = parser([command])._subparsers._group_actions[0].choices[command]
    return {o for action in sub._actions for o in action.option_strings}


def test_the_scan_finds_flags_in_strings_and_f_strings():
    """The scanner itself: an f-string's flag is found, a docstring's is not."""
    found = {f for _, _, text in messages("jaxattn.experiments.metastability")
             for f in FLAG.findall(text)}
    assert {"--beta-max", "--log-horizon", "--integrator"} <= found
    assert FLAG.findall("rotf's --randomKQ, x--y, —-- ") == ["--randomKQ"]


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_flag_a_message_names_is_the_experiments(name):
    experiment = EXPERIMENTS[name]
    own, *bases = _modules(experiment)
    members = {m: set().union(*(flags(e) for e in EXPERIMENTS.values()
                                if m in _modules(e))) for m in bases}
    wrong = []
    for module in [own, *bases]:
        known = flags(experiment) if module == own else members[module]
        for function, line, text in messages(module):
            command = ELSEWHERE.get((module, function))
            allowed = _command_flags(command) if command else known
            wrong += [f"{module}:{line} {flag}" for flag in FLAG.findall(text)
                      if flag not in allowed]
    assert not wrong, f"{name}: messages name flags it does not have: {wrong}"


def test_metastabilitys_step_budget_error_names_its_own_flags(tmp_path, capsys):
    """The plain integrator out of steps: one line naming `--max-steps` and
    `--integrator rescaled`, and no flag `jaxattn run metastability` lacks (it once
    said `--discrete`)."""
    experiment = EXPERIMENTS["metastability"]
    code = main(["run", "metastability", "--out", str(tmp_path / "run"), "--no-progress",
                 "--tokens", "4", "--betas", "1", "--beta-min", "20", "--beta-max", "20",
                 "--saves", "4", "--max-steps", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    named = set(FLAG.findall(err))
    assert {"--max-steps", "--integrator"} <= named, err
    assert named <= flags(experiment), err
