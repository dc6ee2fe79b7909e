"""`adversarial-weights`: symmetric `U` and bounded `P` (causal, one head) that
maximise `E(T)`, found by gradient ascent through the flow, checked against
Theorem 5.2 over a long run."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._horizon import CONSENSUS_TOL
from .._programs import kept_jit
from ..explore import Constraints, slow_consensus
from ..metrics import misalignment
from ..theory import predict
from . import paper001
from .base import Param
from .search import SEARCH_PARAMS, AbstractSearch, adam, draw_trace, long_run, searched
from .verdicts import UNSTABLE_TOL, outcome_words, short, trend_kind


class AdversarialWeights(AbstractSearch):
    name = "adversarial-weights"
    title = "symmetric U, bounded P (causal, one head) that maximise E(T)"
    theorem = "5.2"
    params = SEARCH_PARAMS + (
        Param("tokens", int, 8, "tokens n", 2),
        Param("dim", int, 3, "dimension d", 2),
        Param("horizon", float, 10.0, "horizon T of the objective E(x(T))", 0.0),
        Param("u_bound", float, 1.0, "spectral-norm bound of U", 0.0),
        Param("p_bound", float, 2.0, "spectral-norm bound of P", 0.0),
        Param("gap", float, 0.02, "kept λ₁ − λ₂ ≥ gap and λ₁ ≥ gap for U", 0.0),
        # 40: the default search's slowest approach reaches 1e-4 at t ≈ 237 = 24 T
        Param("long", float, 40.0, "the check runs to long × horizon", 1.0),
        Param("saves", int, 50, "saved times of the objective's trajectory", 1),
    )

    def refusals(self, config):
        return ((config.gap > config.u_bound,
                 f"--gap {config.gap:g} cannot be kept with --u-bound {config.u_bound:g}: "
                 "the search keeps λ₁(U) ≥ gap (Theorem 5.2's positive λ₁) and U's "
                 f"eigenvalues in [−u_bound, u_bound]; lower --gap to at most "
                 f"{config.u_bound:g} or raise --u-bound."),)

    def explore(self, config, setting, progress):
        U, v1, P, x0, kq = _problem(config.seed, config.dim, config.tokens)
        dyn = SelfAttentionDynamics(P, U[None], causal=True)
        cons = Constraints(train=("P", "U"), norm="spectral",
                           bound={"P": config.p_bound, "U": config.u_bound},
                           symmetric=("U",), top_eigenvector=v1, gap=config.gap)
        res = slow_consensus(dyn, init=x0, target="weights", objective="final",
                             horizon=config.horizon, steps=config.steps,
                             restarts=config.restarts, saves=config.saves, weight_noise=0.5,
                             optimizer=adam(config), constraints=cons, key=kq, progress=progress)
        gaps, lam1 = _gap(np.asarray(res.weights.U.value)[:, 0])
        ts, ys, complete = long_run(res.dyn, x0, config.long * config.horizon)
        ts0, ys0, complete0 = long_run(dyn, x0, config.long * config.horizon)
        end = min(len(ts), len(ts0))  # both on the times the two runs reached
        ts, ys, ys0 = ts[:end], ys[:end], ys0[:end]
        pred = predict(res.dyn, x0)
        best_U = np.asarray(res.dyn.U.value[0])
        dist = _distance_to(v1, x0, ys)
        return searched(res) | {
            "x0": x0, "P": res.dyn.P.value, "U": res.dyn.U.value, "v1": v1,
            "long_complete": complete and complete0, "dist_long0": _distance_to(v1, x0, ys0),
            "gaps": gaps, "lam1": lam1, "gap0": _gap(np.asarray(U))[0],
            "eig_best": np.linalg.eigvalsh(best_U), "eig0": np.linalg.eigvalsh(np.asarray(U)),
            "P_norm": np.linalg.norm(np.asarray(res.dyn.P.value[0]), 2), "ts_long": ts,
            "E_long": misalignment(ys), "E_long0": misalignment(ys0),
            "dist_long": dist, "limit_gap": dist[-1],
            "in_domain": bool(np.asarray(pred.in_domain)), "values": res.values,
        }

    def judge_setting(self, config, found, setting):
        gain, best_gap, trend, kind = _judged(found)
        eig = ", ".join(f"{e:.3f}" for e in found["eig_best"][::-1])
        return kind, (
            f"E(T) {short(found['value'])} vs the restarts' start weights (mean) "
            f"{short(np.mean(found['baseline']))} "
            f"(×{gain:.3g}); spectral gap λ₁−λ₂: {float(found['gap0']):.3g} → {best_gap:.3g} "
            f"(all restarts: {np.min(found['gaps']):.3g}–{np.max(found['gaps']):.3g}; floor "
            f"{config.gap:g}); eigenvalues of U {eig}; ‖P‖₂ {float(found['P_norm']):.3f}; "
            f"run to {config.long:g}T: {trend.describe('max(1 − ⟨x_i, v₁⟩)')} "
            f"({'consensus at v₁, ' if kind == 'agrees' else ''}"
            f"{outcome_words(kind, '5.2')})")

    def numbers(self, config, data):
        gain, best_gap, trend, _ = _judged(data)
        return {"gain": gain, "gap_best": best_gap,
                "limit_gap": float(data["limit_gap"])} | trend.numbers()

    def draw(self, config, data, folder: Path):
        fig, axs = figures.pyplot().subplots(1, 3, figsize=(14, 4.2))
        draw_trace(axs[0], data["trace"], data["baseline"], "$E(x(T))$",
                   "the restarts' start weights (mean)")
        axs[0].set_title("optimisation over $(U, P)$")
        x = np.arange(len(data["eig0"]))
        axs[1].bar(x - 0.2, data["eig0"][::-1], 0.4, label="start")
        axs[1].bar(x + 0.2, data["eig_best"][::-1], 0.4, label="optimised")
        axs[1].set_xticks(x, [f"$\\lambda_{i + 1}$" for i in x])
        axs[1].axhline(0, color="k", lw=0.6)
        axs[1].set_title(f"eigenvalues of $U$ ($\\|U\\|_2 \\leq {config.u_bound:g}$, "
                         f"gap $\\geq {config.gap:g}$)")
        axs[1].legend(fontsize=8)
        # the distance the verdict judges (1 − ⟨x, v₁⟩ as computed resolves ~ε: order 1)
        if "dist_long0" in data:  # not in a run folder written before it was saved
            figures.draw_decay(axs[2], data["ts_long"], data["dist_long0"], order=1,
                               color="0.5", label="start weights")
        figures.draw_decay(axs[2], data["ts_long"], data["dist_long"], order=1,
                           color="tab:red", label="optimised weights")
        axs[2].axvline(config.horizon, color="k", ls=":", lw=1, label="horizon $T$")
        axs[2].set(ylabel=r"$\max_i\,[\,1-\langle x_i(t), v_1\rangle\,]$",
                   title=f"same start, run to {config.long:g}$T$: distance to $v_1$")
        axs[2].legend(fontsize=8)
        return figures.save_figure(fig, self.stem(folder),
                                 "Weights that slow consensus (causal, one head, symmetric $U$)")


def _judged(found):
    """The search's gain over its start, the spectral gap of its best restart, the
    trend of the distance to `v₁` and the verdict's kind."""
    gain = float(found["value"] / np.mean(found["baseline"]))
    best_gap = float(found["gaps"][np.argmax(found["values"])])
    # a token still near the equator ⟨x, v₁⟩ = 0 (distance ≈ 1): Theorem 5.2's unstable
    # equilibria, where a stall is a plateau (`run_kind`)
    unstable = abs(1 - float(found["limit_gap"])) < UNSTABLE_TOL
    trend, kind = trend_kind(found["ts_long"], found["dist_long"],
                             found["limit_gap"] < CONSENSUS_TOL, found["in_domain"], unstable)
    return gain, best_gap, trend, kind


