"""`jaxattn list | run | plot` through `jaxattn.cli.main`, at reduced size, and
its answers to bad input."""

import dataclasses
import json

import pytest

from jaxattn.cli import main
from jaxattn.experiments import get_experiment

SMALL = {
    "thm41-sphere": ["--tokens", "5", "--horizon", "8", "--saves", "40", "--tau", "0.05"],
    "thm51-causal": ["--tokens", "6", "--dim", "12", "--samples", "5", "--horizon", "14",
                     "--saves", "40", "--tau", "0.2"],
    "thm52-symmetric": ["--tokens", "4", "--horizon", "20", "--saves", "40", "--tau", "0.1"],
    "thm32-gradient": ["--tokens", "4", "--horizon", "60", "--saves", "60", "--tau", "0.1"],
}


def test_a_run_against_the_prediction_says_so_and_exits_3(tmp_path, capsys, monkeypatch):
    experiment = get_experiment("thm41-sphere")
    judged = type(experiment).verdict
    monkeypatch.setattr(type(experiment), "verdict", lambda self, config, data: dataclasses.replace(
        judged(self, config, data), ok=False))
    out = tmp_path / "run"
    assert main(["run", "thm41-sphere", "--out", str(out), "--no-progress",
                 *SMALL["thm41-sphere"]]) == 3
    assert "verdict (against the prediction: exit status 3): " in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["agrees_with_theory"] is False


def test_a_run_too_noisy_to_judge_says_what_decides_it_and_exits_4(tmp_path, capsys,
                                                                   monkeypatch):
    """Errors larger than the tolerance they are judged by neither agree nor contradict:
    such a run exited 3, "against the prediction"; now 4, naming what would decide it."""
    experiment = get_experiment("thm41-sphere")
    judged = type(experiment).verdict
    monkeypatch.setattr(type(experiment), "verdict", lambda self, config, data: dataclasses.replace(
        judged(self, config, data), ok=False, undecided="raise --samples"))
    out = tmp_path / "run"
    assert main(["run", "thm41-sphere", "--out", str(out), "--no-progress",
                 *SMALL["thm41-sphere"]]) == 4
    assert "verdict (undecided, raise --samples: exit status 4): " in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agrees_with_theory"] is None and summary["undecided"] == "raise --samples"


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err, err
    return err


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in SMALL:
        assert name in out


@pytest.mark.slow  # warm: over ~3 s each (make test stays the fast loop)
@pytest.mark.parametrize("name", SMALL)
def test_run_reduced_size_then_redraw(tmp_path, capsys, name):
    out = tmp_path / "run"
    assert main(["run", name, "--out", str(out), "--seed", "3", "--discrete", "--no-progress",
                 *SMALL[name]]) == 0
    printed = capsys.readouterr().out
    assert "verdict:" in printed and "predicts" in printed
    stem = name.replace("-", "_")
    for f in ("config.json", "data.npz", "summary.json", f"{stem}.png", f"{stem}.pdf"):
        assert (out / f).stat().st_size > 0
    assert not (out / "INCOMPLETE").exists()
    config = json.loads((out / "config.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert config["seed"] == 3 and config["discrete"] and "jax" in config["versions"]
    assert config["command"].startswith(f"jaxattn run {name} --seed 3")
    assert summary["agrees_with_theory"] is True
    assert summary["figures"] == [f"{stem}.png", f"{stem}.pdf"]
    assert summary["simulation_seconds"] == round(summary["seconds"], 2)
    assert config["started"] <= summary["finished"] and isinstance(config["argv"], list)
    before = (out / f"{stem}.png").stat().st_mtime_ns
    assert main(["plot", str(out)]) == 0
    assert (out / f"{stem}.png").stat().st_mtime_ns > before
    assert "redrew" in capsys.readouterr().out


def test_bad_input_one_line_and_nothing_complete(tmp_path, capsys):
    out = tmp_path / "o"
    err = _one_line_error(capsys, ["run", "thm99-nothing", "--out", str(out)])
    assert "unknown experiment" in err and "thm41-sphere" in err
    assert "--tokens" in _one_line_error(capsys, ["run", "thm41-sphere", "--tokens", "ten",
                                                  "--out", str(out)])
    assert "--colour" in _one_line_error(capsys, ["run", "thm41-sphere", "--colour", "red",
                                                  "--out", str(out)])
    assert "> 0" in _one_line_error(capsys, ["run", "thm52-symmetric", "--horizon", "-2",
                                             "--out", str(out)])
    assert "seed" in _one_line_error(capsys, ["run", "thm52-symmetric", "--seed", "x",
                                              "--out", str(out)])
    assert "name an experiment" in _one_line_error(capsys, ["run"])
    assert not out.exists()  # bad input is refused before anything is written
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    err = _one_line_error(capsys, ["run", "thm41-sphere", "--out", str(blocker / "run")])
    assert "cannot write" in err
    assert not (blocker / "run").exists()
    assert "no such directory" in _one_line_error(capsys, ["plot", str(tmp_path / "none")])
    (tmp_path / "spec.toml").write_text("")
    assert _one_line_error(capsys, ["plot", str(tmp_path / "spec.toml")]).endswith(
        "is not a run folder (a file).")
    half = tmp_path / "half"
    half.mkdir()
    (half / "INCOMPLETE").write_text("")
    assert "incomplete" in _one_line_error(capsys, ["plot", str(half)])
