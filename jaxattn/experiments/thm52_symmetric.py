"""`thm52-symmetric`: causal attention, one head, symmetric time-invariant `U`
(paper 001 §6.1.3, Figs. 5–6, Theorem 5.2)."""

from pathlib import Path

import jax
import numpy as np

from .._artifacts import figures
from .._precision import matmul
from ..metrics import misalignment
from . import paper001
from .base import BETA, Param
from .theorem import AbstractTheoremExperiment, Evidence
from .verdicts import UNSTABLE_TOL, short


class SymmetricExperiment(AbstractTheoremExperiment):
    name = "thm52-symmetric"
    title = "causal, 1 head, symmetric U with simple λ₁: tokens in ⟨v₁, x⟩ > 0 → v₁"
    theorem = "5.2"
    sweepable = True
    params = (
        Param("tokens", int, 10, "number of tokens n (one token is a consensus already)", 2),
        Param("dim", int, 3, "token dimension d (3 draws the sphere)", 2),
        BETA,
        Param("horizon", float, 20.0, "final time T", 0.0),
        Param("tau", float, 0.02, "layer step τ of --discrete", 0.0),
    )
    reached_words = {"agrees": "consensus at v₁, ", "contradicts": "not at v₁, "}

    def setup(self, key, config):
        """The causal one-head model with symmetric `U` at inverse temperature
        `beta`, and `tokens` unit tokens `(n, dim)` in the hemisphere `⟨v₁, x⟩ > 0` of
        its top eigenvector."""
        k_model, k_x = jax.random.split(key)
        dyn = paper001.with_beta(paper001.symmetric_dynamics(k_model, config.dim),
                                 config.beta)
        return dyn, paper001.hemisphere_of(k_x, _top_eigenvector(dyn), config.tokens)

    def measures(self, config, dyn, test, x0, ts, ys):
        return {"E": misalignment(ys), "proj": matmul(ys, _top_eigenvector(dyn), "float32").min(-1),
                "agrees": test is not None and test.check(x0, ys[-1], ts[-1])}

    def flow_facts(self, config, dyn, x0, ys):
        return {"v1": _top_eigenvector(dyn), "U": dyn.U(0.0)[0]}

    def evidence(self, config, run):
        proj = run["proj"]
        # 1 − ⟨x, v₁⟩ of a unit token is ≥ 0: a rounded −2e-16 is 0
        numbers = {"final_E": float(run["E"][-1]),
                   "final_1_minus_min_proj": max(1 - float(proj[-1]), 0.0),
                   "min_proj_start": float(proj[0]), "min_proj_lowest": float(proj.min())}
        inside = str(run["theorem"]) == "5.2" and bool(run["in_domain"])
        # a token near the equator ⟨x, v₁⟩ = 0: Theorem 5.2's unstable equilibria
        return Evidence(np.maximum(1 - proj, 0.0), bool(run["agrees"]), inside, numbers,
                        unstable=abs(float(proj[-1])) < UNSTABLE_TOL)

    def describe(self, config, run, evidence, judged):
        E_final = short(evidence.numbers["final_E"])
        if judged.kind == "not_applicable":
            return f"Theorem 5.2 does not cover this start; final E = {E_final}"
        dip = float(run["proj"].min() - run["proj"][0])
        note = (f"; min_i⟨x_i, v₁⟩ first fell by {short(-dip)} (not a Lyapunov function)"
                if dip < 0 else "")
        return (f"final E = {E_final}, {judged.trend.describe('1 − min_i⟨x_i, v₁⟩')}: "
                f"{self.words(judged.kind)}{note}")

    def draw(self, config, data, folder: Path):
        fig, ax_e, ax_p = self.token_figure(
            config, data, "layers on $S^2$" if config.discrete else "tokens on $S^2$ (Fig. 5)",
            toward=data["v1"], mark=data["v1"], mark_label=r"$v_1$")
        for run, label, color, ls, lw in self.drawn_runs(config, data):
            figures.draw_decay(ax_e, run["ts"], run["E"], label=label, color=color, ls=ls, lw=lw)
            ax_p.plot(run["ts"], run["proj"], color=color, ls=ls, lw=lw, label=label)
        ax_e.set(ylabel="misalignment $E(x(t))$", title="Fig. 6: misalignment")
        ax_p.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax_p.set(xlabel="time $t$ (depth)", ylabel=r"$\min_i \langle x_i(t), v_1\rangle$",
                 title=r"alignment with $v_1$ (→ 1)")
        for ax in (ax_e, ax_p):
            ax.legend(fontsize=8)
        lam = np.linalg.eigvalsh(data["U"])[::-1]
        title = (f"Theorem 5.2 — causal, {config.tokens} tokens, d = {config.dim}, "
                 f"U symmetric, λ = ({', '.join(f'{v:.2g}' for v in lam[:4])}), "
                 f"seed {config.seed}")
        return figures.save_figure(fig, self.stem(folder), title)


def _top_eigenvector(dyn):
    return paper001.top_eigenvector(dyn.U(0.0)[0])
