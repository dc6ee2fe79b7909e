"""The conjecture studies of issue 6 as named experiments (`jaxattn run NAME`):
`conjecture-multihead` searches multi-head causal models whose tokens miss the top
eigenvector `v₁` of `Σ_η U_η` (Theorem 5.2 for `h > 1`), `conjecture-bipartite`
weights that make a bipartite equilibrium of the layer map locally stable (paper
004 Theorem 3 and its multi-head case). Listed in the registry of
`jaxattn.experiments`."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import _plot
from .._dynamics import SelfAttentionDynamics
from .._horizon import CONSENSUS_TOL
from .._layers import run_layers
from .._manifold import normalize
from ..explore import (
    Constraints,
    bipartite_point,
    slow_consensus,
    spectral_radius,
    stabilize_bipartite,
    tangent_jacobian,
)
from ..explore._bipartite import BipartiteWeights
from ..spectral import layer_matrix
from .adversarial import STUDY_PARAMS, Study, draw_trace, long_run
from .base import Param, Verdict, convergence_trend, fmt

# --- conjecture-multihead ------------------------------------------------------------


def _top_of_sum(dyn):
    """The top eigenvector of `Σ_η U_η` (sign arbitrary)."""
    return jnp.linalg.eigh(layer_matrix(dyn))[1][:, -1]


def _distance_to_v1(ts, ys, dyn):
    """`max_i (1 − ⟨x_i(T), v₁⟩)`, `v₁` the top eigenvector of `Σ_η U_η` on the
    side of the start."""
    v1 = _top_of_sum(dyn)
    v1 = v1 * jnp.where(jnp.sum(ys[0] @ v1) >= 0, 1.0, -1.0)
    return jnp.max(1 - ys[-1] @ v1)


def _multihead_model(key, h, d, p_scale):
    kp, ku = jax.random.split(key)
    dtype = jnp.result_type(float)
    A = jax.random.normal(ku, (h, d, d), dtype) / np.sqrt(d)
    P = p_scale * jax.random.normal(kp, (h, d, d), dtype) / np.sqrt(d)
    return SelfAttentionDynamics(P, (A + jnp.swapaxes(A, -1, -2)) / 2, causal=True)


class ConjectureMultihead(Study):
    name = "conjecture-multihead"
    title = "search for multi-head causal models (symmetric U_η) where tokens miss v₁"
    theorem = "5.2 (conjectured for h > 1)"
    params = (
        Param("steps", int, 100, "optimiser steps", 1),
        Param("restarts", int, 8, "restarts, optimised as one vmapped batch", 1),
        STUDY_PARAMS[2],
        Param("tokens", int, 6, "tokens n", 2),
        Param("dim", int, 3, "dimension d", 2),
        Param("horizon", float, 30.0, "horizon T of the distance to v₁", 0.0),
        Param("u_bound", float, 1.0, "spectral-norm bound of each U_η", 0.0),
        Param("p_bound", float, 5.0, "spectral-norm bound of each P_η", 0.0),
        Param("margin", float, 0.02, "start kept in ⟨v₁, x⟩ ≥ margin", 0.0),
        Param("gap", float, 0.05, "kept λ₁ − λ₂ ≥ gap and λ₁ ≥ gap for ΣU_η", 0.0),
        Param("long", float, 10.0, "the check runs to long × horizon", 1.0),
        Param("saves", int, 30, "saved times of the objective's trajectory", 1),
    )

    def simulate(self, config, progress):
        data = {}
        for h in (2, 3):
            key = jax.random.fold_in(jax.random.PRNGKey(config["seed"]), h)
            dyn = _multihead_model(key, h, config["dim"], config["p_bound"] / 2)
            cons = Constraints(train=("P", "U"), norm="spectral",
                               bound={"P": config["p_bound"], "U": config["u_bound"]},
                               symmetric=("U",), hemisphere=_top_of_sum,
                               margin=config["margin"], sum_gap=config["gap"])
            res = slow_consensus(dyn, init=jax.random.fold_in(key, 1), n=config["tokens"],
                                 target="both", objective=_distance_to_v1, log=True,
                                 horizon=config["horizon"], steps=config["steps"],
                                 restarts=config["restarts"], saves=config["saves"],
                                 weight_noise=1.0,
                                 optimizer=optax.adam(config["lr"]), constraints=cons,
                                 key=key, progress=progress)
            data |= _multihead_check(h, res, config)
        return data

    def verdict(self, config, data):
        parts, found = [], False
        for h in (2, 3):
            d_T, d_long = float(data[f"h{h}_value"]), float(data[f"h{h}_dist_long"])
            speed = float(data[f"h{h}_speed_end"])
            # a counterexample stops approaching v₁; a slow approach is none
            trend = convergence_trend(data[f"h{h}_ts"], data[f"h{h}_dist"], CONSENSUS_TOL)
            stuck = trend.contradicts
            found |= stuck
            parts.append(
                f"h={h}: best max(1 − ⟨x_i(T), v₁⟩) {fmt(d_T)} (random starts mean "
                f"{fmt(np.mean(data[f'h{h}_baseline']))}); at {config['long']:g}T {fmt(d_long)}, "
                f"|velocity| {fmt(speed)}, gap of ΣU {float(data[f'h{h}_gap']):.3f}, "
                f"start margin {float(data[f'h{h}_margin']):.3f}; {trend.describe('distance')} → "
                + ("CANDIDATE COUNTEREXAMPLE" if stuck
                   else "converges: no counterexample"))
        return Verdict(True, "; ".join(parts),
                       {f"h{h}_{k}": float(data[f"h{h}_{k}"]) for h in (2, 3)
                        for k in ("value", "dist_long", "gap", "speed_end", "margin")}
                       | {"counterexample_found": bool(found)})

    def draw(self, config, data, folder: Path):
        plt = _plot.pyplot()
        fig = plt.figure(figsize=(14, 8))
        for row, h in enumerate((2, 3)):
            ax = fig.add_subplot(2, 3, 3 * row + 1)
            draw_trace(ax, data[f"h{h}_trace"], data[f"h{h}_baseline"],
                        r"$\max_i (1-\langle x_i(T), v_1\rangle)$")
            ax.set_title(f"h = {h}: search over starts and weights")
            ax3 = fig.add_subplot(2, 3, 3 * row + 2, projection="3d")
            _plot.draw_ellipsoid_trajectories(ax3, data[f"h{h}_ys"], mark=data[f"h{h}_v1"],
                                              mark_label="$v_1$")
            ax3.set_title(f"h = {h}: best start, $t \\in [0, {config['long']:g}T]$")
            ax = fig.add_subplot(2, 3, 3 * row + 3)
            # 1 − ⟨x, v₁⟩ as computed resolves ~ε (first order), not ε²
            _plot.draw_decay(ax, data[f"h{h}_ts"], data[f"h{h}_dist"], order=1, color="tab:red")
            ax.axvline(config["horizon"], color="k", ls=":", lw=1, label="horizon $T$")
            ax.set_ylabel(r"$\max_i (1-\langle x_i(t), v_1\rangle)$")
            ax.set_title(f"h = {h}: distance to $v_1$")
            ax.legend(fontsize=8)
        return _plot.save_figure(fig, folder / "conjecture_multihead",
                                 "Theorem 5.2 with several heads: a start that misses $v_1$?")


def _multihead_check(h, res, config):
    dyn = res.dyn
    ts, ys = long_run(dyn, res.x0, config["long"] * config["horizon"])
    v1 = np.asarray(_top_of_sum(dyn))
    v1 = v1 * np.sign(np.sum(np.asarray(res.x0) @ v1))
    lam = np.linalg.eigvalsh(np.asarray(layer_matrix(dyn)))
    dist = 1 - np.min(np.asarray(ys) @ v1, axis=-1)
    speed = float(jnp.max(jnp.abs(dyn.velocity(ts[-1], ys[-1]))))
    out = {"trace": res.trace, "baseline": res.baseline, "value": res.value, "x0": res.x0,
           "ts": ts, "ys": ys, "dist": dist, "dist_long": dist[-1], "v1": v1,
           "gap": lam[-1] - lam[-2], "lam": lam, "speed_end": speed,
           "margin": float(np.min(np.asarray(res.x0) @ v1)),
           "violation": np.max(res.violation), "P": dyn.P.value, "U": dyn.U.value}
    return {f"h{h}_{k}": np.asarray(v) for k, v in out.items()}


# --- conjecture-bipartite ---------------------------------------------------------------


class ConjectureBipartite(Study):
    name = "conjecture-bipartite"
    title = "weights that make a bipartite equilibrium of the layer map locally stable"
    theorem = "paper 004 Theorem 3 (h = 1) and its open multi-head case"
    drops = ("discrete", "horizon", "saves")  # layers only: --tau and --layers
    params = (
        Param("steps", int, 300, "optimiser steps", 1),
        *STUDY_PARAMS[1:],
        Param("tokens", int, 6, "tokens n", 2),
        Param("split", int, 3, "tokens m at +v (the rest at −v)", 1),
        Param("dim", int, 3, "dimension d", 2),
        Param("tau", float, 1.0, "layer step τ", 0.0),
        Param("p_bound", float, 10.0, "Frobenius bound of the stack P", 0.0),
        Param("u_bound", float, 3.0, "Frobenius bound of the stack U", 0.0),
        Param("layers", int, 400, "layers of the perturbation check", 1),
    )

    def simulate(self, config, progress):
        n, m, d, R = config["tokens"], config["split"], config["dim"], config["restarts"]
        if not 0 < m < n:
            raise ValueError(f"--split must be in 1..{n - 1}, got {m}.")
        v = jnp.zeros(d).at[0].set(1.0)
        data = {}
        for h in (1, 2, 3):
            k1, k2 = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(config["seed"]), h))
            dtype = jnp.result_type(float)
            w0 = BipartiteWeights(2 * jax.random.normal(k1, (R, h, d, d), dtype),
                                  jax.random.normal(k2, (R, h, d, d), dtype))
            w, trace, viol = stabilize_bipartite(
                w0, v, n=n, m=m, tau=config["tau"], p_bound=config["p_bound"],
                u_bound=config["u_bound"], steps=config["steps"],
                optimizer=optax.adam(config["lr"]))
            data |= _bipartite_check(h, w, trace, viol, v, n, m, config, k1)
        return data

    def verdict(self, config, data):
        parts = []
        for h in (1, 2, 3):
            ok = data[f"h{h}_valid"]
            rho = data[f"h{h}_rho"]
            best = float(np.min(np.where(ok, rho, np.inf))) if np.any(ok) else float("nan")
            parts.append(
                f"h={h}: ρ at start {np.min(data[f'h{h}_rho0']):.3g} (best of restarts) → "
                f"{best:.3g} among {int(np.sum(ok))} valid restarts (Assumption 1 on ΣU, a true "
                f"fixed point); {int(np.sum(ok & (rho < 1)))} stable; small perturbation "
                f"{'absorbed' if bool(data[f'h{h}_absorbed']) else 'NOT absorbed'} "
                f"(distance {fmt(data[f'h{h}_dist_small'][-1])}), larger one "
                f"{'escapes' if float(data[f'h{h}_dist_large'][-1]) > 0.1 else 'absorbed'}")
        numbers = {f"h{h}_best_rho": float(np.min(np.where(data[f"h{h}_valid"], data[f"h{h}_rho"],
                                                            np.inf))) for h in (1, 2, 3)}
        return Verdict(True, "; ".join(parts), numbers)

    def draw(self, config, data, folder: Path):
        plt = _plot.pyplot()
        fig, axs = plt.subplots(1, 3, figsize=(14, 4.2))
        colors = {1: "tab:blue", 2: "tab:orange", 3: "tab:green"}
        for h in (1, 2, 3):
            rho = np.exp(np.minimum.accumulate(data[f"h{h}_trace"], axis=0))
            axs[0].semilogy(rho.min(axis=1), color=colors[h], label=f"h = {h}")
            axs[1].scatter(data[f"h{h}_rho0"], data[f"h{h}_rho"], s=18, color=colors[h],
                           marker="o", alpha=0.8, label=f"h = {h}")
            k = np.arange(len(data[f"h{h}_dist_small"]))
            for kick, word, ls in (("small", "small", "-"), ("large", "larger", "--")):
                _plot.draw_decay(axs[2], k, data[f"h{h}_dist_{kick}"], order=1, stop=False,
                                 color=colors[h], ls=ls, label=f"h = {h}, {word} kick")
        axs[0].axhline(1, color="k", lw=0.8, ls=":")
        axs[0].set_xlabel("optimiser step")
        _plot.integer_ticks(axs[0].xaxis)
        axs[0].set_ylabel(r"smoothed $\rho(J_T)$ (best restart)")
        axs[0].set_title("Jacobian spectral radius on the tangent space")
        axs[0].legend(fontsize=8)
        axs[1].axhline(1, color="k", lw=0.8, ls=":")
        axs[1].axvline(1, color="k", lw=0.8, ls=":")
        axs[1].set_xscale("log")
        axs[1].set_yscale("log")
        axs[1].set_xlabel(r"$\rho$ at the random start")
        axs[1].set_ylabel(r"$\rho$ after optimisation")
        axs[1].set_title("every restart (below 1: locally stable)")
        axs[1].legend(fontsize=8)
        axs[2].set_xlabel("layer")
        axs[2].set_ylabel("max distance to the bipartite point")
        axs[2].set_title("kicked bipartite point, best stable weights")
        axs[2].legend(fontsize=7, ncol=2)
        return _plot.save_figure(fig, folder / "conjecture_bipartite",
                                 "Stable bipartite equilibria of the layer map (paper 004)")


def _assumption_1(U_sum, tol=1e-6):
    """`ΣU` symmetric nonsingular with a simple, positive, dominant top eigenvalue."""
    lam = np.linalg.eigvalsh(U_sum)
    mags = np.sort(np.abs(lam))
    return lam[-1] > tol and lam[-1] - np.max(np.abs(lam[:-1])) > tol and mags[0] > tol


def _bipartite_check(h, w, trace, viol, v, n, m, config, key):
    x = bipartite_point(v, n, m)
    R = w.P.shape[0]
    rho, valid, residual = np.zeros(R), np.zeros(R, bool), np.zeros(R)
    for r in range(R):
        dyn = SelfAttentionDynamics(w.P[r], w.U[r])
        rho[r] = float(spectral_radius(tangent_jacobian(dyn, x, config["tau"])))
        residual[r] = float(jnp.max(jnp.abs(dyn.layer(0.0, x, config["tau"]) - x)))
        valid[r] = residual[r] < 1e-10 and _assumption_1(np.asarray(layer_matrix(dyn)))
    rho0 = np.exp(trace[0])  # smooth bound at the start (≥ ρ)
    best = int(np.argmin(np.where(valid, rho, np.inf)))
    dyn = SelfAttentionDynamics(w.P[best], w.U[best])
    dist = []
    for scale in (1e-3, 1e-1):
        kick = scale * jax.random.normal(key, x.shape, x.dtype)
        ys = run_layers(dyn, normalize(x + kick), config["layers"], config["tau"])
        dist.append(np.max(np.linalg.norm(np.asarray(ys) - np.asarray(x), axis=-1), axis=-1))
    out = {"trace": trace, "violation": np.max(viol), "rho": rho, "rho0": rho0, "valid": valid,
           "residual": residual, "dist_small": dist[0], "dist_large": dist[1],
           "absorbed": dist[0][-1] < 1e-6, "P": w.P[best], "U": w.U[best]}
    return {f"h{h}_{k}": np.asarray(v) for k, v in out.items()}
