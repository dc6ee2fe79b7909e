"""`conjecture-multihead`: a search for multi-head causal models (symmetric `U_η`)
whose tokens miss the top eigenvector `v₁` of `Σ_η U_η`: Theorem 5.2 proves
consensus at `v₁` for one head and conjectures it for several."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._horizon import CONSENSUS_TOL
from .._programs import kept_jit
from ..explore import Constraints, slow_consensus
from ..spectral import layer_matrix, top_eigenvector
from .base import Param
from .search import SEARCH_PARAMS, AbstractSearch, adam, draw_trace, long_run, searched
from .verdicts import convergence_trend, run_kind, short


def _top_of_sum(dyn):
    """The top eigenvector of `Σ_η U_η` (sign arbitrary)."""
    return top_eigenvector(layer_matrix(dyn))


def _trend(found):
    """The trend of the distance to `v₁` over the long run."""
    return convergence_trend(found["ts"], found["dist"], CONSENSUS_TOL)


def _distance_to_v1(ts, ys, dyn):
    """`max_i (1 − ⟨x_i(T), v₁⟩)`, `v₁` the top eigenvector of `Σ_η U_η` on the
    side of the start, as `max_i |x_i − v₁|² / 2` (unit vectors): no cancellation, so
    a start at distance 1e-20 still has a gradient (`1 − ⟨x, v₁⟩` is 0 below ~1e-16)."""
    v1 = _top_of_sum(dyn)
    v1 = v1 * jnp.where(jnp.sum(ys[0] @ v1) >= 0, 1.0, -1.0)
    return jnp.max(jnp.sum((ys[-1] - v1[None]) ** 2, axis=-1)) / 2


def _start_gap(config, h) -> tuple[float, float]:
    """`(λ₁ − λ₂, λ₁)` of `Σ_η U_η` for the drawn `h`-head model's `U_η`, each clipped to
    `--u-bound` as the search's start is."""
    U = np.asarray(_multihead_model(config.seed, h, config.dim, config.p_bound / 2)[0].U.value)
    lam, V = np.linalg.eigh(U)
    lam = np.linalg.eigvalsh(np.sum((V * np.clip(lam, -config.u_bound, config.u_bound)[
        ..., None, :]) @ np.swapaxes(V, -1, -2), axis=0))
    return float(lam[-1] - lam[-2]), float(lam[-1])


