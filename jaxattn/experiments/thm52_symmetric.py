"""`thm52-symmetric`: causal attention, one head, symmetric time-invariant `U`
(paper 001 §6.1.3, Figs. 5–6, Theorem 5.2)."""

from pathlib import Path

import jax
import numpy as np

from .. import _plot
from .._horizon import CONSENSUS_TOL
from .._precision import matmul
from ..metrics import misalignment
from ..theory import predict
from . import paper
from .base import (
    BETA,
    AbstractExperiment,
    Param,
    convergence_trend,
    flow_path,
    fmt,
    judge,
    kind_verdict,
    layer_path,
    outcome_words,
)


def setup(key, config):
    """One instance, the model and its start, drawn from `key`: `jaxattn run
    thm52-symmetric --seed S` passes `PRNGKey(S)`, a sweep's instance `i` `PRNGKey(seed + i)`.

    **Arguments:**

    - `key`: a PRNG key.
    - `config`: the experiment's parameters (`dim`, `tokens`, `beta`); any others are
      ignored. `beta` may be a traced scalar.

    **Returns:**

    `(dyn, x0)`: the causal one-head model with symmetric `U` and inverse
    temperature `beta`, and `tokens` unit tokens `(n, dim)` in the hemisphere
    `⟨v₁, x⟩ > 0` of its top eigenvector.
    """
    k_model, k_x = jax.random.split(key)
    dyn = paper.with_beta(paper.symmetric_dynamics(k_model, config["dim"]), config["beta"])
    x0 = paper.hemisphere_of(k_x, _top_eigenvector(dyn), config["tokens"])
    return dyn, x0


def _top_eigenvector(dyn):
    return paper.top_eigenvector(dyn.U(0.0)[0])


class SymmetricExperiment(AbstractExperiment):
    name = "thm52-symmetric"
    title = "causal, 1 head, symmetric U with simple λ₁: tokens in ⟨v₁, x⟩ > 0 → v₁"
    theorem = "5.2"
    params = (
        Param("tokens", int, 10, "number of tokens n", 1),
        Param("dim", int, 3, "token dimension d (3 draws the sphere)", 2),
        BETA,
        Param("horizon", float, 20.0, "final time T", 0.0),
        Param("tau", float, 0.02, "layer step τ of --discrete", 0.0),
    )

    def simulate(self, config, progress):
        dyn, x0 = setup(jax.random.PRNGKey(config["seed"]), config)
        v1 = _top_eigenvector(dyn)
        T = config["horizon"]
        pred = predict(dyn, x0)
        ts, ys = flow_path(dyn, x0, T, config["saves"], progress=progress,
                           desc=f"{self.name}: flow")
        data = {"ts": ts, "ys": ys, "E": misalignment(ys),
                "proj": matmul(ys, v1, "float32").min(-1),
                "v1": v1, "U": dyn.U(0.0)[0], "in_domain": pred.in_domain,
                "agrees": pred.check(ys[-1], tol=CONSENSUS_TOL),
                "theorem": np.asarray(pred.theorem or "none")}
        if config["discrete"]:
            tl, yl = layer_path(dyn, x0, T, config["tau"], progress=progress,
                                desc=f"{self.name}: layers")
            data |= {"ts_layers": tl, "ys_layers": yl, "E_layers": misalignment(yl),
                     "proj_layers": matmul(yl, v1, "float32").min(-1),
                     "agrees_layers": pred.check(yl[-1], tol=CONSENSUS_TOL)}
        return {k: np.asarray(v) for k, v in data.items()}

    def verdict(self, config, data):
        run = "_layers" if config["discrete"] else ""
        E_final, proj = float(data["E" + run][-1]), data["proj" + run]
        gap = 1 - float(proj[-1])
        dip = float(proj.min() - proj[0])
        trend = convergence_trend(data["ts" + run], 1 - proj, CONSENSUS_TOL)
        numbers = {"final_E": E_final, "final_1_minus_min_proj": gap,
                   "min_proj_start": float(proj[0]), "min_proj_lowest": float(proj.min())}
        numbers |= trend.numbers()
        where = f"{len(data['ts' + run]) - 1} layers, τ = {config['tau']}" if run else "flow"
        if str(data["theorem"]) != "5.2" or not bool(data["in_domain"]):
            return kind_verdict("not_applicable", f"{where}: Theorem 5.2 does not cover this "
                                f"start; final E = {fmt(E_final)}", numbers)
        kind = judge(bool(data["agrees" + run]), trend)
        reached = {"agrees": "consensus at v₁, ", "contradicts": "not at v₁, "}.get(kind, "")
        note = (f"; min_i⟨x_i, v₁⟩ first fell by {fmt(-dip)} (not a Lyapunov function)"
                if dip < 0 else "")
        line = (f"{where}: final E = {fmt(E_final)}, {trend.describe('1 − min_i⟨x_i, v₁⟩')}: "
                f"{reached}{outcome_words(kind, '5.2')}{note}")
        return kind_verdict(kind, line, numbers)

    def draw(self, config, data, folder: Path):
        plt = _plot.pyplot()
        layers = config["discrete"]
        three_d = data["ys"].shape[-1] == 3
        fig = plt.figure(figsize=(13 if three_d else 9, 4.2))
        cols = 3 if three_d else 2
        if three_d:
            ax3 = fig.add_subplot(1, cols, 1, projection="3d")
            _plot.draw_ellipsoid_trajectories(ax3, data["ys_layers" if layers else "ys"],
                                              mark=data["v1"], mark_label=r"$v_1$")
            _plot.face(ax3, data["v1"] + 0.6 * data["ys"][0].mean(0))
            ax3.set_title("layers on $S^2$" if layers else "tokens on $S^2$ (Fig. 5)")
        ax_e = fig.add_subplot(1, cols, cols - 1)
        ax_p = fig.add_subplot(1, cols, cols)
        runs = [("", "flow", "tab:blue", "-")]
        if layers:
            runs.append(("_layers", rf"layers, $\tau$ = {config['tau']:g}", "tab:green", ":"))
        for suffix, label, color, ls in runs:
            ts = data["ts" + suffix]
            _plot.draw_decay(ax_e, ts, data["E" + suffix], label=label, color=color, ls=ls)
            ax_p.plot(ts, data["proj" + suffix], color=color, ls=ls, label=label)
        ax_e.set_ylabel("misalignment $E(x(t))$")
        ax_e.set_title("Fig. 6: misalignment")
        ax_p.axhline(1.0, color="0.5", lw=0.8, ls="--")
        ax_p.set_xlabel("time $t$ (depth)")
        ax_p.set_ylabel(r"$\min_i \langle x_i(t), v_1\rangle$")
        ax_p.set_title(r"alignment with $v_1$ (→ 1)")
        for ax in (ax_e, ax_p):
            ax.legend(fontsize=8)
        lam = np.linalg.eigvalsh(data["U"])[::-1]
        title = (f"Theorem 5.2 — causal, {config['tokens']} tokens, d = {config['dim']}, "
                 f"U symmetric, λ = ({', '.join(f'{v:.2g}' for v in lam[:4])}), "
                 f"seed {config['seed']}")
        return _plot.save_figure(fig, folder / self.name.replace("-", "_"), title)
