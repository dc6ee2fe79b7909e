"""`power-layers`: per layer of a real model, the alignment `c`, the increment `Δ`
and the probability `p` against their all-eigenvector baselines (paper 004
§2.2/§3.2, Figs. 2b, 6, 7)."""

import numpy as np

from ..metrics import binomial_error
from ..spectral import layerwise
from . import power_plots as plots
from .base import Param, Verdict
from .paper004 import (
    FAMILY_FLAGS,
    MODEL_FLAGS,
    TOKENS,
    AbstractPowerExperiment,
    model_from_flags,
    random_prompts,
    stats_arrays,
)
from .verdicts import short


class PowerLayers(AbstractPowerExperiment):
    name = "power-layers"
    theorem = "paper 004 §3.2, no theorem"
    title = ("paper 004 §2.2/§3.2 (Figs. 2b, 6, 7): per layer, alignment c, increment Δ, "
             "probability p vs their all-eigenvector baselines")
    params = MODEL_FLAGS + FAMILY_FLAGS + TOKENS + (
        Param("step_order", bool, False, "order eigenvalues by |1 + τλ| instead of |λ|"),
    )

    def simulate(self, config, progress):
        model, label = model_from_flags(config, "gpt2")
        x0 = random_prompts(config, model.config.hidden_size)
        order = config.tau if config.step_order else None
        stats, eigs, _ = layerwise(model, x0, tau=config.tau, order_tau=order)
        return stats_arrays(stats) | {"eigenvalues": np.asarray(eigs),
                                     "label": np.asarray(label)}

    def verdict(self, config, data):
        # Beyond two standard errors over the prompts' tokens: with few tokens, p_ℓ of
        # 0.50–0.55 and Δ_ℓ a fifth of its spread read as "above" by chance.
        tokens = config.prompts * config.tokens
        spread = np.hypot(data["stat_delta_std"], data["stat_delta_bar_std"]) / np.sqrt(tokens)
        above = data["stat_delta"] - data["stat_delta_bar"] > 2 * spread
        more = data["stat_p"] - 0.5 > 2 * binomial_error(0.5, tokens)
        n = {"layers": int(above.size), "delta_above_baseline": int(above.sum()),
             "p_above_half": int(more.sum()), "mean_c": float(data["stat_c"].mean()),
             "mean_c_bar": float(data["stat_c_bar"].mean())}
        ok = above.sum() > above.size / 2 and more.sum() > more.size / 2
        # p ≤ 1 passes 1/2 by two standard errors only past 4 tokens
        undecided = "" if 2 * binomial_error(0.5, tokens) < 0.5 else (
            f"{tokens} tokens cannot put p_ℓ above 1/2 by two standard errors (it takes "
            "more than 4); raise --prompts or --tokens.")
        line = (f"Δ_ℓ > Δ̄_ℓ in {n['delta_above_baseline']}/{n['layers']} layers, p_ℓ > 1/2 in "
                f"{n['p_above_half']}/{n['layers']} (each by two standard errors over "
                f"{tokens:,} tokens); mean c_ℓ {short(n['mean_c'])} vs c̄_ℓ "
                f"{short(n['mean_c_bar'])}")
        return Verdict(bool(ok), line, n, undecided=undecided)

    def draw(self, config, data, folder):
        return plots.power_layers(data, self.stem(folder))
