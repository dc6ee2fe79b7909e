"""Refusals found by trying the command line (issue 43): a loop too large for the
machine's memory, a folder still being written given to `animate`/`view`, an
output path that cannot be written, a number written with underscores, a resumed
loop with another `--chunk-passes`: each one line on stderr, exit status 2, before
any work."""

import json
import os

import numpy as np
import pytest
from _helpers import one_line

from jaxattn.cli import main
from jaxattn.experiments import runner

_RUNS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "figures")
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}
#: A loop of the tiny model (its config.json written by the test as CONFIG).
_TINY_LOOP = ["loop", "--model", "CONFIG", "--weights", "random", "--prompts", "1", "--tokens",
              "2", "--no-progress"]




def _track_folder(path):
    """A small run folder holding a token trajectory `ys (T, n, d)`."""
    path.mkdir()
    ys = np.random.default_rng(0).normal(size=(4, 3, 3))
    np.savez(path / "data.npz", ys=ys / np.linalg.norm(ys, axis=-1, keepdims=True))
    return path


# --- point 2: a loop too large for the machine is refused up front -------------------


def test_a_loop_too_large_for_memory_is_refused_before_any_work(tmp_path, capsys,
                                                                 monkeypatch):
    """The issue's command: 10¹⁰ random ids (80 GB of int64 alone) on a machine with
    less; refused naming the flags and the memory, and no folder is made."""
    prompts = tokens = 100_000
    memory = 8 * prompts * tokens // 4  # less than the ids alone
    monkeypatch.setattr(runner, "machine_memory", lambda: memory)
    out = tmp_path / "loop"
    line = one_line(capsys, ["loop", "--model", "gpt2", "--weights", "random", "--tokens",
                              str(tokens), "--prompts", str(prompts), "--out", str(out),
                              "--no-progress"])
    assert f"--prompts {prompts}" in line and f"--tokens {tokens}" in line, line
    assert "machine's memory" in line and f"{memory / 1e9:.3g} GB" in line, line
    assert "choose smaller values" in line
    assert not out.exists()


def test_a_loop_of_the_hidden_states_copies_too_large_is_refused(tmp_path, capsys,
                                                                 monkeypatch):
    """20,000 prompts of random GPT-2: one hidden state is 12 GB, and the loop holds
    four at its peak (the run was killed at 24 GB); refused on a 32 GB machine."""
    monkeypatch.setattr(runner, "machine_memory", lambda: 32 * 10**9)
    out = tmp_path / "loop"
    line = one_line(capsys, ["loop", "--model", "gpt2", "--weights", "random", "--prompts",
                              "20000", "--out", str(out), "--no-progress"])
    assert "--prompts 20000, --tokens 200: the run's arrays need at least 49.2 GB" in line, line
    assert not out.exists()


@pytest.mark.parametrize("flags, need", [
    (["--prompts", "2000", "--tokens", "8192"], "151 GB"),  # its hidden states
    (["--passes", "1000000000", "--prompts", "100", "--tokens", "10"], "12 TB"),  # its E
])
def test_a_packaged_model_is_sized_before_it_loads(tmp_path, capsys, monkeypatch, flags,
                                                   need):
    """A packaged model's sizes were not known before loading: a run of 151 GB started,
    then hung on its first chunk with an unfinished folder; its config now comes from
    the file (the .gguf's metadata), and the run is refused as a preset's is."""
    from _helpers import SMOLLM, needs_smollm

    if needs_smollm.args[0]:
        pytest.skip(needs_smollm.kwargs["reason"])
    monkeypatch.setattr(runner, "machine_memory", lambda: 32 * 10**9)
    out = tmp_path / "loop"
    line = one_line(capsys, ["loop", "--model", SMOLLM, *flags, "--out", str(out),
                              "--no-progress"])
    assert f"the run's arrays need at least {need}" in line, line
    assert not out.exists()


