"""`power-shared`: a shared-weight model prolonged far past its depth, its case
(paper 004 Theorem 1) and its final alignment with `v₁` and the 2-D subspace
(§2.1/§3.1, Figs. 2a, 6c)."""

import numpy as np

from ..spectral import shared_alignment
from . import power_plots as plots
from .base import Param, Verdict
from .paper004 import MODEL_FLAGS, TOKENS, AbstractPowerExperiment, model_from_flags, random_prompts
from .verdicts import short


class PowerShared(AbstractPowerExperiment):
    name = "power-shared"
    theorem = "paper 004 Theorem 1"
    title = ("paper 004 §2.1/§3.1 (Fig. 2a, 6c): a shared-weight model; its case, final "
             "alignment with v₁ and the 2-D subspace, depth prolonged")
    params = MODEL_FLAGS + TOKENS + (
        Param("layer", int, 0, "the layer whose weights are shared (ALBERT: its only one)", 0),
        Param("depth", int, 10, "prolong to this many times the native depth (≥ 2: the "
              "verdict compares the end with the native depth)", 2),
    )

    def simulate(self, config, progress):
        model, label = model_from_flags(config, "albert-base-v2")
        d, L = model.config.hidden_size, model.num_layers
        specs, cos = shared_alignment(model, random_prompts(config, d), config.depth * L,
                                      layer=config.layer, tau=config.tau)
        out = {"native_depth": np.asarray(L), "label": np.asarray(label)}
        for i, (tag, s) in enumerate((("modulus", specs[0]), ("step", specs[1]))):
            out |= {f"cos_{tag}": np.asarray(cos[..., i, :]),
                    f"eig_{tag}": np.asarray(s.eigenvalues), f"case_{tag}": np.asarray(s.case),
                    f"gap_{tag}": np.asarray(s.pair_gap), f"corr_{tag}": np.asarray(s.correlation)}
        return out

    def verdict(self, config, data):
        L = int(data["native_depth"])
        n = {}
        for tag in ("modulus", "step"):
            c = data[f"cos_{tag}"].mean(axis=(0, 2))  # (layers, 2)
            n |= {f"{tag}_case": int(data[f"case_{tag}"]), f"{tag}_start": float(c[0, 0]),
                  f"{tag}_native": float(c[L, 0]), f"{tag}_end": float(c[-1, 0]),
                  f"{tag}_plane_end": float(c[-1, 1])}
        d = data["eig_step"].shape[0]
        n["random_baseline"] = float(np.sqrt(2 / (np.pi * d)))
        ok = n["step_end"] > max(n["step_native"], n["step_start"])
        line = (f"case {n['modulus_case']} by |λ| (paper), {n['step_case']} by |1+τλ|; "
                f"mean alignment with v₁ (|1+τλ| order) {short(n['step_start'])} → "
                f"{short(n['step_native'])} at depth {L} → {short(n['step_end'])} at "
                f"{data['cos_step'].shape[1] - 1}; with the |λ|-ordered v₁ "
                f"{short(n['modulus_end'])} (random direction ≈ {short(n['random_baseline'])})")
        return Verdict(bool(ok), line, n)

    def draw(self, config, data, folder):
        return plots.power_shared(data, self.stem(folder))
