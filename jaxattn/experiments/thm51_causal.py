"""`thm51-causal`: causal attention, 50 tokens on S⁴⁹⁹, 100 starts in one batch
(paper 001 §6.1.2, Fig. 4, Theorem 5.1).

With every `U_η = I` the tokens stay in the span of their start, so each start is
integrated in those coordinates (`paper001.span_dynamics`, exact): 50 × 50 instead
of 50 × 500 per sample.
"""

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._artifacts import figures
from .._flow import solve_flow
from .._horizon import CONSENSUS_TOL, Horizon
from .._layers import run_layers
from .._manifold import normalize
from .._precision import matmul
from ..metrics import consensus_time, misalignment
from ..theory import predict
from . import paper001
from .base import BETA, Param
from .pieces import advance, shift_time
from .theorem import AbstractTheoremExperiment, Evidence
from .verdicts import UNSTABLE_TOL, short


class CausalExperiment(AbstractTheoremExperiment):
    name = "thm51-causal"
    title = "causal, 50 tokens on S⁴⁹⁹, 2 heads, U = I, 100 starts: all tokens → x₁(0)"
    theorem = "5.1"
    sweepable = True
    params = (
        Param("tokens", int, 50, "number of tokens n (≤ dim)", 2),
        Param("dim", int, 500, "token dimension d", 2),
        Param("heads", int, 2, "number of heads h", 1),
        BETA,
        Param("samples", int, 100, "initial conditions, in one batch", 1),
        Param("horizon", float, 20.0, "final time T", 0.0),
        Param("saves", int, 400, "number of saved time intervals of the flow", 1),
        Param("tau", float, 0.1, "layer step τ of --discrete", 0.0),
        Param("amplitude", float, 2.0, "a_k ~ U[0, amplitude]", 0.0),
        Param("max_freq", float, 2.0, "ω_k ~ U[0, max_freq·π]", 0.0),
    )
    reached_words = {"agrees": "consensus at the first token, "}

    grid_notes = {"heads": paper001.HEADS_NOTE}

    def setup(self, key, config):
        """The `paper001.CausalWeights` of the model (`paper001.causal_dynamics`) and
        `samples` starts `(samples, tokens, dim)` of unit tokens; a sweep's instance
        is the run with `--samples 1`. `amplitude` and `max_freq` may be traced."""
        k_w, k_x = jax.random.split(key)
        weights = paper001.causal_weights(
            k_w, config.dim, config.heads, config.amplitude, config.max_freq
        )
        shape = (config.samples, config.tokens, config.dim)
        x0 = normalize(jax.random.uniform(k_x, shape, jnp.result_type(float), -1.0, 1.0))
        return weights, x0

    def refusals(self, config):
        return ((config.tokens > config.dim, f"--tokens ({config.tokens}) must be ≤ --dim "
                 f"({config.dim}): the tokens must be linearly independent for the span "
                 "coordinates."), *super().refusals(config))

    def instance(self, key, config):
        """`--samples 1`, run in the span coordinates of its start, as the experiment
        runs it: `x = Y X₀`, `Y(0) = I`, on the ellipsoid `E_G`."""
        weights, x0 = self.setup(key, config | {"samples": 1})
        dyn, G = paper001.span_dynamics(weights, x0[0])
        y0 = jnp.eye(x0.shape[-2], dtype=x0.dtype)
        return dyn, y0, lambda ys: paper001.span_misalignment(ys, G)

    def prediction(self, config, weights, x0):
        return predict(paper001.with_beta(paper001.causal_dynamics(weights), config.beta), x0,
                       times=np.linspace(0.0, config.horizon, 21))

    def evolve(self, config, weights, x0, pred, *, discrete, progress):
        desc = f"{self.name}: {'layers' if discrete else 'flow'}"
        ts, E, gap, xT = _run(config, weights, x0, discrete=discrete, progress=progress,
                              desc=desc)
        run = {"ts": ts, "E": E, "gap": gap, "agrees": pred.check(xT, tol=CONSENSUS_TOL)}
        # the flow's final E from the tokens themselves: a check of the span coordinates
        return run if discrete else run | {"E_direct": misalignment(xT)}

    def evidence(self, config, run):
        E_final, agrees, inside = run["E"][:, -1], run["agrees"], run["in_domain"]
        t_cons = np.asarray(consensus_time(run["ts"], run["E"], CONSENSUS_TOL))
        numbers = {"final_E_max": float(E_final.max()),
                   "final_gap_max": float(run["gap"][:, -1].max()),
                   "agree": int(agrees.sum()), "samples": len(agrees),
                   "in_domain": int(inside.sum()),
                   "consensus_time_median": float(np.median(t_cons)),
                   "consensus_time_max": float(t_cons.max())}
        covered = str(run["theorem"]) == "5.1"
        # a token near −x₁ (x₁ stays put): Theorem 5.1's unstable equilibria, a plateau
        unstable = run["gap"][:, -1] > 2 - UNSTABLE_TOL
        return Evidence(run["gap"], agrees, inside & covered, numbers, unstable=unstable)

    def describe(self, config, run, evidence, judged):
        n = evidence.numbers
        line = (f"{n['agree']}/{n['samples']} starts end at x₁(0) (max final E = "
                f"{short(n['final_E_max'])}, max 1 − ⟨x_i, x₁(0)⟩ = {short(n['final_gap_max'])}"
                f"; tolerance {CONSENSUS_TOL:g})")
        if judged.trend is not None:
            line += (f"; {judged.count('not_converged')} not converged, "
                     f"{judged.count('contradicts')} stalled (slowest: "
                     f"{judged.trend.describe('1 − ⟨x_i, x₁(0)⟩')})")
        line += f": {self.words(judged.kind)}"
        if np.isfinite(n["consensus_time_max"]):
            line += f"; E < {CONSENSUS_TOL:g} by t = {short(n['consensus_time_max'])}"
        return line

    def draw(self, config, data, folder: Path):
        fig, axes = figures.pyplot().subplots(1, 3, figsize=(14, 4.2))
        runs = self.drawn_runs(config, data)
        # one set of bin edges for the flow and the layers: their bars compare
        times = np.concatenate([np.asarray(consensus_time(r.run["ts"], r.run["E"],
                                                          CONSENSUS_TOL)) for r in runs])
        times = times[np.isfinite(times)]
        edges = np.histogram_bin_edges(times, bins=20) if times.size else 20
        for run, label, color, *_ in runs:
            ts, E, gap = run["ts"], run["E"], run["gap"]
            # the gap 1 − ⟨x_i, x₁(0)⟩ as computed resolves ~ε (first order), E ~ε²
            for ax, values, order in ((axes[0], E, 2), (axes[1], gap, 1)):
                figures.draw_decay(ax, ts, values, order=order, color=color, lw=0.6, alpha=0.35,
                                 label=f"{label} ({E.shape[0]} starts)")
            t_cons = np.asarray(consensus_time(ts, E, CONSENSUS_TOL))
            axes[2].hist(t_cons[np.isfinite(t_cons)], bins=edges, color=color, alpha=0.6,
                         label=label)
        figures.integer_ticks(axes[2].yaxis)  # a count of starts
        axes[0].set(ylabel="misalignment $E(x(t))$ (eq. 25)",
                    title="Fig. 4: $E(t)$ for every start")
        # square brackets outside: "⟩)" read as a stray parenthesis "))"
        axes[1].set(ylabel=r"$\max_i\,[\,1-\langle x_i(t),\, x_1(0)\rangle\,]$",
                    title="distance to the first token's start")
        axes[2].set(xlabel=f"time at which $E < 10^{{{int(np.log10(CONSENSUS_TOL))}}}$",
                    ylabel="number of starts", title="consensus time")
        for ax in axes[:2]:
            figures.opaque(ax.legend(fontsize=8))
        figures.legend_below(axes[2], ncol=2)  # over the bars it would hide them
        title = (f"Theorem 5.1 — causal, {config.tokens} tokens on $S^{{{config.dim - 1}}}$, "
                 f"h = {config.heads}, seed {config.seed}")
        return figures.save_figure(fig, self.stem(folder), title)