def test_a_loop_that_fits_is_not_refused_for_memory(tmp_path, capsys, monkeypatch):
    """The check counts the loop's arrays: a machine with room for them runs it."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    monkeypatch.setattr(runner, "machine_memory", lambda: 10**9)
    out = tmp_path / "loop"
    assert main(["loop", "--model", str(config), "--weights", "random", "--passes", "2",
                 "--prompts", "2", "--tokens", "4", "--out", str(out), "--no-progress"]) == 0
    assert (out / "summary.json").is_file()


# --- point 11: animate/view of a folder being written, a bad --out, 1_0, --chunk-passes


@pytest.mark.parametrize("command", [["animate"], ["view"]])
def test_a_folder_being_written_is_said_to_be(tmp_path, capsys, command):
    from jaxattn._artifacts import folders

    folder = tmp_path / "run"
    out = ["--out", str(tmp_path / ("movie.gif" if command == ["animate"] else "page.html"))]
    with folders.hold_folder(folder, "run"):
        folders.start_run(folder)
        line = one_line(capsys, [*command, str(folder), *out])
        assert line.endswith(f"{folder} is being written by a running jaxattn command "
                             f"(process {os.getpid()}); wait for it to end."), line
    line = one_line(capsys, [*command, str(folder), *out])  # released: interrupted
    assert "incomplete run" in line and "no data.npz" not in line, line


@pytest.mark.parametrize("command,name", [(["animate"], "x.gif"), (["view"], "x.html")])
def test_an_unwritable_out_names_the_users_path(tmp_path, capsys, command, name):
    folder = _track_folder(tmp_path / "run")
    target = os.path.join("/proc", name)
    line = one_line(capsys, [*command, str(folder), "--out", target, *(
        ["--frames", "2", "--no-progress"] if command == ["animate"] else [])])
    assert target in line, line
    assert "/proc/." not in line, line  # no temporary file of ours
    assert not [p for p in os.listdir(folder) if p.startswith(".")]


@pytest.mark.parametrize("argv", [
    ["run", "thm41-sphere", "--beta", "1_0"],
    ["run", "thm41-sphere", "--tokens", "1_0"],
    ["run", "thm41-sphere", "--seed", "1_0"],
    ["sweep", "thm41-sphere", "--grid", "beta=1,1_0"],
    ["demo", "--tokens", "1_0"],
    [*_TINY_LOOP, "--passes", "1_0"],
    [*_TINY_LOOP, "--save-states", "0,1_0"],
])
def test_numbers_with_underscores_are_refused(tmp_path, capsys, argv):
    """Python reads `1_0` as 10; a user who types it has made a typo."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    argv = [str(config) if word == "CONFIG" else word for word in argv]
    line = one_line(capsys, [*argv, "--out", str(tmp_path / "out")])
    assert "'1_0'" in line or "'0,1_0'" in line, line
    assert "underscore" in line, line
    assert not (tmp_path / "out").exists()


def test_an_empty_save_states_is_refused(tmp_path, capsys):
    """`--save-states ""` saved nothing, silently."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    argv = [str(config) if word == "CONFIG" else word for word in _TINY_LOOP]
    line = one_line(capsys, [*argv, "--save-states", "", "--out", str(tmp_path / "out")])
    assert "--save-states takes comma-separated depths" in line, line
    assert not (tmp_path / "out").exists()


def test_a_resumed_loop_with_another_chunk_passes_names_the_flag(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    out = tmp_path / "loop"
    argv = ["loop", "--model", str(config), "--weights", "random", "--passes", "2",
            "--prompts", "2", "--tokens", "4", "--out", str(out), "--no-progress"]
    assert main([*argv, "--chunk-passes", "1"]) == 0
    (out / "summary.json").unlink()
    (out / "INCOMPLETE").write_text("")  # as a killed loop leaves it
    capsys.readouterr()
    line = one_line(capsys, [*argv, "--chunk-passes", "2", "--resume"])
    assert "another --chunk-passes (1, not 2)" in line, line
    assert "--chunk-passes 1" in line.split("not 2")[1], line  # the fix: as it began
    assert "chunk_passes" not in line
    line = one_line(capsys, [*argv, "--chunk-passes", "1", "--no-ffn", "--resume"])
    assert "another --no-ffn (off, not on); resume it without --no-ffn" in line, line
    line = one_line(capsys, [*argv, "--chunk-passes", "1", "--save-states", "0,3",
                              "--resume"])
    assert "another --save-states (none, not 0,3); resume it without --save-states" in line


def test_the_step_budget_fix_names_only_the_commands_flags():
    """A run out of flow steps is told what to change in flags its experiment has
    (metastability has --max-steps and no --discrete; thm41-sphere both others)."""
    import re

    from jaxattn.cli import _step_budget_fix
    from jaxattn.experiments import EXPERIMENTS

    for name, experiment in EXPERIMENTS.items():
        flags = {p.flag for p in experiment.all_params()}
        named = set(re.findall(r"--[a-z][a-z-]*", _step_budget_fix(["run", name])))
        assert named <= flags, (name, named - flags)
    assert "--discrete" in _step_budget_fix(["run", "thm41-sphere"])
    assert "--discrete" not in _step_budget_fix(["run", "metastability"])
    assert _step_budget_fix(["demo"]) == "shorten the run"
