"""Run folders are never overwritten and never mixed: a command refuses a folder
jaxattn did not write (a model's folder, the current directory), an empty --out, an
unfinished folder of another command or other settings, and a --resume of a folder
that holds no run; `variants` keeps its chunks inside its run folder; a refused
`sweep --devices` leaves no folder; `jaxattn plot` of a folder a live command holds
names that command."""

import json
import os

import pytest

from jaxattn._artifacts import folders as _runs
from jaxattn.cli import main
from jaxattn.experiments import run_experiment
from jaxattn.experiments import variants as study
from jaxattn.sweep import _driver as sweep_run

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 31,
             "n_positions": 16}
#: A variants study of two programs (both kernels), one mask, one β, 12 layers.
TINY = {"size": 1, "norm": 2, "kernel": 0, "mask": 1, "beta": 1.0, "instances": 2,
        "layers": 12, "tau": 0.5}
RUN = ["run", "thm41-sphere", "--no-progress", "--tokens", "3", "--horizon", "3",
       "--saves", "3"]


def _one_line(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxattn") and "error" in lines[0], err
    return lines[0]


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def model_folder(tmp_path):
    """A model's folder: its own config.json beside its weights."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_GPT2))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


@pytest.fixture
def no_compute(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("something was computed")

    monkeypatch.setattr(sweep_run, "simulate_chunk", never)
    monkeypatch.setattr(study, "simulate_chunk", never)


@pytest.mark.parametrize("command", ["run", "sweep", "loop"])
def test_a_folder_jaxattn_did_not_write_is_refused(model_folder, tmp_path, capsys, command):
    before = _files(model_folder)
    argv = {"run": RUN,
            "sweep": ["sweep", "thm41-sphere", "--grid", "beta=1", "--instances", "2",
                      "--set", "horizon=1", "--set", "tokens=3", "--no-progress"],
            "loop": ["loop", "--model", str(model_folder / "config.json"), "--weights",
                     "random", "--prompts", "1", "--tokens", "4", "--passes", "1",
                     "--no-progress"]}[command]
    line = _one_line(capsys, [*argv, "--out", str(model_folder)])
    assert f"{model_folder} holds files jaxattn did not write" in line
    assert _files(model_folder) == before
    if command == "run":
        _own_folders_are_taken_again(tmp_path)


def test_an_empty_out_is_refused_and_the_current_directory_untouched(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    for argv in (RUN, ["sweep", "thm41-sphere", "--instances", "2", "--no-progress"]):
        assert "--out is empty" in _one_line(capsys, [*argv, "--out", ""])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def _own_folders_are_taken_again(tmp_path):
    """An empty folder, a lock left by a killed command, a same-settings unfinished
    run (started over): jaxattn's own folders stay usable."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / _runs.LOCK).write_text("123\n")
    folder, _ = _runs.write_run("tiny", {"a": 1}, lambda: {"x": [1.0]}, lambda d, f: [],
                                lambda d, s: {"found": 1}, out=empty)
    assert (folder / "summary.json").exists()
    again = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt):
        _runs.write_run("tiny", {"a": 1}, _interrupt, lambda d, f: [], lambda d, s: {},
                        out=again)
    _runs.write_run("tiny", {"a": 1}, lambda: {"x": [1.0]}, lambda d, f: [],
                    lambda d, s: {"found": 1}, out=again)
    assert not (again / _runs.INCOMPLETE).exists()


def _interrupt():
    raise KeyboardInterrupt