@jax.jit
@jax.vmap
def _measures(ys, G):
    """Every start's final state, `E` and the gap `max_i (1 − ⟨x_i, x₁(0)⟩)` of its
    reduced states `(T, n, n)`."""
    # ⟨x_i(t), x₁(0)⟩ since x₁(0) = e₁ in these coordinates; a measure: true float32.
    to_first = matmul(ys, G, "float32")[..., :, 0]
    return ys[-1], (paper001.span_misalignment(ys, G), 1 - jnp.min(to_first, axis=-1))


def _run(config, weights, x0, *, discrete, progress, desc):
    B, n, _ = x0.shape
    y0 = jnp.broadcast_to(jnp.eye(n, dtype=x0.dtype), (B, n, n))
    horizon = Horizon(config.horizon)
    steps = horizon.num_layers(config.tau) if discrete else config.saves
    ts = horizon.layer_times(config.tau) if discrete else horizon.save_times(steps)
    pieces = Horizon.pieces(steps)
    m = steps // pieces
    # Every start's model in its span coordinates, built once as one stacked model
    # (every leaf batched: `weights`' too), run on concrete tokens (checked on the host).
    dyn, G = eqx.filter_jit(eqx.filter_vmap(lambda x: paper001.span_dynamics(weights, x)))(x0)
    dyn = paper001.with_beta(dyn, config.beta)
    tau = jnp.asarray(config.tau, x0.dtype)  # an array: one compile serves every piece

    def step(k, y):
        if discrete:
            ys = run_layers(shift_time(dyn, k * m * tau), y, m, tau, strategy="general")
        else:
            ys = solve_flow(dyn, y, jnp.asarray(ts[k * m : (k + 1) * m + 1]),
                            strategy="general")
        return _measures(ys, G)

    y_final, outs = advance(step, y0, pieces, desc=desc, progress=progress)
    E, gap = (jnp.concatenate([o[i][:, (k > 0) :] for k, o in enumerate(outs)], axis=1)
              for i in (0, 1))
    return ts, E, gap, matmul(y_final, x0, "float32")  # x(T) = Y(T) X₀
