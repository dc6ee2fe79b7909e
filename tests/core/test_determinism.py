"""Determinism on accelerators (issue 13): the `jaxattn` commands that compute put
XLA's deterministic GPU flags into `XLA_FLAGS` before JAX's backend starts (appended
to the user's, unless opted out), and every run folder records whether they were in
force and on which backend it ran. Checked on the CPU: the mechanism, not the GPU
result (docs/determinism.md)."""

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxattn._artifacts import folders
from jaxattn._process import determinism as _determinism
from jaxattn.cli import COMPUTING, parser

DETERMINISTIC = "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"


def test_flags_are_appended_to_the_users():
    assert _determinism.deterministic_xla_flags("") == DETERMINISTIC
    assert _determinism.deterministic_xla_flags("--xla_dump_to=/tmp/d") == (
        "--xla_dump_to=/tmp/d " + DETERMINISTIC)
    # a flag the user gave keeps its value; appending twice adds nothing
    assert _determinism.deterministic_xla_flags("--xla_gpu_autotune_level=2") == (
        "--xla_gpu_autotune_level=2 --xla_gpu_deterministic_ops=true")
    twice = _determinism.deterministic_xla_flags(_determinism.deterministic_xla_flags(""))
    assert twice == DETERMINISTIC


def test_flags_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert _determinism.deterministic_xla_flags() == (
        "--xla_force_host_platform_device_count=2 " + DETERMINISTIC)
    monkeypatch.delenv("XLA_FLAGS")
    assert _determinism.deterministic_xla_flags() == DETERMINISTIC


@pytest.mark.parametrize("flags, expected", [
    ("", False),
    (DETERMINISTIC, True),
    ("--xla_gpu_deterministic_ops", True),
    ("--xla_gpu_deterministic_ops=1", True),
    ("--xla_gpu_deterministic_ops=false", False),
    ("--xla_gpu_deterministic_ops=true --xla_gpu_deterministic_ops=false", False),
    ("--xla_gpu_exclude_nondeterministic_ops=true", False),
])
def test_is_deterministic_reads_the_last_value(flags, expected):
    assert _determinism.is_deterministic(flags) is expected


def test_use_deterministic_xla_and_its_opt_outs(monkeypatch):
    monkeypatch.setattr(_determinism, "_backend_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d")
    monkeypatch.delenv(_determinism.OPT_OUT, raising=False)
    assert _determinism.use_deterministic_xla(False) is False
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    monkeypatch.setenv(_determinism.OPT_OUT, "1")
    assert _determinism.use_deterministic_xla() is False
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d"
    monkeypatch.setenv(_determinism.OPT_OUT, "0")
    assert _determinism.use_deterministic_xla() is True
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/d " + DETERMINISTIC
    # too late once the backend runs: nothing changes, and the answer says so
    monkeypatch.setattr(_determinism, "_backend_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert _determinism.use_deterministic_xla() is False and os.environ["XLA_FLAGS"] == ""


def test_the_computing_commands_and_the_global_opt_out():
    commands = parser()._subparsers._group_actions[0].choices
    assert set(COMPUTING) <= set(commands)
    assert parser().parse_args(["--nondeterministic", "list"]).nondeterministic
    assert not parser().parse_args(["list"]).nondeterministic


_PROBE = r"""
import json, os, sys
from jax._src import xla_bridge
import jaxattn.cli as cli
import jaxattn._process.determinism as runs
from jaxattn.experiments import EXPERIMENTS

seen = {}
original = runs.use_deterministic_xla

def spy(enable=True):
    seen["started_before"] = xla_bridge.backends_are_initialized()
    seen["result"] = original(enable)
    seen["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    return seen["result"]

def stop(config, progress):  # config.json is written: the rest is not under test
    raise KeyboardInterrupt

runs.use_deterministic_xla = spy
cli.use_deterministic_xla = spy
EXPERIMENTS["thm41-sphere"].simulate = stop
code = cli.main(sys.argv[1:])
print(json.dumps(seen))
sys.exit(code)
"""


def _run(tmp_path, *global_flags, env=None):
    out = tmp_path / "run"
    argv = [*global_flags, "run", "thm41-sphere", "--out", str(out), "--no-progress",
            "--tokens", "3", "--horizon", "1", "--saves", "4"]
    r = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                       timeout=300, env=os.environ | {"MPLBACKEND": "Agg", "XLA_FLAGS":
                                                      "--xla_force_host_platform_device_count=1",
                                         # the flags exactly as given: none of the suite's
                                         "JAXATTN_TEST_XLA_FLAGS": ""}
                       | (env or {}))
    assert r.returncode == 130, r.stderr[-2000:]  # stopped once config.json is written
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    return seen, json.loads((out / "config.json").read_text())


def test_jaxattn_run_sets_the_flags_before_the_backend_starts(tmp_path):
    """A real `jaxattn run` process: the flags are appended to the user's XLA_FLAGS
    before the backend has started, and config.json records it."""
    seen, config = _run(tmp_path)
    assert seen == {"started_before": False, "result": True,
                    "XLA_FLAGS": "--xla_force_host_platform_device_count=1 " + DETERMINISTIC}
    assert config["deterministic"] is True and config["backend"] == jax.default_backend()


def test_the_opt_out_is_recorded(tmp_path):
    """`jaxattn --nondeterministic run …` leaves XLA_FLAGS alone and records it (the
    environment's opt-out is the same switch: `test_use_deterministic_xla_…`)."""
    seen, config = _run(tmp_path, "--nondeterministic")
    assert seen["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
    assert seen["result"] is False and seen["started_before"] is False
    assert config["deterministic"] is False and config["backend"] == jax.default_backend()


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_sweep_json_records_the_backend_and_refuses_a_resume_computed_otherwise(tmp_path,
                                                                                monkeypatch):
    """A sweep records how it computes; resuming it on another backend, or on a GPU
    with the other determinism setting, would mix two kinds of chunks: refused."""
    import jaxattn as ja

    small = {"horizon": 0.5, "saves": 4, "tokens": 3}
    result = ja.sweep("thm41-sphere", {"beta": [1.0]}, instances=2, set=small,
                      out=tmp_path / "s", progress=False, log=lambda *_: None)
    sidecar = json.loads((result.folder / "sweep.json").read_text())
    assert sidecar["backend"] == jax.default_backend() and sidecar["kind"] == "sweep"
    assert sidecar["run_id"] == result.summary["run_id"]
    assert isinstance(sidecar["deterministic"], bool)

    folder = result.folder
    (folder / "INCOMPLETE").write_text("")  # as if killed before its end
    for recorded, now, message in [
        ({"backend": "gpu"}, {"backend": "cpu", "deterministic": True}, "computed on gpu"),
        ({"backend": "gpu", "deterministic": True}, {"backend": "gpu", "deterministic": False},
         "with XLA's deterministic GPU flags"),
        ({"backend": "gpu", "deterministic": False}, {"backend": "gpu", "deterministic": True},
         "jaxattn --nondeterministic sweep --resume"),
    ]:
        (folder / "sweep.json").write_text(json.dumps(sidecar | recorded))
        monkeypatch.setattr(folders, "computed_on", lambda now=now: now)
        with pytest.raises(folders.RunFolderError, match=message):
            ja.sweep("thm41-sphere", {"beta": [1.0]}, instances=2, set=small, out=folder,
                     resume=True, progress=False, log=lambda *_: None)
