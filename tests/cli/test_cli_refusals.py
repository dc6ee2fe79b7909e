"""The `jaxattn` command line refuses cleanly and answers fast: a flag given twice or
a number in other than ASCII digits is one line and exit status 2 in every command;
help and argument errors answer without loading JAX; Ctrl-C at any moment, start-up
and exit included, ends the program with exit status 130."""

import json
import os
import subprocess
import sys

import pytest

from jaxattn.cli import main

TWICE = [
    ["demo", "--seed", "1", "--seed", "2"],
    ["run", "thm41-sphere", "--seed", "1", "--seed", "2"],
    ["run", "thm41-sphere", "--tokens", "3", "--tokens=4"],
    ["sweep", "thm41-sphere", "--instances", "2", "--instances", "3"],
    ["loop", "--model", "gpt2", "--passes", "2", "--passes", "3"],
    ["bench", "--repeats", "2", "--repeats", "3"],
    ["doctor", "--size", "8", "--size", "9"],
    ["--nondeterministic", "--nondeterministic", "plot", "somewhere"],
]
DIGITS = [  # Python's int() and float() read these as 3 and 3.5
    ["demo", "--tokens", "٣"],
    ["demo", "--horizon", "٣.٥"],
    ["run", "thm41-sphere", "--tokens", "٣"],
    ["run", "thm41-sphere", "--seed", "３"],
    ["sweep", "thm41-sphere", "--instances", "٣"],
    ["loop", "--model", "gpt2", "--tokens", "٣"],
    ["bench", "--repeats", "३"],
    ["doctor", "--size", "٣"],
]


def _one_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxattn") and "error" in lines[0], err
    return lines[0]


@pytest.mark.parametrize("argv", TWICE, ids=" ".join)
def test_a_flag_given_twice_is_refused(capsys, argv):
    flag = next(w for w in argv if argv.count(w) > 1 or w.startswith("--tokens="))
    assert f"{flag.partition('=')[0]} is given twice" in _one_line(capsys, argv)


@pytest.mark.parametrize("argv", DIGITS, ids=" ".join)
def test_a_number_in_other_digits_is_refused(capsys, argv):
    assert "ASCII digits" in _one_line(capsys, argv)


def test_repeatable_flags_stay_repeatable():
    from jaxattn.cli import parser

    args = parser(["sweep"]).parse_args(["sweep", "x", "--grid", "a=1", "--grid", "b=2"])
    assert args.grid == ["a=1", "b=2"]


# Every `LIGHT` command line in one fresh process, each in turn: JAX, once loaded, stays
# loaded, so the first line that loads it fails and none can hide it.
_PROBE = """
import contextlib, io, json, sys
from jaxattn.cli import main
answers = []
for argv in {argvs!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # --help
            code = e.code
    answers.append([code, "jax" in sys.modules, err.getvalue()])
print(json.dumps(answers))
"""

LIGHT = [  # (argv, exit status)
    (["run", "thm41-sphere", "--help"], 0),
    (["run", "phase-diagram", "--help"], 0),
    (["run", "loop-grid", "--help"], 0),
    (["bench", "--help"], 0),
    (["loop", "--help"], 0),
    (["loop"], 2),
    (["loop", "--model", "gpt2", "--weights", "odd"], 2),
    (["loop", "--model", "gpt2", "--prom", "3"], 2),
    (["doctor", "--help"], 0),
    (["run", "thm99"], 2),
    (["run", "thm41-sphere", "--bogus", "1"], 2),
    (["run", "loop-grid", "--discrete"], 2),
    (["run", "thm41-sphere", "--seed", "1", "--seed", "2"], 2),
    (["run", "thm41-sphere", "--tok", "3"], 2),
    (["run", "thm41-sphere", "--tokens", "x"], 2),  # an override's own check
    (["run", "thm41-sphere", "--horizon", "-1"], 2),
    (["run", "phase-diagram", "--systems", "0"], 2),
    (["bench", "--cases", "nope"], 2),
    (["bench", "--quick", "--size", "large"], 2),
    (["bench", "--precision", "float16"], 2),
]


@pytest.fixture(scope="module")
def light_answers() -> dict:
    """`(exit status, JAX loaded, stderr)` of each `LIGHT` command line."""
    argvs = [argv for argv, _ in LIGHT]
    out = subprocess.run([sys.executable, "-c", _PROBE.format(argvs=argvs)],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0 and out.stderr == "", out.stdout[-2000:] + out.stderr[-2000:]
    answers = json.loads(out.stdout.strip().splitlines()[-1])
    return {" ".join(argv): answer for argv, answer in zip(argvs, answers)}


@pytest.mark.parametrize("argv, code", LIGHT, ids=[" ".join(a) for a, _ in LIGHT])
def test_help_and_argument_errors_answer_without_jax(light_answers, argv, code):
    status, jax_loaded, err = light_answers[" ".join(argv)]
    assert (status, jax_loaded) == (code, False), err[-2000:]
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


def test_the_declared_constants_are_the_modules():
    from jaxattn import PRECISIONS
    from jaxattn.bench import suite
    from jaxattn.cli import bench

    assert bench.ALL_CASES == suite.ALL_CASES
    assert bench.PRESETS == tuple(suite.PRESETS)
    assert bench.PRECISIONS == PRECISIONS
    from jaxattn.cli import models as loop
    from jaxattn.experiments.loop_grid import DTYPES
    from jaxattn.experiments.loop_runner import TOKENS
    from jaxattn.models import WEIGHTS

    assert (loop.PRECISIONS, loop.DTYPES) == (PRECISIONS, tuple(DTYPES))
    assert (loop.TOKENS, loop.WEIGHTS) == (TOKENS, tuple(WEIGHTS))
    from jaxattn.models import PACKAGED, PRESETS

    assert (loop.MODELS, loop.PACKAGED) == (tuple(PRESETS), tuple(PACKAGED))


def test_run_help_lists_every_parameter_of_the_experiment():
    """The parameters read from the source (`jaxattn run NAME --help` without JAX) are
    the experiment's own, for every experiment."""
    from jaxattn.experiments import EXPERIMENTS, declared_params

    for name, experiment in EXPERIMENTS.items():
        assert declared_params(name) == experiment.all_params(), name


# A Ctrl-C sent by the process itself at a chosen moment: while a module is imported
# (`IMPORT`) or while the program exits (`EXIT`).
IMPORT = """
import importlib.abc, os, signal, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == {module!r}:
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["jaxattn", *{argv!r}]
{start}
"""
MAIN = "from jaxattn.cli import main\nsys.exit(main())"
DASH_M = "import runpy\nrunpy.run_module('jaxattn', run_name='__main__', alter_sys=True)"
EXIT = """
import atexit, os, signal, sys
from jaxattn.cli import main
atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT) or sum(range(10**6)))
sys.argv = ["jaxattn", "list"]
sys.exit(main())
"""


def _status(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.parametrize("module, argv, start", [
    ("jaxattn.cli", ["list"], DASH_M),  # before `main`: `python -m jaxattn`
    ("jaxattn.cli.experiments", ["list"], MAIN),  # `main` loads the command
])
def test_ctrl_c_during_start_up_exits_130(module, argv, start):
    r = _status(IMPORT.format(module=module, argv=argv, start=start))
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    assert r.stderr.strip().splitlines()[-1].endswith("interrupted"), r.stderr[-3000:]


def test_ctrl_c_during_exit_exits_130():
    r = _status(EXIT)
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
