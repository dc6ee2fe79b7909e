"""`thm32-gradient`: one head, `P` symmetric positive definite, `W U = P`: a gradient
flow of `E_P` on the ellipsoid (paper 001 §3, Theorem 3.2)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import _plot
from .._horizon import CONSENSUS_TOL
from .._manifold import sample_ellipsoid
from ..metrics import cluster_count, misalignment, potential
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

# An equilibrium: the largest velocity entry below CONSENSUS_TOL (`Prediction.check`).
_RISE = 1e-7  # E_P "never decreases": no drop beyond this fraction of E_P (solver error)


def setup(key, config):
    """One instance, the model and its start, drawn from `key`: `jaxattn run
    thm32-gradient --seed S` passes `PRNGKey(S)`, a sweep's instance `i` `PRNGKey(seed + i)`.

    **Arguments:**

    - `key`: a PRNG key.
    - `config`: the experiment's parameters (`dim`, `sphere`, `beta`, `tokens`); any
      others are ignored. `beta` may be a traced scalar.

    **Returns:**

    `(dyn, x0)`: the gradient-flow model (`W U = P`) and `tokens` tokens `(n, dim)`
    uniform on its ellipsoid.
    """
    k_model, k_x = jax.random.split(key)
    dyn = paper.gradient_dynamics(k_model, config["dim"], ellipsoid=not config["sphere"])
    dyn = paper.with_beta(dyn, config["beta"])
    x0 = sample_ellipsoid(k_x, config["tokens"], config["dim"], dyn.W)
    return dyn, x0


def _speed(dyn, ts, ys):
    v = jax.vmap(dyn.velocity)(jnp.asarray(ts), ys)
    return jnp.max(jnp.abs(v), axis=(-2, -1))


class GradientExperiment(AbstractExperiment):
    name = "thm32-gradient"
    title = "1 head, P SPD, W U = P on an ellipsoid: gradient flow of E_P to an equilibrium"
    theorem = "3.2"
    params = (
        Param("tokens", int, 10, "number of tokens n", 1),
        Param("dim", int, 3, "token dimension d (3 draws the ellipsoid)", 2),
        Param("horizon", float, 20.0, "final time T", 0.0),
        BETA,
        Param("sphere", bool, False, "W = I (tokens on the sphere) instead of a random W"),
        Param("tau", float, 0.02, "layer step τ of --discrete", 0.0),
    )

    def simulate(self, config, progress):
        dyn, x0 = setup(jax.random.PRNGKey(config["seed"]), config)
        T = config["horizon"]
        P, beta = dyn.query_key(0.0)[0], dyn.beta
        ts, ys = flow_path(dyn, x0, T, config["saves"], progress=progress,
                           desc=f"{self.name}: flow")
        pred = predict(dyn, x0)
        W = np.eye(config["dim"]) if dyn.W is None else dyn.W
        data = {"ts": ts, "ys": ys, "E_P": potential(ys, P, beta), "E": misalignment(ys),
                "speed": _speed(dyn, ts, ys), "W": W, "P": P,
                "clusters": cluster_count(ys[-1], 1e-3),
                "agrees": pred.check(ys[-1], ts[-1], tol=CONSENSUS_TOL),
                "theorem": np.asarray(pred.theorem or "none")}
        if config["discrete"]:
            tl, yl = layer_path(dyn, x0, T, config["tau"], progress=progress,
                                desc=f"{self.name}: layers")
            data |= {"ts_layers": tl, "ys_layers": yl, "E_P_layers": potential(yl, P, beta),
                     "E_layers": misalignment(yl), "speed_layers": _speed(dyn, tl, yl),
                     "agrees_layers": pred.check(yl[-1], tl[-1], tol=CONSENSUS_TOL)}
        return {k: np.asarray(v) for k, v in data.items()}

    def verdict(self, config, data):
        run = "_layers" if config["discrete"] else ""
        EP, speed = data["E_P" + run], data["speed" + run]
        drop = float(np.max(-np.diff(EP)) / EP[0]) if len(EP) > 1 else 0.0
        monotone = drop <= _RISE
        trend = convergence_trend(data["ts" + run], speed, CONSENSUS_TOL)
        numbers = {"E_P_start": float(EP[0]), "E_P_final": float(EP[-1]),
                   "largest_relative_drop": drop, "final_speed": float(speed[-1]),
                   "final_E": float(data["E" + run][-1]), "clusters": int(data["clusters"])}
        numbers |= trend.numbers()
        where = f"{len(data['ts' + run]) - 1} layers, τ = {config['tau']}" if run else "flow"
        if str(data["theorem"]) != "3.2":
            return kind_verdict("not_applicable", f"{where}: Theorem 3.2 does not cover this "
                                "model", numbers)
        # a stalled speed (not a rising one, `judge`) or E_P falling along the flow
        kind = judge(bool(data["agrees" + run]), trend, "3.2")
        if not (monotone or run):  # the layers need not ascend E_P
            kind = "contradicts"
        mono = ("never decreased" if monotone else f"fell by up to {fmt(drop)} of E_P(0)")
        state = "an equilibrium, " if kind == "agrees" else ""
        line = (f"{where}: E_P rose {fmt(EP[0])} → {fmt(EP[-1])} and {mono}; "
                f"{trend.describe('the speed max |ẋ|')}: {state}{outcome_words(kind, '3.2')} "
                f"(final E = {fmt(numbers['final_E'])}, {numbers['clusters']} cluster(s))")
        return kind_verdict(kind, line, numbers)

    def draw(self, config, data, folder: Path):
        plt = _plot.pyplot()
        layers = config["discrete"]
        three_d = data["ys"].shape[-1] == 3
        cols = 3 if three_d else 2
        fig = plt.figure(figsize=(13 if three_d else 9, 4.2))
        if three_d:
            ax3 = fig.add_subplot(1, cols, 1, projection="3d")
            W = None if config["sphere"] else data["W"]
            ys = data["ys_layers" if layers else "ys"]
            _plot.draw_ellipsoid_trajectories(ax3, ys, W)
            _plot.face(ax3, ys[-1].mean(0) + 0.6 * ys[0].mean(0))
            where = "$S^2$" if config["sphere"] else "the ellipsoid $E_W$"
            ax3.set_title(("layers on " if layers else "tokens on ") + where)
        ax_p = fig.add_subplot(1, cols, cols - 1)
        ax_v = fig.add_subplot(1, cols, cols)
        runs = [("", "flow", "tab:blue", "-")]
        if layers:
            runs.append(("_layers", rf"layers, $\tau$ = {config['tau']:g}", "tab:green", ":"))
        for suffix, label, color, ls in runs:
            ts = data["ts" + suffix]
            ax_p.plot(ts, data["E_P" + suffix], color=color, ls=ls, label=label)
            # a speed is linear in the token differences: rounding noise below ~16 ε
            _plot.draw_decay(ax_v, ts, data["speed" + suffix], label=label, color=color, ls=ls,
                             order=1, scale=float(np.max(data["speed"])))
        ax_p.set_xlabel("time $t$ (depth)")
        ax_p.set_ylabel(r"$E_P = \frac{1}{2}\sum_{ij} e^{\beta x_i^\top P x_j}$")
        ax_p.set_title("the potential (eq. 8) never decreases")
        ax_v.set_ylabel(r"$\max |\dot x|$")
        ax_v.set_title("speed → 0: an equilibrium")
        for ax in (ax_p, ax_v):
            ax.legend(fontsize=8)
        title = (f"Theorem 3.2 — gradient flow, {config['tokens']} tokens, d = {config['dim']}, "
                 f"β = {config['beta']:g}, seed {config['seed']}")
        return _plot.save_figure(fig, folder / self.name.replace("-", "_"), title)
