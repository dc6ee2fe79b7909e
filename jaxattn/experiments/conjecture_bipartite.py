"""`conjecture-bipartite`: weights that make a bipartite equilibrium of the layer
map locally stable (paper 004 Theorem 3 for one head, and its open multi-head
case), searched by `ja.explore.stabilize_bipartite` and checked by kicking the
point."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._layers import run_layers
from .._manifold import normalize
from .._programs import kept_jit
from ..explore import (
    BipartiteWeights,
    bipartite_point,
    spectral_radius,
    stabilize_bipartite,
    tangent_jacobian,
)
from ..spectral import layer_matrix
from .base import Param
from .search import SEARCH_PARAMS, AbstractSearch, adam
from .verdicts import short


class ConjectureBipartite(AbstractSearch):
    name = "conjecture-bipartite"
    title = "weights that make a bipartite equilibrium of the layer map locally stable"
    theorem = "paper 004 Theorem 3 (h = 1) and its open multi-head case"
    params = (
        Param("steps", int, 300, "optimiser steps", 1),
        *SEARCH_PARAMS[1:],
        Param("tokens", int, 6, "tokens n", 2),
        Param("split", int, 3, "tokens m at +v (the rest at −v)", 1),
        Param("dim", int, 3, "dimension d", 2),
        Param("tau", float, 1.0, "layer step τ", 0.0),
        Param("p_bound", float, 10.0, "Frobenius bound of the stack P", 0.0),
        Param("u_bound", float, 3.0, "Frobenius bound of the stack U", 0.0),
        Param("layers", int, 400, "layers of the perturbation check", 1),
    )
    settings = {"h1_": 1, "h2_": 2, "h3_": 3}
    # a search for weights that make the point stable: it reports what it found (the
    # radius, the kicks' fate) and predicts nothing, so `summary.json` says null
    judges = False

    def refusals(self, config):
        return ((not config.split < config.tokens,
                 f"--split must be in 1..{config.tokens - 1}, got {config.split}."),)

    def explore(self, config, h, progress):
        d = config.dim
        v = np.eye(d, dtype=jnp.result_type(float))[0]
        w0, key = _start_weights(config.seed, h=h, R=config.restarts, d=d)
        w, trace, viol = stabilize_bipartite(
            w0, v, n=config.tokens, m=config.split, tau=config.tau, p_bound=config.p_bound,
            u_bound=config.u_bound, steps=config.steps,
            optimizer=adam(config))
        return _bipartite_check(w, trace, viol, v, config, key)

    def judge_setting(self, config, found, h):
        ok, rho = found["valid"], found["rho"]
        if not np.any(ok):
            return None, (f"h={h}: smoothed bound on ρ at the projected start "
                          f"{np.min(found['rho0']):.3g} (best of restarts) → no valid restart "
                          f"of {len(ok)} (Assumption 1 on ΣU, a true fixed point): nothing to "
                          "kick")
        best = _best(found)
        return None, (
            f"h={h}: ρ of the best valid restart, from a smoothed bound "
            f"{float(found['rho0'][best]):.3g} at its projected start "
            f"→ {float(np.min(rho[ok])):.3g} among {int(np.sum(ok))} valid restarts "
            f"(Assumption 1 on ΣU, a true fixed point); {int(np.sum(ok & (rho < 1)))} stable; "
            f"v {'is' if _principal(found['U']) else 'is NOT'} the principal eigenvector of "
            "ΣU there; "
            f"small kick {_fate(found['dist_small'])}, larger one {_fate(found['dist_large'])}")

    def numbers(self, config, data):
        return {f"h{h}_best_rho": float(np.min(np.where(s["valid"], s["rho"], np.inf)))
                for s, h in self.sections(data)}

    def draw(self, config, data, folder: Path):
        fig, axs = figures.pyplot().subplots(1, 3, figsize=(14, 4.2))
        colors = {1: "tab:blue", 2: "tab:orange", 3: "tab:green"}
        for found, h in self.sections(data):
            valid = found["valid"]
            if valid.any():  # the restart the verdict reports and the kick uses
                axs[0].semilogy(np.exp(found["trace"][:, _best(found)]), color=colors[h],
                                label=f"h = {h}")
            else:
                rho = np.exp(np.minimum.accumulate(found["trace"], axis=0))
                axs[0].semilogy(rho.min(axis=1), color=colors[h], ls=":",
                                label=f"h = {h}: no valid restart (best of all)")
            for sel, face, word in ((valid, colors[h], ""), (~valid, "none", ", not valid")):
                if sel.any():
                    axs[1].scatter(found["rho0"][sel], found["rho"][sel], s=18,
                                   facecolors=face, edgecolors=colors[h], marker="o",
                                   alpha=0.8, label=f"h = {h}{word}")
            if not valid.any():
                continue
            k = np.arange(len(found["dist_small"]))
            # the larger kick thin and dashed over the small one: where they coincide,
            # both show
            for kick, word, ls, lw in (("small", "small", "-", 2.4),
                                       ("large", "larger", (0, (4, 2)), 1.1)):
                figures.draw_decay(axs[2], k, found[f"dist_{kick}"], order=1, stop=False,
                                 color=colors[h], ls=ls, lw=lw, label=f"h = {h}, {word} kick")
        axs[0].axhline(1, color="k", lw=0.8, ls=":")
        axs[0].set(xlabel="optimiser step",
                   ylabel=r"smoothed bound on $\rho(J_T)$ (best valid restart)",
                   title="Jacobian spectral radius on the tangent space")
        figures.integer_ticks(axs[0].xaxis)
        figures.legend_below(axs[0], ncol=2)
        axs[1].axhline(1, color="k", lw=0.8, ls=":")
        axs[1].axvline(1, color="k", lw=0.8, ls=":")
        axs[1].set(xscale="log", yscale="log",
                   xlabel=r"smoothed bound on $\rho$ at the projected random start",
                   ylabel=r"$\rho$ after optimisation",
                   title="every restart (below 1: locally stable)")
        figures.legend_below(axs[1], ncol=2)
        kicked = [found for found, _ in self.sections(data) if found["valid"].any()]
        axs[2].set(xlabel=_kick_axis(axs[2], [d for found in kicked
                                              for d in (found["dist_small"], found["dist_large"])]),
                   ylabel="max distance to the bipartite point",
                   title="kicked bipartite point, best valid weights")
        figures.legend_below(axs[2], ncol=2, fontsize=7)
        return figures.save_figure(fig, self.stem(folder),
                                 "Stable bipartite equilibria of the layer map (paper 004)")


def _kick_axis(ax, dists) -> str:
    """Show the kicks' layers up to twice the last one any distance is above its
    resolution (at least 10), so a decay of a few layers is not squeezed against
    the axis by a long check; the label says where the rest of the run lies."""
    dists = [np.asarray(d) for d in dists]
    if not dists:
        return "layer"
    floor = figures.resolution(dists[0].dtype, order=1)
    last = max(int(np.flatnonzero(d > floor).max(initial=0)) for d in dists)
    end = len(dists[0]) - 1
    if max(2 * last, 10) >= end:
        return "layer"
    ax.set_xlim(-0.5, max(2 * last, 10))
    return f"layer (all below the floor from layer {last + 1} to {end})"


#: A kick is absorbed when the largest distance to the point falls below `ABSORBED`
#: of its start, and escapes when it ends above its start (one rule for both kicks:
#: the small one needed 1e-3 of its start, the larger only not to grow).
ABSORBED = 1e-3


def _fate(dist) -> str:
    """A kick's outcome from its distances to the point, layer by layer."""
    start, end = float(dist[0]), float(dist[-1])
    words = ("absorbed" if end <= ABSORBED * start else "escapes" if end > start
             else "shrinking, not yet absorbed")
    return f"{words} ({short(start)} → {short(end)})"


