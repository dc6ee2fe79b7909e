"""`phase-diagram`: the clustering phase diagram of Geshkovski et al. ("A mathematical
perspective on Transformers", 2023; their script `phase-diagrams.py`): the density
of clustered pairs over `(t, β)` (`pair_density.py`), every β in one batched program."""

from pathlib import Path

import jax
import numpy as np

from .._artifacts import figures
from .base import AbstractExperiment, Verdict
from .pair_density import STUDY, density_map, describe_map, draw_map, refusals, setup_line

#: A small run for tests and smoke checks: `jaxattn run phase-diagram` with these.
QUICK = {"betas": 3, "beta_max": 3.0, "systems": 4, "tokens": 5, "horizon": 2.0, "times": 11}


class PhaseDiagram(AbstractExperiment):
    distributable = True
    name = "phase-diagram"
    title = ("Geshkovski et al.'s phase diagram: density of clustered pairs over (t, β), "
             "every β in one program")
    theorem = "Geshkovski et al. 2023, phase diagram (no theorem)"
    params = STUDY
    judges = False  # it describes the map; nothing is predicted

    def refusals(self, config):
        return refusals(config)

    def simulate(self, config, progress):
        data = density_map(jax.random.PRNGKey(config.seed), config, progress=progress,
                           desc=self.name)
        return {k: np.asarray(v) for k, v in data.items()}

    def verdict(self, config, data):
        line, numbers = describe_map(data["betas"], data["ts"], data["density"])
        steps = data["steps"]
        line = (f"{setup_line(config)}; {int(steps.sum())} steps over {len(steps)} β "
                f"({int(steps.min())} to {int(steps.max())} per β): {line}")
        return Verdict(True, line, numbers | {"total_steps": int(steps.sum())})

    def draw(self, config, data, folder: Path):
        fig, axes = figures.pyplot().subplots(1, 2, figsize=(12, 4.4))
        for ax, log in zip(axes, (False, True)):
            draw_map(ax, fig, data["betas"], data["ts"], data["density"], log=log,
                     title="log colour scale" if log else "linear colour scale")
        return figures.save_figure(fig, self.stem(folder), "Clustered pairs (⟨xᵢ, xⱼ⟩ > "
                                   f"{config.threshold:g}): {setup_line(config)}")
