"""`thm32-gradient`: one head, `P` symmetric positive definite, `W U = P`: a gradient
flow of `E_P` on the ellipsoid (paper 001 §3, Theorem 3.2)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._manifold import sample_ellipsoid
from ..metrics import cluster_count, misalignment, potential
from . import paper001
from .base import BETA, Param
from .theorem import AbstractTheoremExperiment, Evidence
from .verdicts import short

# An equilibrium: the largest velocity entry below CONSENSUS_TOL (`Prediction.check`).
_RISE = 1e-7  # E_P "never decreases": no drop beyond this fraction of E_P (solver error)


class GradientExperiment(AbstractTheoremExperiment):
    name = "thm32-gradient"
    title = "1 head, P SPD, W U = P on an ellipsoid: gradient flow of E_P to an equilibrium"
    theorem = "3.2"
    sweepable = True
    params = (
        Param("tokens", int, 10, "number of tokens n (one token is a consensus already)", 2),
        Param("dim", int, 3, "token dimension d (3 draws the ellipsoid)", 2),
        Param("horizon", float, 20.0, "final time T", 0.0),
        BETA,
        Param("sphere", bool, False, "W = I (tokens on the sphere) instead of a random W"),
        Param("tau", float, 0.02, "layer step τ of --discrete", 0.0),
    )
    reached_words = {"agrees": "an equilibrium, "}
    # E_P's β: `potential` checks a traced β inside the program (a host callback,
    # which the persistent cache refuses), a Python β on the host
    measured_static = ("beta",)

    def setup(self, key, config):
        """The gradient-flow model (`W U = P`) at inverse temperature `beta`, and
        `tokens` tokens `(n, dim)` uniform on its ellipsoid."""
        k_model, k_x = jax.random.split(key)
        dyn = paper001.gradient_dynamics(k_model, config.dim, ellipsoid=not config.sphere)
        dyn = paper001.with_beta(dyn, config.beta)
        return dyn, sample_ellipsoid(k_x, config.tokens, config.dim, dyn.W)

    def measures(self, config, dyn, test, x0, ts, ys):
        P = dyn.query_key(0.0)[0]
        return {"E_P": potential(ys, P, config.beta), "E": misalignment(ys),
                "speed": jnp.max(jnp.abs(jax.vmap(dyn.velocity)(ts, ys)), axis=(-2, -1)),
                # what the test compares with its tolerance: the speed over the field's
                "relative_speed": jax.vmap(test.relative_speed)(ts, ys) if test is not None
                else jnp.full(ts.shape, jnp.nan, ys.dtype),
                "agrees": test is not None and test.check(x0, ys[-1], ts[-1])}

    def flow_facts(self, config, dyn, x0, ys):
        W = jnp.eye(x0.shape[-1], dtype=x0.dtype) if dyn.W is None else dyn.W
        return {"W": W, "P": dyn.query_key(0.0)[0], "clusters": cluster_count(ys[-1], 1e-3)}

    def facts(self, config, dyn, x0, pred, flow):
        return {"theorem": np.asarray(pred.theorem or "none")}

    def evidence(self, config, run):
        EP, speed = run["E_P"], run["speed"]
        with np.errstate(invalid="ignore"):  # E_P past float64: inf − inf, a NaN drop
            drop = float(np.max(-np.diff(EP)) / EP[0]) if len(EP) > 1 else 0.0
        relative = run["relative_speed"]
        numbers = {"E_P_start": float(EP[0]), "E_P_final": float(EP[-1]),
                   "largest_relative_drop": drop, "final_speed": float(speed[-1]),
                   "final_relative_speed": float(relative[-1]),
                   "final_E": float(run["E"][-1]), "clusters": int(run["clusters"])}
        # E_P falling along the flow contradicts (the frame judges the flow alone: the
        # layers need not ascend E_P); the speed is judged on a stall only (`run_kind`).
        # An E_P past float64 (β · xᵀPx > 709) checks nothing: the equilibrium alone is.
        against = drop > _RISE and bool(np.all(np.isfinite(EP)))
        return Evidence(relative, bool(run["agrees"]), str(run["theorem"]) == "3.2", numbers,
                        against)

    def describe(self, config, run, evidence, judged):
        if judged.kind == "not_applicable":
            return "Theorem 3.2 does not cover this model"
        n = evidence.numbers
        drop = n["largest_relative_drop"]
        mono = ("never decreased" if drop <= _RISE else
                f"fell by up to {short(drop)} of E_P(0)" if np.isfinite(n["E_P_final"]) else
                f"overflows float64 at β = {config.beta:g} (not checked; a smaller --beta "
                "checks it)")
        return (f"E_P rose {short(n['E_P_start'])} → {short(n['E_P_final'])} and {mono}; "
                f"{judged.trend.describe('the relative speed max |ẋ| / max |v|')}: "
                f"{self.words(judged.kind)} "
                f"(final E = {short(n['final_E'])}, {n['clusters']} cluster(s))")

    def draw(self, config, data, folder: Path):
        where = "$S^2$" if config.sphere else "the ellipsoid $E_W$"
        fig, ax_p, ax_v = self.token_figure(
            config, data, ("layers on " if config.discrete else "tokens on ") + where,
            W=None if config.sphere else data["W"])
        for run, label, color, ls, lw in self.drawn_runs(config, data):
            ax_p.plot(run["ts"], run["E_P"], color=color, ls=ls, lw=lw, label=label)
            # a speed is linear in the token differences: rounding noise below ~16 ε
            figures.draw_decay(ax_v, run["ts"], run["speed"], label=label, color=color, ls=ls,
                             lw=lw, order=1, scale=float(np.max(data["speed"])))
        potentials = np.concatenate([np.ravel(r.run["E_P"]) for r in self.drawn_runs(config,
                                                                                        data)])
        potentials = potentials[np.isfinite(potentials)]
        # E_P = ½ Σ e^{β xᵀPx} > 0: a range over 1e3 (a large β) reads on a log axis
        if potentials.size and potentials.min() > 0 and np.ptp(np.log10(potentials)) > 3:
            ax_p.set_yscale("log")
        ax_p.set(xlabel="time $t$ (depth)",
                 ylabel=r"$E_P = \frac{1}{2}\sum_{ij} e^{\beta x_i^\top P x_j}$",
                 title="the potential (eq. 8; Theorem 3.2: never decreases)")
        ax_v.set(ylabel=r"$\max |\dot x|$", title="the speed (Theorem 3.2: → 0, an equilibrium)")
        for ax in (ax_p, ax_v):
            ax.legend(fontsize=8)
        title = (f"Theorem 3.2 — gradient flow, {config.tokens} tokens, d = {config.dim}, "
                 f"β = {config.beta:g}, seed {config.seed}")
        return figures.save_figure(fig, self.stem(folder), title)
