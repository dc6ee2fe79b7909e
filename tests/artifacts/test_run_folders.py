"""Run folders that cannot be mixed (issue 14, points 9–12): one command at a time
holds a folder (two real processes), a folder of one kind of command is refused by
the other, `jaxattn plot` refuses a folder mixed from two runs, refused arguments
leave no folder behind, a read-only sweep folder fails before computing, and files
get the user's normal permissions."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from jaxattn._artifacts import folders as _runs
from jaxattn.cli import main
from jaxattn.sweep import _driver as sweep_run

ENV = os.environ | {"MPLBACKEND": "Agg"}
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 31,
             "n_positions": 16}


def _one_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxattn") and "error" in lines[0], err
    return lines[0]


# `python -m jaxattn` with Ctrl-C raising KeyboardInterrupt: a process started in
# the background inherits SIGINT ignored, where a user's shell would deliver it.
_WITH_SIGINT = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
                "signal.default_int_handler); sys.argv[0] = 'jaxattn'; "
                "runpy.run_module('jaxattn', run_name='__main__')")


def _jaxattn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WITH_SIGINT, *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} not written within {seconds} s"
        time.sleep(0.02)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_a_second_command_into_the_same_folder_fails_at_once(tmp_path):
    """A long `jaxattn run` holds its folder; a second `jaxattn run --out SAME` (another
    real process) is refused in one line while the first goes on, and leaves the
    first's files alone."""
    out = tmp_path / "run"
    first = _jaxattn("run", "thm41-sphere", "--out", str(out), "--no-progress", "--tokens", "5",
                     "--discrete", "--tau", "1e-6", "--horizon", "10", "--saves", "10")
    try:
        _wait_for(out / "config.json", first)
        config = (out / "config.json").read_bytes()
        second = _jaxattn("run", "thm41-sphere", "--out", str(out), "--no-progress")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert err.strip().splitlines() == [
            f"jaxattn run: error: {out} is in use by another jaxattn command (process "
            f"{first.pid}); wait for it to end or choose another --out."]
        assert first.poll() is None, "the first run ended before the second was refused"
        assert (out / "config.json").read_bytes() == config
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # a lock left by a killed command is not held: the folder can be taken again
    with _runs.hold_folder(out, "run"):
        assert (out / _runs.LOCK).read_text().strip() == str(os.getpid())
    assert not (out / _runs.LOCK).exists()


def test_hold_folder_refuses_a_held_folder_in_the_same_process(tmp_path):
    with _runs.hold_folder(tmp_path / "f", "run"):
        with pytest.raises(_runs.RunFolderError, match="in use by another jaxattn command"):
            with _runs.hold_folder(tmp_path / "f", "run"):
                pass
    with _runs.hold_folder(tmp_path / "f", "run"):  # released: free again
        pass


def _sweep_folder(folder):
    folder.mkdir()
    spec = {"experiment": "thm41-sphere", "grid": {"beta": [1.0]}}
    (folder / "sweep.json").write_text(json.dumps({"spec": spec, "kind": "sweep"}))
    (folder / "INCOMPLETE").write_text("")


def test_run_refuses_a_sweep_folder_and_sweep_a_run_folder(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _sweep_folder(sweep)
    before = sorted(p.name for p in sweep.iterdir())
    line = _one_line(capsys, ["run", "thm41-sphere", "--out", str(sweep), "--no-progress"])
    assert "holds a `jaxattn sweep` folder" in line
    assert sorted(p.name for p in sweep.iterdir()) == before  # the sweep stays resumable

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"experiment": "thm41-sphere"}))
    (run / "INCOMPLETE").write_text("")
    for extra in ([], ["--resume"]):
        line = _one_line(capsys, ["sweep", "thm41-sphere", "--instances", "2", "--out", str(run),
                                  "--no-progress", *extra])
        assert "holds a `jaxattn run` folder" in line
    assert sorted(p.name for p in run.iterdir()) == ["INCOMPLETE", "config.json"]


def _write_tiny_run(folder):
    return _runs.write_run("tiny", {"a": 1}, lambda: {"x": [1.0, 2.0]}, lambda data, f: [],
                           lambda data, seconds: {"found": 1}, out=folder)


