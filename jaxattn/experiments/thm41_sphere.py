"""`thm41-sphere`: 10 tokens on S² under two time-varying heads (paper 001
§6.1.1, Figs. 1–3, Theorem 4.1)."""

from pathlib import Path

import jax
import numpy as np

from .._artifacts import figures
from .._horizon import CONSENSUS_TOL, Horizon
from ..metrics import misalignment, pairwise_lyapunov
from . import paper001
from .base import BETA, Param
from .theorem import AbstractTheoremExperiment, Evidence
from .verdicts import largest_rise, rise_words, short


class SphereExperiment(AbstractTheoremExperiment):
    name = "thm41-sphere"
    title = "10 tokens on S², 2 time-varying heads, U = I: consensus from a hemisphere"
    theorem = "4.1"
    sweepable = True
    params = (
        Param("tokens", int, 10, "number of tokens n (one token is a consensus already)", 2),
        Param("heads", int, 2, "number of heads h", 1),
        BETA,
        Param("horizon", float, 10.0, "final time T", 0.0),
        Param("tau", float, 0.01, "layer step τ of --discrete", 0.0),
    )
    reached_words = {"agrees": "consensus, ", "contradicts": "no consensus, "}
    measured_static = ("horizon",)  # the times ‖P_η(t)‖ is drawn at (`_drawn_times`)

    grid_notes = {"heads": paper001.HEADS_NOTE}

    def setup(self, key, config):
        """The `heads`-head model on S² at inverse temperature `beta`, and `tokens`
        unit tokens `(n, 3)` in one open hemisphere."""
        k_model, k_x = jax.random.split(key)
        dyn = paper001.with_beta(paper001.sphere_dynamics(k_model, config.heads),
                                 config.beta)
        return dyn, paper001.hemisphere_tokens(k_x, config.tokens, 3)

    def measures(self, config, dyn, test, x0, ts, ys):
        return {"E": misalignment(ys), "V": pairwise_lyapunov(ys)}

    def flow_facts(self, config, dyn, x0, ys):
        return {"P_norm": paper001.sphere_query_key(dyn, _drawn_times(config))}

    def facts(self, config, dyn, x0, pred, flow):
        return {"P_ts": _drawn_times(config), "x0": x0, "in_domain": pred.in_domain,
                "margin": pred.margin}

    def evidence(self, config, run):
        E = run["E"]
        # V = max |x_i − x_j|² / 2 resolves ~ε·|x_i − x_j| = ε·√(2V): a rise below is
        # rounding (a rise of 9.8e-34 was reported)
        V = np.asarray(run["V"], np.float64)
        floor = 8 * np.finfo(np.float64).eps * (np.sqrt(2 * np.maximum(V[1:], V[:-1])) + V[1:])
        numbers = {"final_E": float(E[-1]), "V_largest_rise": largest_rise(V, floor),
                   "margin": float(run["margin"])}
        return Evidence(E, float(E[-1]) < CONSENSUS_TOL, bool(run["in_domain"]), numbers)

    def describe(self, config, run, evidence, judged):
        if judged.kind == "not_applicable":
            return (f"the start is in no open hemisphere, so Theorem 4.1 says nothing; "
                    f"final E = {short(run['E'][-1])}")
        return (f"{judged.trend.describe('E')}: {self.words(judged.kind)} (start in a "
                f"hemisphere, margin {short(run['margin'])}); "
                f"{rise_words(evidence.numbers['V_largest_rise'], 'V(t)')}")

    def draw(self, config, data, folder: Path):
        layers = config.discrete
        fig = figures.pyplot().figure(figsize=(13, 4.4))
        grid = fig.add_gridspec(1, 3, width_ratios=(1.3, 1, 1))
        ax3 = fig.add_subplot(grid[0], projection="3d")
        ys = data["ys_layers" if layers else "ys"]
        figures.draw_sphere_trajectories(ax3, ys)
        ax3.set_box_aspect((1, 1, 1), zoom=1.15)
        figures.view_towards(ax3, ys[-1].mean(0) + 0.6 * ys[0].mean(0))
        figures.title_3d(ax3, "layers on $S^2$" if layers else "tokens on $S^2$")
        ax = fig.add_subplot(grid[1])
        figures.draw_head_norms(ax, data.get("P_ts", data["ts"]), data["P_norm"], upto=2.0)
        ax = fig.add_subplot(grid[2])
        figures.draw_decay(ax, data["ts"], data["E"], label="$E(t)$, flow", color="tab:orange",
                           ls="--")
        for run, label, color, ls, lw in self.drawn_runs(config, data):  # V over E
            figures.draw_decay(ax, run["ts"], run["V"], label=f"$V(t)$, {label}", color=color,
                               ls=ls, lw=lw)
        ax.set(ylabel="$V$ and $E$",
               title=r"$V = 1-\min_{ij}\langle x_i,x_j\rangle$ (eq. 10) and $E$")
        ax.legend(fontsize=8)
        return figures.save_figure(fig, self.stem(folder),
                                 f"Theorem 4.1 — {config.tokens} tokens, h = {config.heads}, "
                                 f"seed {config.seed}")


def _drawn_times(config) -> np.ndarray:
    """The times `‖P_η(t)‖` is drawn at: the first 2 time units at 200 points each (the
    saves alone are jagged), then the flow's save times."""
    ts = Horizon(config.horizon).save_times(config.saves)
    return np.concatenate([np.linspace(0.0, min(ts[-1], 2.0), 401), ts[ts > 2.0]])