def _killed_variants(out, monkeypatch):
    """A `variants` run killed after its first chunk was saved."""
    real = study.simulate_chunk
    calls = []

    def interrupted(config, grid, program):
        if calls:
            raise KeyboardInterrupt
        calls.append(program)
        return real(config, grid, program)

    monkeypatch.setattr(study, "simulate_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("variants", TINY, seed=3, out=out, progress=False, log=None)
    monkeypatch.setattr(study, "simulate_chunk", real)


def test_an_unfinished_folder_of_another_run_or_settings_is_refused(tmp_path, capsys,
                                                                    monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "killed"
    _killed_variants(out, monkeypatch)
    # the chunks live in the run folder, not under ./runs/.chunks
    assert len(list((out / "chunks").glob("*.npz"))) == 1
    assert not any(cwd.iterdir())
    before = _files(out)

    def never(*args, **kwargs):
        raise AssertionError("a chunk was computed")

    monkeypatch.setattr(study, "simulate_chunk", never)
    line = _one_line(capsys, [*RUN, "--out", str(out)])
    assert "holds an unfinished run with another experiment" in line
    assert "pass --resume" in _one_line(capsys, ["run", "variants", "--out", str(out),
                                                 "--seed", "3", "--no-progress",
                                                 *_flags(TINY)])
    other = _flags(TINY | {"layers": 13})
    line = _one_line(capsys, ["run", "variants", "--out", str(out), "--seed", "3",
                              "--no-progress", "--resume", *other])
    assert "another layers (12, not 13)" in line
    assert _files(out) == before


def _flags(config) -> list[str]:
    return [part for key, value in config.items() for part in (f"--{key}", str(value))]


def test_resume_from_another_directory_reuses_the_folders_chunks(tmp_path, monkeypatch):
    out = tmp_path / "killed"
    _killed_variants(out, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    real, calls = study.simulate_chunk, []

    def counted(config, grid, program):
        calls.append(program)
        return real(config, grid, program)

    monkeypatch.setattr(study, "simulate_chunk", counted)
    folder, _ = run_experiment("variants", TINY | {"resume": True}, seed=3, out=out,
                               progress=False, log=None)
    assert len(calls) == 1  # the chunk saved before the kill was not computed again
    assert not (folder / "chunks").exists() and not (folder / _runs.INCOMPLETE).exists()
    assert not any(elsewhere.iterdir())


@pytest.mark.parametrize("command", ["run", "sweep", "loop"])
def test_resume_of_a_missing_folder_says_so(tmp_path, capsys, no_compute, command):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT2))
    out = tmp_path / "a" / "missing"
    argv = {"run": ["run", "variants", "--no-progress", "--resume", *_flags(TINY)],
            "sweep": ["sweep", "thm41-sphere", "--instances", "2", "--no-progress",
                      "--resume"],
            "loop": ["loop", "--model", str(config), "--weights", "random", "--prompts", "1",
                     "--tokens", "4", "--passes", "1", "--no-progress", "--resume"]}[command]
    line = _one_line(capsys, [*argv, "--out", str(out)])
    assert f"{out} holds no" in line and "to resume" in line
    assert not (tmp_path / "a").exists()


def test_sweep_with_too_many_devices_leaves_no_folder(tmp_path, capsys, no_compute):
    out = tmp_path / "a" / "sweep"
    line = _one_line(capsys, ["sweep", "thm41-sphere", "--instances", "2", "--devices", "99",
                              "--out", str(out), "--no-progress"])
    assert "devices=99" in line
    assert not (tmp_path / "a").exists()


def test_plot_of_a_held_folder_names_its_holder(tmp_path, capsys):
    out = tmp_path / "run"
    with _runs.hold_folder(out, "run"):
        _runs.start_run(out)
        line = _one_line(capsys, ["plot", str(out)])
    assert line.endswith(f"{out} is being written by a running jaxattn command (process "
                         f"{os.getpid()}); wait for it to end.")
    assert "incomplete" in _one_line(capsys, ["plot", str(out)])  # released: interrupted


def test_no_command_writes_into_a_folder_a_run_is_writing(tmp_path, capsys):
    """`animate`, `view` and `demo` wrote their files into a running run's folder,
    which then listed them as its own."""
    import shutil
    from pathlib import Path

    done = tmp_path / "done"
    shutil.copytree(Path(__file__).parents[1] / "data" / "figures" / "thm41-sphere", done)
    held = tmp_path / "held"
    with _runs.hold_folder(held, "run"):
        _runs.start_run(held)
        before = _files(held)
        for argv in (["animate", str(done), "--out", str(held / "x.gif")],
                     ["view", str(done), "--out", str(held / "x.html")],
                     ["demo", "--out", str(held)]):
            assert _one_line(capsys, argv).endswith(
                f"{held} is in use by another jaxattn command (process {os.getpid()}); wait "
                "for it to end or choose another --out."), argv
        assert _files(held) == before
    figure = tmp_path / "d" / "demo_sphere.png"
    figure.mkdir(parents=True)  # the demo ran, then failed naming a temporary file
    assert "is a folder, where the demo writes its figure" in _one_line(
        capsys, ["demo", "--out", str(tmp_path / "d")])


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_an_unfinished_run_that_saved_nothing_starts_over_with_new_settings(tmp_path):
    """A run stopped by its step budget left config.json and INCOMPLETE, and the
    shorter --horizon its message asked for was refused: "another horizon"."""
    out = tmp_path / "run"
    assert main([*RUN, "--out", str(out)]) == 0
    for p in out.iterdir():
        if p.name != "config.json":
            p.unlink()
    (out / "INCOMPLETE").touch()
    longer = list(RUN)
    longer[RUN.index("--horizon") + 1] = "4"
    assert main([*longer, "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["horizon"] == 4.0


@pytest.mark.parametrize("kind", ["file", "broken link"])
def test_an_out_that_is_a_file_says_so(tmp_path, capsys, kind):
    """It said "cannot write the run folder …: File exists"."""
    out = tmp_path / "f.json"
    out.write_text("{}") if kind == "file" else out.symlink_to(tmp_path / "nowhere")
    for argv in (RUN, ["sweep", "thm41-sphere", "--grid", "beta=1"]):
        assert "is a file" in _one_line(capsys, [*argv, "--out", str(out)]).split(": error: ")[1]


@pytest.mark.parametrize("text", ["[1, 2]", "not json"])
def test_a_damaged_settings_file_is_one_line(tmp_path, capsys, text):
    """An interrupted folder whose config.json is damaged: a traceback ('list' has no
    `get`), or "Expecting value: line 1 column 1" naming no file."""
    out = tmp_path / "g"
    out.mkdir()
    (out / "INCOMPLETE").touch()
    (out / "config.json").write_text(text)
    (out / "data.npz").write_bytes(b"")  # something saved (else it would start over)
    assert _one_line(capsys, [*RUN, "--out", str(out)]).endswith(
        f"{out / 'config.json'} is not a settings file jaxattn can read (damaged?): choose "
        "another --out.")


def test_an_out_inside_another_runs_folder_is_refused(tmp_path, capsys):
    """A run or sweep writes no folder inside another command's results: a finished
    run's folder got a `child/` (so did a live, locked one)."""
    parent = tmp_path / "parent"
    assert main([*RUN, "--out", str(parent)]) == 0
    before = _files(parent)
    for argv in (RUN, ["sweep", "thm41-sphere", "--grid", "beta=1", "--instances", "2",
                       "--set", "horizon=1", "--no-progress"]):
        line = _one_line(capsys, [*argv, "--out", str(parent / "child" / "deeper")])
        assert f"is inside the folder of another command's results ({parent})" in line
    assert _files(parent) == before and not (parent / "child").exists()


def test_a_damaged_data_file_is_one_line(tmp_path, capsys):
    """A `data.npz` cut short, or another experiment's, was a BadZipFile or KeyError
    traceback from `plot`, `view` and `animate`."""
    import shutil
    from pathlib import Path

    run = tmp_path / "run"
    assert main([*RUN, "--out", str(run)]) == 0
    cut = tmp_path / "cut"
    shutil.copytree(run, cut)
    (cut / "data.npz").write_bytes((run / "data.npz").read_bytes()[:3000])
    for argv in (["plot", str(cut)], ["view", str(cut), "--out", str(tmp_path / "p.html")],
                 ["animate", str(cut), "--out", str(tmp_path / "m.gif")]):
        assert "data.npz is damaged or not a jaxattn data file" in _one_line(capsys, argv)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    shutil.copy(Path(__file__).parents[1] / "data" / "figures" / "thm52-symmetric" /
                "data.npz", other / "data.npz")
    assert "it is not this run's data" in _one_line(capsys, ["plot", str(other)])


def test_a_finished_resumable_run_is_not_advised_to_resume(tmp_path, capsys):
    """A finished variants study run again into its folder: nothing is left to
    continue, so the refusal no longer says "pass --resume to continue it"."""
    argv = ["run", "variants", "--no-progress", "--out", str(tmp_path / "v"),
            *[w for k, v in TINY.items() for w in (f"--{k}", str(v))]]
    assert main(argv) == 0
    line = _one_line(capsys, argv)
    assert line.endswith("holds a finished run; choose another --out."), line