def _best(found) -> int:
    """The valid restart of smallest `ρ` (the one kicked): the verdict's and panel 1's."""
    return int(np.argmin(np.where(found["valid"], found["rho"], np.inf)))


def _principal(U, tol=1e-8) -> bool:
    """Whether `v = e₁` is the principal eigenvector of `ΣU` (`U` the stack `(h, d, d)`):
    the validity filter asks only that it be an eigenvector."""
    top = np.linalg.eigh(np.sum(np.asarray(U, np.float64), axis=0))[1][:, -1]
    return bool(abs(top[0]) > 1 - tol)


def _assumption_1(U_sum, tol=1e-6):
    """`ΣU` symmetric nonsingular with a simple, positive, dominant top eigenvalue."""
    lam = np.linalg.eigvalsh(U_sum)
    mags = np.sort(np.abs(lam))
    return lam[-1] > tol and lam[-1] - np.max(np.abs(lam[:-1])) > tol and mags[0] > tol


@kept_jit(static_argnames=("h", "R", "d"))
def _start_weights(seed, *, h, R, d):
    """Every restart's random start `(R, h, d, d)` and the key of the kicks."""
    k1, k2 = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), h))
    dtype = jnp.result_type(float)
    return BipartiteWeights(2 * jax.random.normal(k1, (R, h, d, d), dtype),
                            jax.random.normal(k2, (R, h, d, d), dtype)), k1


@kept_jit(static_argnames=("n",))
def _restart_readings(w, v, tau, *, n, m):
    """The bipartite point `x`, and per restart the spectral radius of the tangent
    Jacobian at `x`, the fixed-point residual and `ΣU`."""
    x = bipartite_point(v, n, m)

    def one(P, U):
        dyn = SelfAttentionDynamics(P, U)
        return (spectral_radius(tangent_jacobian(dyn, x, tau)),
                jnp.max(jnp.abs(dyn.layer(0.0, x, tau) - x)), layer_matrix(dyn))

    return x, *jax.vmap(one)(w.P, w.U)


@kept_jit(static_argnames=())
def _kicked(x, key):
    """The point kicked by a small (`1e-3`) and a larger (`1e-1`) Gaussian kick, `(2, n, d)`."""
    scale = jnp.asarray([1e-3, 1e-1], x.dtype)[:, None, None]
    return normalize(x[None] + scale * jax.random.normal(key, x.shape, x.dtype)[None])


def _bipartite_check(w, trace, viol, v, config, key):
    x, rho, residual, U_sum = _restart_readings(w, v, jnp.asarray(config.tau), n=config.tokens,
                                                m=config.split)
    rho, residual = np.asarray(rho), np.asarray(residual)
    valid = (residual < 1e-10) & np.array([_assumption_1(M) for M in np.asarray(U_sum)], bool)
    rho0 = np.exp(trace[0])  # smooth bound at the start (≥ ρ)
    best = _best({"valid": valid, "rho": rho})
    P, U = np.asarray(w.P)[best], np.asarray(w.U)[best]
    if valid.any():
        ys = run_layers(SelfAttentionDynamics(P, U), _kicked(x, key), config.layers, config.tau)
        dist = np.max(np.linalg.norm(np.asarray(ys) - np.asarray(x), axis=-1), axis=-1)
    else:  # no valid restart: nothing to kick
        dist = np.full((2, config.layers + 1), np.nan, rho.dtype)
    return {"trace": trace, "violation": np.max(viol), "rho": rho, "rho0": rho0, "valid": valid,
            "residual": residual, "dist_small": dist[0], "dist_large": dist[1],
            "absorbed": dist[0][-1] <= ABSORBED * dist[0][0], "P": P, "U": U}
