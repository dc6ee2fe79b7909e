"""`jaxattn plot DIR` redraws every kind of folder jaxattn writes (`run`, `loop`,
`loop --grid`, `sweep`) from its saved data, and refuses any other folder in one line;
`summary.json` holds numbers as numbers (NaN and ±inf as `null`, named in
`null_means`)."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import jaxattn as ja
from jaxattn._artifacts.folders import RunFolderError, finish_run, write_json
from jaxattn.cli import main
from jaxattn.experiments import EXPERIMENTS, run_loop
from jaxattn.experiments.runner import experiment_config, run_into_folder
from jaxattn.sweep import _report

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights

DATA = Path(__file__).parents[1] / "data" / "figures"
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}


def _redrawn(folder: Path, capsys, figures: list[str]) -> None:
    """`jaxattn plot folder` writes `figures` again (they are removed first)."""
    for name in figures:
        (folder / name).unlink()
    assert main(["plot", str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("redrew ")
    for name in figures:
        assert (folder / name).stat().st_size > 0 and name in out


def _one_line_error(capsys, folder) -> str:
    assert main(["plot", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err


def _saved_run(name: str, keys, folder: Path, **extra) -> Path:
    """A run folder written by the one writer (`run_into_folder`, as `jaxattn run` and
    `jaxattn loop --grid` write theirs) from a small saved run's data."""
    with np.load(DATA / name / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    saved = json.loads((DATA / name / "config.json").read_text())
    experiment = EXPERIMENTS[name]
    config = experiment_config(experiment, {k: saved[k] for k in keys}, saved["seed"])
    config |= {k: v for k, v in extra.items() if k in config}  # the rest is recorded
    return run_into_folder(experiment, config, command=None, simulate=lambda: data,
                           out=folder, log=None, record=extra)[0]


def test_plot_redraws_an_experiment_run(tmp_path, capsys):
    folder = _saved_run("thm41-sphere", ("tokens", "horizon", "saves", "tau", "discrete"),
                        tmp_path / "run")
    _redrawn(folder, capsys, ["thm41_sphere.png", "thm41_sphere.pdf"])


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    return path


def test_plot_redraws_a_loop(config_path, tmp_path, capsys):
    folder = run_loop(str(config_path), tmp_path / "loop", weights="random", passes=2,
                      prompts=2, tokens=5)
    capsys.readouterr()
    before = (folder / "loop.png").read_bytes()
    _redrawn(folder, capsys, ["loop.png", "loop.pdf"])
    assert (folder / "loop.png").read_bytes() == before  # the same figure, title included


def test_plot_redraws_a_loop_grid(tmp_path, capsys):
    """A `jaxattn loop --grid` folder (`run_loop_grid` writes it through
    `run_into_folder` as the `loop-grid` experiment, with the model's settings)."""
    folder = _saved_run("loop-grid", ("passes", "prompts", "tokens"), tmp_path / "grid",
                        model="tiny-gpt2.json", weights=["random", "resample"],
                        dtype="float32", precision="float32")
    _redrawn(folder, capsys, ["loop_grid.png", "loop_grid.pdf"])


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_plot_redraws_a_sweep(tmp_path, capsys):
    # the sizes of tests/sweep/test_sweep.py, whose compiled chunk this shares
    result = ja.sweep("thm41-sphere", {"beta": [1.0, 2.0]}, instances=3, chunk=3,
                      set={"horizon": 2.0, "saves": 20, "tokens": 6}, out=tmp_path / "sweep",
                      progress=False, log=lambda *_: None)
    before = (result.folder / "sweep.png").read_bytes()
    _redrawn(result.folder, capsys, ["sweep.png", "sweep.pdf"])
    assert (result.folder / "sweep.png").read_bytes() == before
    assert [p.name for p in ja.sweep.redraw(result.folder)] == ["sweep.png", "sweep.pdf"]
    assert [p.name for p in ja.sweep.redraw_sweep(result.folder)] == ["sweep.png", "sweep.pdf"]
    with pytest.raises(RunFolderError, match="has no config.json"):  # a sweep is no run
        ja.experiments.redraw(result.folder)
    assert ja.experiments.redraw is ja.experiments.redraw_run  # the older name


def test_plot_refuses_other_folders_in_one_line(tmp_path, capsys):
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("hello")
    assert "not a jaxattn folder" in _one_line_error(capsys, stray)
    other = tmp_path / "other"
    other.mkdir()
    write_json(other / "config.json", {"run_id": "x", "colour": "red"})
    write_json(other / "summary.json", {"run_id": "x"})
    np.savez(other / "data.npz", E=np.ones(3))
    assert "not made by `jaxattn run`, `jaxattn loop` or `jaxattn sweep`" in _one_line_error(
        capsys, other)
    sweep = tmp_path / "half-sweep"
    sweep.mkdir()
    write_json(sweep / "sweep.json", {"kind": "sweep", "run_id": "y"})
    (sweep / "INCOMPLETE").write_text("")
    assert "unfinished sweep" in _one_line_error(capsys, sweep)
    (sweep / "INCOMPLETE").unlink()
    assert "no summary.json" in _one_line_error(capsys, sweep)


# --- summary.json: numbers as numbers ------------------------------------------------


def test_non_finite_numbers_are_null_and_named(tmp_path):
    path = write_json(tmp_path / "s.json", {
        "numbers": {"rate": math.nan, "reach": math.inf, "final": 1e-3},
        "points": [{"low": -np.inf, "ok": np.float32(2.5)}], "array": np.array([1.0, np.nan])})
    text = path.read_text()
    assert "nan" not in text.lower() and "Infinity" not in text
    s = json.loads(text)
    assert s["numbers"] == {"rate": None, "reach": None, "final": 1e-3}
    assert s["points"] == [{"low": None, "ok": 2.5}] and s["array"] == [1.0, None]
    assert s["null_means"] == {"numbers.rate": "not a number", "numbers.reach": "+infinity",
                               "points[0].low": "-infinity", "array[1]": "not a number"}
    clean = json.loads(write_json(tmp_path / "c.json", {"a": 1.0}).read_text())
    assert "null_means" not in clean


def test_sweep_summary_matches_its_table(tmp_path):
    """A point where no instance reached consensus: `table.csv` says `inf` for each
    consensus time, and so do its quartiles (past T); `summary.json` has `null`
    statistics, named in `null_means`, and the printed table shows `>T`. A point whose
    every solve failed (NaN) measured nothing: a dash."""
    table = {"point": np.array([0, 0, 1, 1, 2, 2]), "beta": np.array([1.0, 1, 2, 2, 3, 3]),
             "consensus_time": np.array([np.inf, np.inf, 2.0, 3.0, np.nan, np.nan]),
             "final_E": np.array([0.1, 0.2, 1e-5, 1e-6, np.nan, np.nan]),
             "in_domain": np.ones(6, bool), "solver_success": np.r_[np.ones(4, bool), 0, 0],
             "status": np.array(["not_converged"] * 2 + ["held"] * 2 + ["solver_failed"] * 2,
                                object)}
    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0, 2.0, 3.0]}, instances=2)
    summary = _report.summarise(spec, [{"beta": 1.0}, {"beta": 2.0}, {"beta": 3.0}], ["beta"],
                                table)
    assert math.isinf(summary["points"][0]["consensus_time_median"])  # in memory: past T
    assert math.isnan(summary["points"][2]["consensus_time_median"])  # nothing measured
    finish_run(tmp_path, summary)
    text = (tmp_path / "summary.json").read_text()
    assert '"nan"' not in text.lower() and "NaN" not in text and "Infinity" not in text
    written = json.loads(text)
    first = written["points"][0]
    assert first["consensus_time_median"] is None and first["reached_consensus"] == 0
    assert written["points"][1]["consensus_time_median"] == 2.5
    nulls = {f"points[{i}].consensus_time_{q}" for i in (0, 2) for q in ("q25", "median", "q75")}
    assert nulls <= set(written["null_means"])
    assert written["null_means"]["points[0].consensus_time_median"] == "+infinity"
    rows = _report.format_table(written, ["beta"]).splitlines()[2:]
    assert ">T [>T, >T]" in rows[0] and "2.5 [2.25, 2.75]" in rows[1]
    assert "– [–, –]" in rows[2]