def test_config_and_summary_carry_the_same_run_id_and_plot_refuses_a_mix(tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"
    _, summary = _write_tiny_run(one)
    _write_tiny_run(two)
    config = json.loads((one / "config.json").read_text())
    assert len(config["run_id"]) == 32 and summary["run_id"] == config["run_id"]
    assert config["kind"] == "run" and config["backend"] == jax.default_backend()
    assert isinstance(config["deterministic"], bool)
    assert _runs.open_run_folder(one) == one
    # the folder of issue 14: config.json from one run, summary.json from another
    (one / "summary.json").write_bytes((two / "summary.json").read_bytes())
    assert "mixes two runs" in _one_line(capsys, ["plot", str(one)])


# just under the 2**52 the run refuses before it starts (test_run_bounds)
_SLOW_SOLVER = ["--horizon", "4e15", "--tokens", "3", "--saves", "5"]


@pytest.mark.parametrize("argv, message", [
    (["run", "thm41-sphere", "--seed", "99999999999999999999"], "`--seed` must be at most"),
    (["run", "thm41-sphere", "--tau", "1e-300", "--discrete"], "layers, more than"),
    (["run", "thm51-causal", "--tokens", "3", "--dim", "2"], "--tokens (3) must be ≤ --dim (2)"),
    (["loop", "--model", "CONFIG", "--weights", "random", "--tokens", "5000", "--prompts", "1",
      "--passes", "1"], "5000 tokens exceed the model's 16 learned positions"),
    (["sweep", "thm41-sphere", "--seed", "99999999999999999999"], "`--seed` must be at most"),
], ids=["seed", "tau", "thm51-tokens", "loop-tokens", "sweep-seed"])
def test_refused_arguments_leave_no_folder(tmp_path, capsys, argv, message):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    out = tmp_path / "a" / "run"
    argv = [str(config) if a == "CONFIG" else a for a in argv] + ["--out", str(out)]
    if argv[0] == "run":
        argv.append("--no-progress")
    assert message in _one_line(capsys, argv)
    assert not (tmp_path / "a").exists()


def test_a_loop_past_the_positions_is_refused_before_the_weights(tmp_path, capsys,
                                                                  monkeypatch):
    """A preset's sizes are known without its weights: drawing GPT-2's took 8 s."""
    from jaxattn.experiments import loop_grid
    monkeypatch.setattr(loop_grid, "get_model", lambda *a: pytest.fail("weights drawn"))
    line = _one_line(capsys, ["loop", "--model", "gpt2", "--weights", "random", "--tokens",
                              "1025", "--prompts", "1", "--out", str(tmp_path / "r")])
    assert "1025 tokens exceed the model's 1024 learned positions" in line
    assert not (tmp_path / "r").exists()


def test_a_horizon_the_solver_cannot_reach_is_one_line(tmp_path, capsys):
    """The flow's step budget runs out (it is no argument check: the folder stays,
    marked INCOMPLETE, as for any failed run)."""
    out = tmp_path / "run"
    line = _one_line(capsys, ["run", "thm41-sphere", "--out", str(out), "--no-progress",
                              *_SLOW_SOLVER])
    assert "step budget" in line and "--horizon" in line
    assert (out / "INCOMPLETE").exists() and not (out / "summary.json").exists()


def test_resume_into_a_read_only_folder_fails_before_computing(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "s"
    _sweep_folder(folder)
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes anyway: answer as the kernel answers a user
        real = os.access
        monkeypatch.setattr(_runs.os, "access", lambda p, mode, **kw: (
            False if str(p) == str(folder) and mode & os.W_OK else real(p, mode, **kw)))

    def never(*args, **kwargs):
        raise AssertionError("a chunk was computed")

    monkeypatch.setattr(sweep_run, "simulate_chunk", never)
    try:
        line = _one_line(capsys, ["sweep", "thm41-sphere", "--grid", "beta=1", "--instances",
                                  "2", "--out", str(folder), "--resume", "--no-progress"])
    finally:
        folder.chmod(0o755)
    assert line == f"jaxattn sweep: error: cannot write the run folder {folder}: permission denied."


def test_files_get_the_users_normal_permissions(tmp_path):
    old = os.umask(0o027)
    try:
        path = _runs.write_json(tmp_path / "x.json", {"a": 1})
        _, _ = _write_tiny_run(tmp_path / "run")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
    for name in ("config.json", "data.npz", "summary.json"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o640, name


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_sigint_leaves_the_folder_incomplete_and_exits_130(tmp_path):
    """Ctrl-C during a run: exit status 130, one line, the folder marked INCOMPLETE and
    its lock released."""
    out = tmp_path / "run"
    proc = _jaxattn("run", "thm41-sphere", "--out", str(out), "--no-progress", "--tokens", "5",
                    "--discrete", "--tau", "1e-6", "--horizon", "10", "--saves", "10")
    _wait_for(out / "config.json", proc)
    time.sleep(1.0)  # inside the computation
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "jaxattn run: interrupted"
    assert (out / "INCOMPLETE").exists() and not (out / "summary.json").exists()
    assert not (out / _runs.LOCK).exists()


def test_matplotlib_is_imported_beside_the_simulation(tmp_path):
    """`write_run` imports matplotlib on another thread while `compute` runs, and the
    figures start only once it is done (a new process: matplotlib not imported yet)."""
    script = f"""
import sys, threading
from jaxattn._artifacts import folders

def compute():
    assert "matplotlib" not in sys.modules or any(
        t.name == "jaxattn-matplotlib" for t in threading.enumerate())
    return {{}}

def draw(data, folder):
    import matplotlib
    assert "matplotlib.backends.backend_pdf" in sys.modules
    assert matplotlib.get_backend().lower() == "agg"
    assert not any(t.name == "jaxattn-matplotlib" for t in threading.enumerate())
    return []

folders.write_run("ahead", {{}}, compute, draw, lambda data, s: {{}}, out={str(tmp_path / "run")!r})
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