@kept_jit(static_argnames=("d", "n"))  # one program (op by op: ~20)
def _problem(seed, d, n):
    """`(U, v₁, P, x₀, key)`: `U` symmetric with eigenvalues `linspace(1, −0.5, d)` and
    top eigenvector `v₁`, `P` uniform in `[−1, 1]`, `n` tokens in `v₁`'s hemisphere,
    and the search's key."""
    kq, ku, kx = jax.random.split(jax.random.PRNGKey(seed), 3)
    dtype = jnp.result_type(float)
    basis, _ = jnp.linalg.qr(jax.random.normal(ku, (d, d), dtype))
    U = (basis * jnp.asarray(np.linspace(1.0, -0.5, d))[None, :]) @ basis.T
    P = jax.random.uniform(kq, (1, d, d), dtype, -1.0, 1.0)
    return U, basis[:, 0], P, paper001.hemisphere_of(kx, basis[:, 0], n), kq


def _gap(U):
    lam = np.linalg.eigvalsh(np.asarray(U))
    return lam[..., -1] - lam[..., -2], lam[..., -1]


def _distance_to(v1, x0, ys):
    """`max_i (1 − ⟨x_i(t), ±v₁⟩)` over the saved times, `v₁` on the side of `x₁(0)`."""
    v1 = np.asarray(v1) * np.sign(np.asarray(x0)[0] @ np.asarray(v1))
    return np.max(1 - np.asarray(ys) @ v1, axis=-1)
