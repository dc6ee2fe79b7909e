"""`thm41-sphere`: 10 tokens on S² under two time-varying heads (paper 001
§6.1.1, Figs. 1–3, Theorem 4.1)."""

from pathlib import Path

import jax
import numpy as np

from .. import _plot
from .._horizon import CONSENSUS_TOL
from ..metrics import misalignment, pairwise_lyapunov
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
    largest_rise,
    layer_path,
    outcome_words,
)


def setup(key, config):
    """One instance, the model and its start, drawn from `key`: `jaxattn run
    thm41-sphere --seed S` passes `PRNGKey(S)`, a sweep's instance `i` `PRNGKey(seed + i)`.

    **Arguments:**

    - `key`: a PRNG key.
    - `config`: the experiment's parameters (`heads`, `tokens`, `beta`); any others
      are ignored. `beta` may be a traced scalar.

    **Returns:**

    `(dyn, x0)`: the `heads`-head model on S² with inverse temperature `beta` and
    `tokens` unit tokens `(n, 3)` in one open hemisphere.
    """
    k_model, k_x = jax.random.split(key)
    dyn = paper.with_beta(paper.sphere_dynamics(k_model, config["heads"]), config["beta"])
    x0 = paper.hemisphere_tokens(k_x, config["tokens"], 3)
    return dyn, x0


class SphereExperiment(AbstractExperiment):
    name = "thm41-sphere"
    title = "10 tokens on S², 2 time-varying heads, U = I: consensus from a hemisphere"
    theorem = "4.1"
    params = (
        Param("tokens", int, 10, "number of tokens n", 1),
        Param("heads", int, 2, "number of heads h", 1),
        BETA,
        Param("horizon", float, 10.0, "final time T", 0.0),
        Param("tau", float, 0.01, "layer step τ of --discrete", 0.0),
    )

    def simulate(self, config, progress):
        dyn, x0 = setup(jax.random.PRNGKey(config["seed"]), config)
        T, saves = config["horizon"], config["saves"]
        ts, ys = flow_path(dyn, x0, T, saves, progress=progress, desc=f"{self.name}: flow")
        pred = predict(dyn, x0)
        data = {
            "ts": ts, "ys": ys, "E": misalignment(ys), "V": pairwise_lyapunov(ys),
            "P_norm": paper.sphere_query_key(dyn, ts), "x0": x0,
            "in_domain": pred.in_domain, "margin": pred.margin,
        }
        if config["discrete"]:
            tl, yl = layer_path(
                dyn, x0, T, config["tau"], progress=progress, desc=f"{self.name}: layers"
            )
            data |= {"ts_layers": tl, "ys_layers": yl, "E_layers": misalignment(yl),
                     "V_layers": pairwise_lyapunov(yl)}
        return {k: np.asarray(v) for k, v in data.items()}

    def verdict(self, config, data):
        run = "_layers" if config["discrete"] else ""
        E = data["E" + run]
        rise = largest_rise(data["V" + run])
        where = f"{len(data['ts' + run]) - 1} layers, τ = {config['tau']}" if run else "flow"
        trend = convergence_trend(data["ts" + run], E, CONSENSUS_TOL)
        numbers = {"final_E": float(E[-1]), "V_largest_rise": rise,
                   "margin": float(data["margin"])} | trend.numbers()
        if not bool(data["in_domain"]):
            line = (f"{where}: the start is in no open hemisphere, so Theorem 4.1 says nothing; "
                    f"final E = {fmt(E[-1])}")
            return kind_verdict("not_applicable", line, numbers)
        kind = judge(float(E[-1]) < CONSENSUS_TOL, trend)
        reached = {"agrees": "consensus, ", "contradicts": "no consensus, "}.get(kind, "")
        line = (f"{where}: {trend.describe('E')}: {reached}{outcome_words(kind, '4.1')} (start "
                f"in a hemisphere, margin {fmt(data['margin'])}); V(t) largest rise {fmt(rise)}")
        return kind_verdict(kind, line, numbers)

    def draw(self, config, data, folder: Path):
        plt = _plot.pyplot()
        layers = config["discrete"]
        fig = plt.figure(figsize=(13, 4.2))
        ax3 = fig.add_subplot(1, 3, 1, projection="3d")
        ys = data["ys_layers" if layers else "ys"]
        _plot.draw_sphere_trajectories(ax3, ys)
        _plot.face(ax3, ys[-1].mean(0) + 0.6 * ys[0].mean(0))
        ax3.set_title("layers on $S^2$" if layers else "tokens on $S^2$")
        ax = fig.add_subplot(1, 3, 2)
        _plot.draw_head_norms(ax, data["ts"], data["P_norm"], upto=2.0)
        ax = fig.add_subplot(1, 3, 3)
        _plot.draw_decay(ax, data["ts"], data["V"], label="$V(t)$, flow", color="tab:blue")
        _plot.draw_decay(ax, data["ts"], data["E"], label="$E(t)$, flow", color="tab:orange",
                         ls="--")
        if layers:
            _plot.draw_decay(ax, data["ts_layers"], data["V_layers"],
                             label=rf"$V$, layers ($\tau$={config['tau']:g})", color="tab:green",
                             ls=":")
        ax.set_ylabel(r"$V = 1-\min_{ij}\langle x_i,x_j\rangle$,  $E$")
        ax.set_title("Lyapunov function (eq. 10) and misalignment")
        ax.legend(fontsize=8)
        return _plot.save_figure(fig, folder / self.name.replace("-", "_"),
                                 f"Theorem 4.1 — {config['tokens']} tokens, h = {config['heads']}, "
                                 f"seed {config['seed']}")
