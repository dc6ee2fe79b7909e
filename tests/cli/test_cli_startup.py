"""The command line answers `jaxattn --help` and `jaxattn list` without loading JAX,
and `import jaxattn` loads nothing until a name is used (PEP 562). Structural
tests (which modules get imported), not timings; the light tables they rely on
(`cli.COMMANDS`, `experiments.REGISTRY`) are checked against what they stand for."""

import gc
import os
import subprocess
import sys

import pytest

import jaxattn as ja
from jaxattn import cli
from jaxattn._process import determinism as _determinism
from jaxattn.experiments import EXPERIMENTS, REGISTRY, get_experiment

_PROBE = """
import sys
from jaxattn.cli import main
try:
    code = main({argv!r})
except SystemExit as e:  # --help
    code = e.code
heavy = sorted(m for m in ("jax", "equinox", "diffrax", "matplotlib") if m in sys.modules)
print("LOADED:", ",".join(heavy) or "-", "CODE:", code)
"""


def _run_cli(argv: list[str]) -> tuple[str, str]:
    """`jaxattn ARGV` in a fresh Python: its output and the heavy modules it loaded."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-3000:]
    body, _, probe = out.stdout.rpartition("LOADED:")
    loaded, _, code = probe.partition("CODE:")
    assert code.strip() in ("0", "None"), out.stdout[-2000:] + out.stderr[-2000:]
    return body, loaded.strip()


def test_help_does_not_import_jax():
    body, loaded = _run_cli(["--help"])
    assert loaded == "-"
    for name in cli.COMMANDS:
        assert f"    {name} " in body


def test_list_does_not_import_jax():
    body, loaded = _run_cli(["list"])
    assert loaded == "-"
    for name in REGISTRY:
        assert name in body


def test_cache_does_not_import_jax(tmp_path):
    """`jaxattn cache` reads the folder: no JAX, and no folder made."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(argv=["cache"])],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAXATTN_CACHE_DIR=str(tmp_path / "c")))
    assert out.stdout.startswith(f"compilation cache: {tmp_path / 'c'}, 0 entries, ")
    assert "LOADED: - CODE: 0" in out.stdout, out.stdout + out.stderr[-2000:]
    assert not (tmp_path / "c").exists()


def test_only_the_program_spaces_out_full_collections():
    """The `jaxattn` program runs a full collection per 100 younger ones (BENCHMARKS.md,
    "The collector at start-up"); `main(argv)` called in a process leaves its collector
    as it was."""
    before = gc.get_threshold()
    assert cli.main(["list"]) == 0
    assert gc.get_threshold() == before
    code = ("import atexit, gc, sys; from jaxattn.cli import main; "
            "atexit.register(lambda: print('GC', gc.get_threshold())); "
            "sys.argv = ['jaxattn', 'list']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == f"GC {(before[0], before[1], 100)}"


def test_import_jaxattn_is_lazy():
    code = "import sys, jaxattn, jaxattn.experiments; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_every_public_name_resolves():
    for name in ja.__all__:
        assert getattr(ja, name) is not None, name
    assert set(ja.__all__) <= set(dir(ja))
    # The lazy face's own machinery is private: `ja.load` would read as a model loader.
    assert not {"load", "lazy_names"} & (set(dir(ja)) | set(dir(ja.experiments)))
    assert ja.solve_flow.__doc__ == ja._flow.solve_flow.__doc__
    with pytest.raises(AttributeError, match="no attribute 'solve_flows'"):
        ja.solve_flows  # noqa: B018


def test_the_light_command_table_is_the_parser():
    """`COMMANDS` (read without importing the commands) says what their modules do."""
    full = cli.parser()._subparsers._group_actions[0]
    helps = {a.dest: a.help for a in full._choices_actions}
    assert list(full.choices) == list(cli.COMMANDS)
    for name, (module, help_line) in cli.COMMANDS.items():
        assert helps[name] == help_line, name
        assert full.choices[name].get_default("func").__module__ == f"jaxattn.cli.{module}"
    assert cli.OPT_OUT is _determinism.OPT_OUT  # one definition, read without JAX


def test_a_named_command_imports_only_its_module(monkeypatch):
    registered = []
    real = cli.importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module",
                        lambda name: registered.append(name) or real(name))
    p = cli.parser(["run"])
    assert registered == ["jaxattn.cli.experiments"]
    assert p.parse_args(["plot", "somewhere"]).folder == "somewhere"  # its siblings too
    assert p.parse_args(["bench"]).func is None  # the others: their help line only


def test_the_registry_describes_each_experiment():
    assert list(EXPERIMENTS) == list(REGISTRY)
    assert "nothing-such" not in EXPERIMENTS
    for name, entry in REGISTRY.items():
        exp = EXPERIMENTS[name]
        assert (exp.name, exp.theorem, exp.title) == (name, entry.theorem, entry.title)
        assert type(exp).__name__ == entry.cls
        assert type(exp).__module__ == f"jaxattn.experiments.{entry.module}"
        assert get_experiment(name) is exp  # one object: monkeypatching it works
    with pytest.raises(ValueError, match="unknown experiment 'nope'; the experiments are"):
        get_experiment("nope")
