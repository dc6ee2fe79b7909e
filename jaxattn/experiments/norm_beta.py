"""`norm-beta`: the normalisation/β study of Karagodin et al. (their `simuformer`,
`runner.py` defaults): the clustered-pair density over `(t, β)` of `phase-diagram`, for
each placement of the normalisation (`ja.SelfAttentionDynamics(norm=…)`), every
placement from the same draws of tokens and weights, off-sphere tokens clustered by
direction. Their sizes, and how their script's layers differ from the library's at
finite `τ`: `docs/usage/experiments.md`; the weight codes (`--key-query`, `--value`,
rotf's or, with `--simuformer-codes`, simuformer's: `pair_density.KEY_QUERY`) and the
other differences: `docs/variants.md`.
"""

import dataclasses
from pathlib import Path

import jax
import numpy as np

from .._artifacts import figures
from .._dynamics import NORMS
from .base import AbstractExperiment, Param, Verdict, choices
from .pair_density import STUDY, density_map, describe_map, draw_map, refusals, setup_line

#: simuformer's `runner.py` defaults, where they differ from `phase-diagram`'s.
DEFAULTS = {"betas": 20, "beta_max": 15.0, "systems": 512, "tokens": 64, "dim": 16,
            "key_query": 1, "horizon": 50.0}

#: The help of `--key-query` and `--value`: each code and whose it is.
HELP = {
    "key_query": "key–query B, the codes of rotf's randomKQ option: 0 identity, 1 Gaussian "
                 "G₁G₂/√d, 2 Wigner, 3 GOE; with --simuformer-codes simuformer's: 2 GOE (value "
                 "scale √d), 4 GPT-2 0.02·G, 0, 1, 3 as rotf's",
    "value": "value V, the codes of rotf's randomV option: 0 identity, 1 Gaussian GGᵀ/√d, "
             "2 +KQ, 3 −KQ; with --simuformer-codes simuformer's: 1 Gaussian G/√d, 4 GPT-2 "
             "0.02·G, 0, 2, 3 as rotf's",
}

#: A small run for tests and smoke checks.
QUICK = {"betas": 2, "beta_max": 4.0, "systems": 2, "tokens": 4, "dim": 3, "heads": 2,
         "horizon": 1.0, "times": 6}


class NormBeta(AbstractExperiment):
    distributable = True
    name = "norm-beta"
    title = ("Karagodin et al.'s normalisation study: clustered pairs over (t, β) for each "
             "placement of the normalisation")
    theorem = "Karagodin et al. 2025, normalisation and β (no theorem)"
    judges = False  # it describes the maps; nothing is predicted
    params = tuple(dataclasses.replace(p, default=DEFAULTS.get(p.name, p.default),
                                       help=HELP.get(p.name, p.help)) for p in STUDY) + (
        Param("simuformer_codes", bool, False, "read --key-query and --value as simuformer's "
              "randomKQ/randomV codes (0–4) instead of rotf's (0–3)"),
        Param("heads", int, 8, "heads h (averaged, U = Vᵀ/h)", 1),
        Param("norm", int, 0, "placement: 0 every one, else 1 post, 2 pre, 3 peri, 4 ngpt, "
              "5 none"),
        Param("causal", bool, False, "causal attention (their sequential option)"),
    )

    def refusals(self, config):
        listed = ", ".join(f"{i + 1} {n}" for i, n in enumerate(NORMS))
        return refusals(config, (not 0 <= config.norm <= len(NORMS), "--norm must be 0 (every "
                                 f"placement) or one of {listed}; got {config.norm!r}."))

    def simulate(self, config, progress):
        norms = choices(config.norm, NORMS)
        key = jax.random.PRNGKey(config.seed)
        maps = [density_map(key, config, heads=config.heads, norm=norm,
                            causal=config.causal, progress=progress,
                            desc=f"{self.name}: {norm}") for norm in norms]
        return {"betas": maps[0]["betas"], "ts": maps[0]["ts"], "steps": maps[0]["steps"],
                "norms": np.array(norms), "density": np.stack([m["density"] for m in maps])}

    def verdict(self, config, data):
        parts, numbers = [], {}
        for norm, density in zip(data["norms"], data["density"]):
            line, nums = describe_map(data["betas"], data["ts"], density)
            parts.append(f"{norm}: {line}")
            numbers |= {f"{norm}_{k}": v for k, v in nums.items()}
        return Verdict(True, f"{setup_line(config)}, h = {config.heads}; " + " | ".join(parts),
                       numbers)

    def draw(self, config, data, folder: Path):
        k = len(data["norms"])
        rows, cols = -(-k // 3), min(k, 3)
        # every map spans 0 to 1 (`full_scale`): one colour bar, in a column of its own
        fig = figures.pyplot().figure(figsize=(4.2 * cols + 1.0, 3.9 * rows))
        grid = fig.add_gridspec(rows, cols + 1, width_ratios=[1.0] * cols + [0.05])
        for i, (norm, density) in enumerate(zip(data["norms"], data["density"])):
            mesh = draw_map(fig.add_subplot(grid[i // cols, i % cols]), fig, data["betas"],
                            data["ts"], density, log=False, full_scale=True,
                            title=f'norm = "{norm}"', colorbar=False)
        fig.colorbar(mesh, cax=fig.add_subplot(grid[:, -1]),
                     label="clustered-pair density (dashed: ½, reached at t½)")
        return figures.save_figure(fig, folder / "norm_beta",
                                 f"Clustered pairs by placement: {setup_line(config)}, "
                                 f"h = {config.heads}")