@kept_jit(static_argnames=("h", "d"))  # one program (op by op: ~15)
def _multihead_model(seed, h, d, p_scale):
    """The `h`-head model drawn from `seed`, the key of its search and of its tokens."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), h)
    kp, ku = jax.random.split(key)
    dtype = jnp.result_type(float)
    A = jax.random.normal(ku, (h, d, d), dtype) / np.sqrt(d)
    P = p_scale * jax.random.normal(kp, (h, d, d), dtype) / np.sqrt(d)
    dyn = SelfAttentionDynamics(P, (A + jnp.swapaxes(A, -1, -2)) / 2, causal=True)
    return dyn, key, jax.random.fold_in(key, 1)


@kept_jit  # one program (op by op: ~20)
def _at_the_end(dyn, t, y):
    """`Σ_η U_η`, its top eigenvector (sign arbitrary) and `max |velocity(t, y)|`."""
    M = layer_matrix(dyn)
    return M, top_eigenvector(M), jnp.max(jnp.abs(dyn.velocity(t, y)))


class ConjectureMultihead(AbstractSearch):
    name = "conjecture-multihead"
    title = "search for multi-head causal models (symmetric U_η) where tokens miss v₁"
    theorem = "5.2 (conjectured for h > 1)"
    params = (
        Param("steps", int, 100, "optimiser steps", 1),
        Param("restarts", int, 8, "restarts, optimised as one vmapped batch", 1),
        SEARCH_PARAMS[2],
        Param("tokens", int, 6, "tokens n", 2),
        Param("dim", int, 3, "dimension d", 2),
        Param("horizon", float, 30.0, "horizon T of the distance to v₁", 0.0),
        Param("u_bound", float, 1.0, "spectral-norm bound of each U_η", 0.0),
        Param("p_bound", float, 5.0, "spectral-norm bound of each P_η", 0.0),
        Param("margin", float, 0.02, "start kept in ⟨v₁, x⟩ ≥ margin, in [0, 1)"),
        Param("gap", float, 0.05, "kept λ₁ − λ₂ ≥ gap and λ₁ ≥ gap for ΣU_η", 0.0),
        Param("long", float, 10.0, "the check runs to long × horizon", 1.0),
        Param("saves", int, 30, "saved times of the objective's trajectory", 1),
    )
    settings = {"h2_": 2, "h3_": 3}

    def refusals(self, config):
        yield not 0 <= config.margin < 1, f"--margin must be in [0, 1), got {config.margin:g}."
        for h in self.settings.values():
            gap, lam1 = _start_gap(config, h)
            yield (min(gap, lam1) < config.gap,
                   f"--gap {config.gap:g}: the drawn {h}-head model (seed {config.seed}) starts "
                   f"with λ₁ − λ₂ = {gap:.3g}, λ₁ = {lam1:.3g} for Σ_η U_η, and the search keeps "
                   f"both ≥ --gap from its start: lower --gap to at most {min(gap, lam1):.3g} "
                   "(or try another --seed).")

    def explore(self, config, h, progress):
        dyn, key, tokens_key = _multihead_model(config.seed, h, config.dim, config.p_bound / 2)
        cons = Constraints(train=("P", "U"), norm="spectral",
                           bound={"P": config.p_bound, "U": config.u_bound},
                           symmetric=("U",), hemisphere=_top_of_sum,
                           margin=config.margin, sum_gap=config.gap)
        res = slow_consensus(dyn, init=tokens_key, n=config.tokens, target="both",
                             objective=_distance_to_v1, log=True, horizon=config.horizon,
                             steps=config.steps, restarts=config.restarts, saves=config.saves,
                             weight_noise=1.0, optimizer=adam(config), constraints=cons,
                             key=key, progress=progress)
        return _multihead_check(res, config)

    def judge_setting(self, config, found, h):
        d_T, d_long = float(found["value"]), float(found["dist_long"])
        trend = _trend(found)
        # a counterexample stops approaching v₁; a slow approach (or a rise) is none,
        # nor a proof
        kind = run_kind(trend.state == "converged", trend)
        return kind, (
            f"h={h}: best max(1 − ⟨x_i(T), v₁⟩) {short(d_T)} (random starts mean "
            f"{short(np.mean(found['baseline']))}); at {config.long:g}T {short(d_long)}, "
            f"|velocity| {short(float(found['speed_end']))}, gap of ΣU "
            f"{float(found['gap']):.3f}, start margin {float(found['margin']):.3f}; "
            f"{trend.describe('distance')} → " + {
                "contradicts": "CANDIDATE COUNTEREXAMPLE",
                "agrees": "converges: no counterexample",
                "not_converged": "not converged: undecided"}[kind])

    def numbers(self, config, data):
        found = any(_trend(s).state == "stalled" for s, _ in self.sections(data))
        return ({f"{p}{k}": float(data[f"{p}{k}"]) for p in self.settings
                 for k in ("value", "dist_long", "gap", "speed_end", "margin")}
                | {"counterexample_found": bool(found)})

    def draw(self, config, data, folder: Path):
        fig = figures.pyplot().figure(figsize=(14, 8))
        for row, (found, h) in enumerate(self.sections(data)):
            ax = fig.add_subplot(2, 3, 3 * row + 1)
            draw_trace(ax, found["trace"], found["baseline"],
                       r"$\max_i\,[\,1-\langle x_i(T), v_1\rangle\,]$")
            ax.set_title(f"h = {h}: search over starts and weights")
            ax3 = fig.add_subplot(2, 3, 3 * row + 2, projection="3d")
            figures.draw_ellipsoid_trajectories(ax3, found["ys"], mark=found["v1"],
                                              mark_label="$v_1$")
            figures.title_3d(ax3, f"h = {h}: best start, $t \\in [0, {config.long:g}T]$")
            ax = fig.add_subplot(2, 3, 3 * row + 3)
            figures.draw_decay(ax, found["ts"], found["dist"], color="tab:red")
            ax.axvline(config.horizon, color="k", ls=":", lw=1, label="horizon $T$")
            ax.set(ylabel=r"$\max_i\,[\,1-\langle x_i(t), v_1\rangle\,]$",
                   title=f"h = {h}: distance to $v_1$")
            figures.legend_below(ax, ncol=2)
        return figures.save_figure(fig, self.stem(folder),
                                 "Theorem 5.2 with several heads: a start that misses $v_1$?")


def _multihead_check(res, config):
    dyn = res.dyn
    ts, ys, complete = long_run(dyn, res.x0, config.long * config.horizon)
    M, v1, speed = jax.tree.map(np.asarray, _at_the_end(dyn, ts[-1], ys[-1]))
    v1 = v1 * np.sign(np.sum(np.asarray(res.x0) @ v1))
    lam = np.linalg.eigvalsh(M)
    dist = np.max(np.sum((ys - v1) ** 2, axis=-1), axis=-1) / 2  # 1 − ⟨x, v₁⟩, exactly
    return searched(res) | {
        "x0": res.x0, "ts": ts, "ys": ys, "dist": dist, "dist_long": dist[-1], "v1": v1,
        "long_complete": complete,
        "gap": lam[-1] - lam[-2], "lam": lam, "speed_end": float(speed),
        "margin": float(np.min(np.asarray(res.x0) @ v1)), "P": dyn.P.value, "U": dyn.U.value}
