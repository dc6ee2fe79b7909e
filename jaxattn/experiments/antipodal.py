"""`antipodal`: antipodal clusters under the common value noise (Fedorov, Sander, Elie,
Marion, Laurière, "Clustering in Deep Stochastic Transformers", arXiv 2601.21942).

Tokens on `S^{d−1}` under `ja.SelfAttentionDynamics(P = I, U = I, β)` with
`noise=ja.ValueNoise(σ)`, run as `ja.run_layers`; per `d`, P(antipodal), the exponent at
the antipodal end and the threshold at `τ → 0` against `ja.theory`'s, and how `n > 2`
tokens end. The diffusion, each measure, its judgement and the numbers: `docs/antipodal.md`.
"""

import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._manifold import normalize
from .._noise import ValueNoise
from .._validate import too_big
from ..metrics import binomial_error, fit_crossing, fit_intercept, level_crossing, mean_error
from ..theory import antipodal_probability, antipodal_rate, antipodal_threshold
from .base import AbstractExperiment, Config, Param, Verdict
from .pieces import advance, keyed_layers
from .runner import MAX_LAYERS
from .verdicts import finite_or_none, short

#: A pair ends antipodal when `1 + ρ_T < GAP`, in one cluster when `1 − ρ_T < GAP`.
GAP = 1e-2
#: The exponent runs start at gap `1 + ρ_0 = START_GAP` and last `EXPONENT_TIME`.
START_GAP, EXPONENT_TIME = 1e-4, 4.0
#: The threshold runs: starts at gap `THRESHOLD_GAP` (far from saturation: the gap
#: would have to grow `2/THRESHOLD_GAP`-fold), each `THRESHOLD_TIME` long, at
#: `WINDOW_POINTS` values of `β` evenly across `WINDOW` times the predicted `β_c`.
THRESHOLD_GAP, THRESHOLD_TIME = 1e-8, 8.0
WINDOW, WINDOW_POINTS = (0.85, 1.15), 5
#: The largest β a run takes: the theorem's share reads `e^{2β}`, past float64 at 354.
BETA_MAX = 300.0
#: The extrapolated threshold must be within this of the predicted one (relative).
THRESHOLD_TOL = 0.05
#: P(antipodal) has settled at a `(d, β)` when its change over the last `SETTLE_PART`
#: of the horizon is within its binomial error (`ja.metrics.binomial_error`).
SETTLE_PART = 0.25
#: Where settled and past `β_c`, the measured P(antipodal) summed over `β` must be within
#: this of the theorem's `T → ∞` prediction summed alike (relative, per `d`); judged where
#: its standard error is at most half of it (so a prediction 10 % off fails).
PROBABILITY_TOL = 0.05
#: The numbers of tokens of the formations study.
FORMATION_TOKENS = (3, 4, 8)
#: Layers per compiled piece of a run (only each piece's last layer is kept).
PIECE = 100
#: Runs per block (`keyed_layers`): a program runs its systems block by block, so that
#: a run's numbers do not depend on how many runs, devices or processes share it.
BLOCK = 64


def pair_start(key, runs: int, d: int, gap: float):
    """Pairs at gap `1 + ρ = gap`: `x_2 = −x_1 cos θ + e sin θ`, `e ⊥ x_1` uniform."""
    x1, e = jnp.unstack(normalize(jax.random.normal(key, (runs, 2, d))), axis=1)
    e = normalize(e - jnp.sum(e * x1, -1, keepdims=True) * x1)
    theta = math.acos(1 - gap)  # the angle between x_2 and −x_1
    return jnp.stack([x1, -x1 * math.cos(theta) + e * math.sin(theta)], axis=1)


def gaps(x):
    """`(1 + ρ, 1 − ρ)` of pairs `(…, 2, d)`, as `|x_1 ± x_2|²/2` (no cancellation)."""
    plus = 0.5 * jnp.sum((x[..., 0, :] + x[..., 1, :]) ** 2, -1)
    minus = 0.5 * jnp.sum((x[..., 0, :] - x[..., 1, :]) ** 2, -1)
    return plus, minus


def noisy_layers(beta, sigma, x, layers: int, tau, key, piece: int = PIECE):
    """The tokens `x` (`(runs, n, d)`) after `layers` noisy layers (`ja.run_layers`,
    `ValueNoise(σ)`, run `b` with the key `jax.random.split(key_i, runs)[b]` of piece
    `i`, `key_i = fold_in(key, i)`), in pieces of at most `piece` layers, keeping only
    each piece's last layer. In a distributed run (`--distributed`) the runs' blocks
    are split over every process's devices."""
    eye = jnp.eye(x.shape[-1], dtype=x.dtype)[None]
    runs = x.shape[0]
    dyn = eqx.filter_vmap(lambda b: SelfAttentionDynamics(eye, eye, beta=b))(
        jnp.full(runs, beta, x.dtype))

    def step(i, x):
        count = min(piece, layers - i * piece)
        keys = jax.random.split(jax.random.fold_in(key, i), runs)
        return keyed_layers(dyn, x, keys, count, tau, noise=ValueNoise(sigma),
                            block=BLOCK)[:, -1], None

    return advance(step, x, -(-layers // piece), desc="", progress=False)[0]


def layers_for(time: float, tau: float) -> int:
    """The layers of step `tau` that reach `time` (at least one)."""
    return max(1, round(time / tau))


def formation(x, gap: float = GAP):
    """The end state of each system `(runs, n, d)`: `0` one cluster, `k ≥ 1` two
    antipodal groups of sizes `k ≤ n − k`, `−1` anything else. Token `i` joins token
    0's group when `1 − ⟨x_0, x_i⟩ < gap`, the other when `1 + ⟨x_0, x_i⟩ < gap`."""
    x = np.asarray(x)
    x0 = x[:, :1]
    same = 0.5 * np.sum((x - x0) ** 2, -1) < gap
    opposite = 0.5 * np.sum((x + x0) ** 2, -1) < gap
    n = x.shape[1]
    settled = np.all(same | opposite, axis=1)
    k = np.sum(opposite, axis=1)
    return np.where(settled, np.minimum(k, n - k), -1)


def exponent(beta, sigma, x0, time: float, tau: float, key, gap: float):
    """Per pair, `log((1 + ρ_T)/(1 + ρ_0))/T` after `time` of noisy layers from `x0`
    (pairs at gap `1 + ρ_0 = gap`)."""
    layers = layers_for(time, tau)
    plus, _ = gaps(noisy_layers(beta, sigma, x0, layers, tau, key))
    return np.log(np.asarray(plus) / gap) / (layers * tau)


def window_of(d: int, sigma: float) -> np.ndarray:
    """The `β` of the threshold runs: `WINDOW_POINTS` values across `WINDOW · β_c`."""
    return antipodal_threshold(d, sigma) * np.linspace(*WINDOW, WINDOW_POINTS)


class Antipodal(AbstractExperiment):
    name = "antipodal"
    distributable = True
    title = ("Antipodal clusters under common value noise (Fedorov et al. 2026): "
             "P(antipodal) of two tokens against β and d, the predicted threshold, and the "
             "formations of n > 2 tokens")
    theorem = "Fedorov et al. 2026, two-token phase transition (arXiv 2601.21942)"
    params = (
        Param("sigma", float, 1.0, "strength σ of the common value noise", 0.0),
        Param("dims", int, 3, "dimensions d = 2, 4, …, 2^dims", 1),
        Param("betas", int, 13, "number of β in (0, --beta-max]", 2),
        Param("beta_max", float, 2.6, "largest β", 0.0),
        Param("runs", int, 1000, "noisy runs per (β, d) and per formation", 10),
        Param("tau", float, 0.02, "layer step τ (the noise scaled by √τ); the threshold "
              "runs take τ/2 and τ and extrapolate to τ → 0", 0.0),
        Param("threshold_runs", int, 2000, "pairs per β and τ of the threshold runs", 10),
        Param("horizon", float, 12.0, "final time T of the probability runs", 0.0),
        Param("formation_beta", float, 2.5, "β of the n > 2 formations", 0.0),
        Param("formation_dim", int, 4, "dimension d of the n > 2 formations", 2),
    )

    def refusals(self, config):
        end = max(config.horizon, EXPONENT_TIME)
        layers = end / config.tau * 2  # the threshold runs' step is τ/2
        largest = 2**config.dims
        pairs = max(config.runs, config.threshold_runs)
        zero = [int(d) for d in 2 ** np.arange(1, config.dims + 1)
                if antipodal_threshold(int(d), config.sigma) == 0]
        return (
            (config.tau > 0.5, f"--tau must be ≤ 0.5 (a layer is one step of the SDE), got "
             f"{config.tau!r}."),
            # the pairs' tokens and the d × d noise of a block of them, float64
            too_big(8.0 * largest * (64 * largest + 6 * pairs), f"--dims {config.dims} "
                    f"(d up to {largest:,}): the noisy runs need at least",
                    "choose fewer --dims"),
            (config.beta_max > BETA_MAX, f"--beta-max {config.beta_max:g}: the theorem's share "
             f"reads e^(2β), which leaves float64 past β ≈ 354; choose --beta-max ≤ "
             f"{BETA_MAX:g}."),
            (bool(zero), f"--sigma {config.sigma:g}: the antipodal end attracts at every β > 0 "
             f"for d = {', '.join(map(str, zero))} (β_c = 0), so there is no threshold to "
             "measure; choose a smaller --sigma."),
            (antipodal_threshold(2, config.sigma) * WINDOW[1] > BETA_MAX,
             f"--sigma {config.sigma:g}: the threshold β_c = "
             f"{antipodal_threshold(2, config.sigma):.3g} puts the threshold runs past "
             f"β = {BETA_MAX:g}; choose a larger --sigma."),
            (not layers <= MAX_LAYERS, f"--tau {config.tau!r} takes {layers:.3g} layers of τ/2 "
             f"to reach T = {end:g}, more than {MAX_LAYERS} (JAX counts in int32): take a "
             "larger --tau."))

    @staticmethod
    def grid(config: Config) -> dict[str, np.ndarray]:
        """The settings' grid: the dimensions `d = 2, 4, …, 2^dims`, the `β` of the
        probability runs and the layer steps `τ/2, τ` of the threshold runs."""
        return {"dims": 2 ** np.arange(1, config.dims + 1),
                "betas": np.linspace(config.beta_max / config.betas, config.beta_max,
                                     config.betas),
                "taus": np.array([config.tau / 2, config.tau])}

    def simulate(self, config, progress):
        key = jax.random.PRNGKey(config.seed)
        data = self.grid(config)
        dims, betas, taus = [int(d) for d in data["dims"]], data["betas"], data["taus"]
        sigma, tau, runs = config.sigma, config.tau, config.runs
        data["window_betas"] = np.zeros((len(dims), WINDOW_POINTS))
        data |= {k: np.zeros((len(dims), len(betas))) for k in
                 ("p_antipodal", "p_antipodal_early", "p_consensus", "rate", "rate_se")}
        data |= {k: np.zeros((len(dims), len(taus), WINDOW_POINTS))
                 for k in ("window_rate", "window_se")}
        total = len(dims) * (len(betas) * 2 + len(taus)) + len(FORMATION_TOKENS)
        with tqdm(total=total, desc=self.name, disable=not progress, leave=False) as bar:
            for i, d in enumerate(dims):
                k_start, k_gap, k_run = jax.random.split(jax.random.fold_in(key, d), 3)
                x0 = normalize(jax.random.normal(k_start, (runs, 2, d)))
                x0_gap = pair_start(k_gap, runs, d, START_GAP)
                for j, beta in enumerate(betas):
                    k_p, k_e = jax.random.split(jax.random.fold_in(k_run, j))
                    early = layers_for((1 - SETTLE_PART) * config.horizon, tau)
                    x = noisy_layers(beta, sigma, x0, early, tau, k_p)
                    data["p_antipodal_early"][i, j] = float(np.mean(gaps(x)[0] < GAP))
                    late = layers_for(config.horizon, tau) - early
                    x = x if late < 1 else noisy_layers(beta, sigma, x, late, tau,
                                                        jax.random.fold_in(k_p, 1))
                    plus, minus = gaps(x)
                    data["p_antipodal"][i, j] = float(jnp.mean(plus < GAP))
                    data["p_consensus"][i, j] = float(jnp.mean(minus < GAP))
                    bar.update()
                    growth = exponent(beta, sigma, x0_gap, EXPONENT_TIME, tau, k_e, START_GAP)
                    data["rate"][i, j], data["rate_se"][i, j] = mean_error(growth)
                    bar.update()
                self._threshold_runs(config, data, i, d, jax.random.fold_in(key, 2000 + d),
                                     bar)
            data["formation"] = np.zeros((len(FORMATION_TOKENS), runs), dtype=np.int64)
            for i, n in enumerate(FORMATION_TOKENS):
                k_start, k_run = jax.random.split(jax.random.fold_in(key, 1000 + n))
                x = normalize(jax.random.normal(k_start, (runs, n, config.formation_dim)))
                x = noisy_layers(config.formation_beta, sigma, x,
                                 layers_for(config.horizon, tau), tau, k_run)
                data["formation"][i] = formation(x)
                bar.update()
        return data

    @staticmethod
    def _threshold_runs(config, data, i: int, d: int, key, bar) -> None:
        """The exponent at the window's `β` for each layer step of `grid`, into `data`."""
        sigma, runs = config.sigma, config.threshold_runs
        window = window_of(d, sigma)
        data["window_betas"][i] = window
        if not window[-1] > 0:  # β_c = 0: antipodes attract at every β
            data["window_rate"][i] = data["window_se"][i] = np.nan
            bar.update(len(data["taus"]))
            return
        k_start, k_run = jax.random.split(key)
        x0 = pair_start(k_start, runs, d, THRESHOLD_GAP)
        for t, tau in enumerate(data["taus"]):
            for j, beta in enumerate(window):
                growth = exponent(beta, sigma, x0, THRESHOLD_TIME, float(tau),
                                  jax.random.fold_in(k_run, 100 * t + j), THRESHOLD_GAP)
                data["window_rate"][i, t, j], data["window_se"][i, t, j] = mean_error(growth)
            bar.update()

    def thresholds(self, config, data) -> dict[str, dict]:
        """Per `d`: the predicted `β_c` (`ja.theory.antipodal_threshold`); the measured one at
        each layer step (`ja.metrics.fit_crossing` over the window) and extrapolated to `τ → 0`,
        with standard errors, and its relative error; the grid's crossing at `τ`
        (for reference); `P(antipodal)` at the largest `β`."""
        out = {}
        betas, runs = data["betas"], config.runs
        # a folder written before the early reading: NaN, never settled, so not judged
        early = data.get("p_antipodal_early", np.full_like(data["p_antipodal"], np.nan))
        for i, d in enumerate(data["dims"]):
            p = data["p_antipodal"][i, -1]
            predicted = antipodal_threshold(int(d), config.sigma)
            found = {"predicted": predicted, "at_tau": None, "at_tau_se": None,
                     "measured": None, "measured_se": None, "relative_error": None}
            if np.all(np.isfinite(data["window_rate"][i])):
                at = [fit_crossing(data["window_betas"][i], data["window_rate"][i, t],
                                   se=data["window_se"][i, t])
                      for t in range(len(data["taus"]))]
                value, se = zip(*at)  # the line through (τ, value ± se) at τ = 0
                zero, zero_se = fit_intercept(data["taus"], value, se=se)
                found |= {"at_tau": list(value), "at_tau_se": list(se),
                          "measured": zero, "measured_se": zero_se,
                          "relative_error": abs(zero / predicted - 1) if predicted else None}
            out[f"d={int(d)}"] = found | {
                "grid_crossing": finite_or_none(level_crossing(betas, data["rate"][i], falling=True,
                                                      at_start=True)),
                "step": float(betas[1] - betas[0]),
                "p_antipodal_at_beta_max": float(p),
                "p_antipodal_se": float(binomial_error(p, runs)),
                # P(antipodal) still changing at T: no T → ∞ share to hold it against
                "p_settled_at_beta_max": bool(np.isnan(early[i, -1])  # (a folder from before)
                                              or abs(p - early[i, -1]) <= binomial_error(p, runs)),
                "p_predicted_at_beta_max": antipodal_probability(betas[-1], int(d),
                                                                 config.sigma),
                **probability_check(betas, data["p_antipodal"][i],
                                    early[i], runs, int(d), config.sigma)}
        return out

    def formations(self, data) -> dict[str, dict]:
        """Per `n`: the shares of one cluster, of two antipodal groups by the smaller
        group's size `k`, and of other ends."""
        out = {}
        for n, ends in zip(FORMATION_TOKENS, data["formation"]):
            shares = {"one cluster": float(np.mean(ends == 0))}
            shares |= {f"{k}:{n - k}": float(np.mean(ends == k)) for k in range(1, n // 2 + 1)}
            out[f"n={n}"] = shares | {"other": float(np.mean(ends < 0))}
        return out

    def verdict(self, config, data):
        found = self.thresholds(config, data)
        judged = {key: _judged(t, config.runs) for key, t in found.items()
                  if 0 < t["predicted"] < data["betas"][-1]}
        missed = [f"{key}: {s.removeprefix('missed: ')}" for key, s in judged.items()
                  if s.startswith("missed")]
        status = list(judged.values())
        why = [] if missed else sorted({s for s in status if s != "held"}) or (
            [] if status else [f"no d has its predicted β_c below β = {data['betas'][-1]:g}, "
                               "so nothing was judged: raise --beta-max"])
        ok = not missed and not why
        undecided = "; ".join(UNRESOLVED.get(w, w) for w in why)
        taus = ", ".join(f"{t:g}" for t in data["taus"])
        words = "; ".join(
            f"{key}: β_c predicted {t['predicted']:.4g}, measured {_pm(t)} at τ → 0 "
            f"(at τ = {taus}: {', '.join(f'{v:.4g}' for v in t['at_tau'] or [])}; "
            f"off by {short(t['relative_error'])}, asked ≤ {THRESHOLD_TOL:g}), "
            f"P(antipodal) at β = {data['betas'][-1]:g}: "
            f"{t['p_antipodal_at_beta_max']:.3f} ± {t['p_antipodal_se']:.3f} "
            f"(T → ∞: {t['p_predicted_at_beta_max']:.3f}); P(antipodal) settled at "
            f"{t['p_settled']}/{t['p_points']} β past β_c, their sum "
            f"{short(t['p_ratio'])} ± {short(t['p_ratio_se'])} of the theorem's ("
            + (("" if t["p_within"] else "NOT ") + f"within {PROBABILITY_TOL:g}"
               if t["p_judged"] else "too few runs to judge") + ")"
            for key, t in found.items())
        forms = self.formations(data)
        two = "; ".join(f"{key}: {1 - s['one cluster'] - s['other']:.2f} antipodal"
                        for key, s in forms.items())
        line = (f"σ = {config.sigma:g}, {config.runs} runs per point: {words}. "
                f"n > 2 at β = {config.formation_beta:g}, d = {config.formation_dim}: "
                f"{two}" + (f". Against: {'; '.join(missed)}" if missed else ""))
        numbers = {"thresholds": found, "gap": GAP, "start_gap": START_GAP,
                   "exponent_time": EXPONENT_TIME, "threshold_gap": THRESHOLD_GAP,
                   "threshold_time": THRESHOLD_TIME, "threshold_tolerance": THRESHOLD_TOL,
                   "saturation": saturation(), "taus": data["taus"].tolist()}
        return Verdict(ok, line, numbers, {"formations": forms}, undecided)

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        fig, axes = plt.subplots(1, 4, figsize=(23, 5.6))
        self._draw_betas(axes[:2], config, data)
        self._draw_threshold(axes[2], config, data, self.thresholds(config, data))
        self._draw_formations(axes[3], config, data)
        return figures.save_figure(
            fig, self.stem(folder),
            f"Two tokens under common value noise σ = {config.sigma:g} ({config.runs} "
            f"runs per point, T = {config.horizon:g}, τ = {config.tau:g}): the antipodal "
            "end attracts past the predicted $\\beta_c$. Units: tokens at RMS norm 1 "
            "($|z| = \\sqrt{d}$) with scores $c\\,\\langle z_i, z_j\\rangle$ give "
            "$\\beta = c\\,d$; value noise of entry variance $s^2$ per layer of step τ "
            "gives $\\sigma = s/\\sqrt{\\tau}$")

    @staticmethod
    def _draw_betas(axes, config, data):
        """P(antipodal) and the exponent at the antipodal end against `β`, per `d`:
        measured and predicted."""
        betas, sigma = data["betas"], config.sigma
        fine = np.linspace(betas[0] / 4, betas[-1], 200)
        dodge = 0.012 * (betas[-1] - betas[0])  # equal shares of two d stay both in sight
        for i, d in enumerate(int(d) for d in data["dims"]):
            p, color, measured = data["p_antipodal"][i], f"C{i}", f"d = {d}: measured (± 1 s.e.)"
            shift = (i - (len(data["dims"]) - 1) / 2) * dodge
            axes[0].errorbar(betas + shift, p, yerr=binomial_error(p, config.runs), fmt="o",
                             ms=4, capsize=3, color=color, label=measured)
            axes[0].plot(fine, [antipodal_probability(b, d, sigma) for b in fine], color=color,
                         lw=1, ls="--", label=f"d = {d}: predicted, T → ∞")
            axes[0].axvline(antipodal_threshold(d, sigma), color=color, lw=0.8, ls=":")
            axes[1].errorbar(betas, data["rate"][i], yerr=data["rate_se"][i], fmt="o", ms=4,
                             capsize=3, color=color, label=measured)
            axes[1].plot(fine, antipodal_rate(fine, d, sigma), color=color, lw=1,
                         label=rf"d = {d}: predicted $\lambda$")
        axes[0].set(xlabel=r"$\beta$", ylabel=r"P(antipodal): $1+\rho_T$ < " + f"{GAP:g}",
                    title=r"P(antipodal), uniform starts; dotted: predicted $\beta_c$")
        axes[1].axhline(0, color="k", lw=0.8)
        axes[1].axhline(saturation(), color="0.4", ls=(0, (1, 2)), lw=1.0,
                        label=rf"saturation: $\log(2/10^{{{math.log10(START_GAP):.0f}}})/"
                              rf"{EXPONENT_TIME:g}$ = {saturation():.3g} (gap reaches 2)")
        axes[1].set(xlabel=r"$\beta$", ylabel=r"$\log((1+\rho_T)/(1+\rho_0))\,/\,T$",
                    title=rf"exponent at $\rho=-1$ ($1+\rho_0$ = {START_GAP:g}, "
                          rf"T = {EXPONENT_TIME:g}): attracts below 0")
        for ax in axes:
            figures.legend_below(ax, ncol=2)

    @staticmethod
    def _draw_threshold(ax, config, data, found):
        """The measured threshold over `β_c` at each layer step, the straight line to
        `τ → 0` and its value there (± 1 s.e.), against the tolerance band."""
        taus = data["taus"]
        ax.axhspan(1 - THRESHOLD_TOL, 1 + THRESHOLD_TOL, color="0.9",
                   label=f"predicted $\\beta_c$ ± {THRESHOLD_TOL:.0%}")
        ax.axhline(1, color="k", lw=0.8)
        for i, t in enumerate(found.values()):
            if t["measured"] is None:
                continue
            c, d = t["predicted"], int(data["dims"][i])
            ax.errorbar(taus, np.asarray(t["at_tau"]) / c, yerr=np.asarray(t["at_tau_se"]) / c,
                        fmt="o", ms=5, capsize=3, color=f"C{i}",
                        label=f"d = {d}: measured at τ (± 1 s.e.)")
            ax.plot([taus[0], taus[-1]], np.asarray(t["at_tau"]) / c, color=f"C{i}", lw=1,
                    ls="--")
            at = -0.02 * taus[-1] * i  # side by side at τ = 0
            ax.plot([at, taus[0]], [t["measured"] / c, t["at_tau"][0] / c], color=f"C{i}",
                    lw=0.6, ls=":")
            ax.errorbar([at], [t["measured"] / c], yerr=[t["measured_se"] / c], fmt="D", ms=7,
                        capsize=4, color=f"C{i}", mfc="white",
                        label=f"d = {d}: τ → 0, {t['measured']:.3f} (β_c = {c:.3f})")
        ax.set(xlabel="layer step τ", ylabel=r"measured threshold / predicted $\beta_c$",
               xlim=(-0.12 * taus[-1], 1.08 * taus[-1]),
               title=rf"threshold: zero of the exponent (from $1+\rho_0$ = "
                     rf"{THRESHOLD_GAP:g}, T = {THRESHOLD_TIME:g}), τ → 0")
        figures.legend_below(ax, ncol=1)

    @staticmethod
    def _draw_formations(ax, config, data):
        runs = config.runs
        width, groups = 0.8 / len(FORMATION_TOKENS), range(1, max(FORMATION_TOKENS) // 2 + 1)
        labels = ["one cluster"] + [f"k = {k}" for k in groups] + ["other"]
        codes, xs = [0, *groups, -1], np.arange(len(labels))
        for i, (n, ends) in enumerate(zip(FORMATION_TOKENS, data["formation"])):
            share = np.array([np.mean(ends == c) if c <= n // 2 else np.nan for c in codes])
            ax.bar(xs + (i - 1) * width, share, width, yerr=binomial_error(share, runs),
                   capsize=2, color=f"C{i + 3}", label=f"n = {n}")
        ax.set_xticks(xs, labels)
        ax.set(ylabel="share of runs", ylim=(0, 1),
               title=f"n tokens, β = {config.formation_beta:g}, d = "
                     f"{config.formation_dim}: antipodal groups k : n − k")
        figures.legend_below(ax, ncol=3)


def probability_check(betas, p, p_early, runs: int, d: int, sigma: float) -> dict:
    """P(antipodal) of one `d` against the theorem's `T → ∞` prediction where it is
    positive and the measure has settled: the ratio of their sums, its standard error,
    whether it is judged and whether within `PROBABILITY_TOL` (`docs/antipodal.md`, "Has
    P(antipodal) settled, and is it the theorem's?")."""
    predicted = np.array([antipodal_probability(b, d, sigma) for b in betas])
    # the error of the observed share, or of the theorem's where larger: a share of 0 in
    # 10 runs has an observed error of 0, and read "0 ± 0 of the theorem's" (exit 3)
    se = np.maximum(binomial_error(p, runs), binomial_error(predicted, runs))
    settled = np.abs(np.asarray(p) - np.asarray(p_early)) <= se
    judged = settled & (predicted > 0)
    total = predicted[judged].sum()
    ratio = float(np.asarray(p)[judged].sum() / total) if total > 0 else math.nan
    ratio_se = float(np.sqrt(np.sum(se[judged] ** 2)) / total) if total > 0 else math.nan
    judge = bool(judged.any()) and ratio_se <= PROBABILITY_TOL / 2
    return {"p_judged": judge, "p_within": not judge or abs(ratio - 1) <= PROBABILITY_TOL,
            "p_settled": int(settled[predicted > 0].sum()),
            "p_points": int((predicted > 0).sum()), "p_unsettled_at": [
                float(b) for b in np.asarray(betas)[~settled]],
            "p_ratio": finite_or_none(ratio), "p_ratio_se": finite_or_none(ratio_se)}


def saturation() -> float:
    """The largest exponent the grid's runs can read: the gap grows from `START_GAP`
    to at most 2 in `EXPONENT_TIME`."""
    return math.log(2 / START_GAP) / EXPONENT_TIME


#: Why a dimension is undecided (`_judged`), and what would decide it.
UNRESOLVED = {
    "threshold": f"a threshold whose standard error exceeds half the tolerance "
                 f"({THRESHOLD_TOL:g}), or within two of β_c but off by more than it: "
                 "raise --threshold-runs",
    "antipodal": "P(antipodal) at the largest β not told from 0, nor from the theorem's "
                 "share: raise --runs",
    "unsettled": "P(antipodal) at the largest β not told from 0 and still changing at the "
                 "horizon (its T → ∞ share is not reached): raise --horizon",
}


def _judged(t: dict, runs: int) -> str:
    """One dimension's outcome: `"held"`; `"missed: why"` (a threshold off by more than
    `THRESHOLD_TOL` and two standard errors, none measured, `P(antipodal)` not as
    predicted, or at the largest β more than three standard errors below the theorem's
    share); else why it is undecided (`UNRESOLVED`): the threshold's standard error
    above half the tolerance, or off by more than it within two standard errors; no
    antipodal end told from none, within the errors of the theorem's share, or still
    changing at the horizon."""
    error = t["relative_error"]
    if error is None:
        return "missed: no threshold measured"
    if not t["p_within"]:
        return "missed: P(antipodal) past β_c not the theorem's"
    held = error <= THRESHOLD_TOL and t["measured_se"] <= THRESHOLD_TOL / 2 * t["predicted"]
    close = abs(t["measured"] - t["predicted"]) <= 2 * t["measured_se"]
    if not (held or close or error <= THRESHOLD_TOL):
        return (f"missed: the threshold off by more than {THRESHOLD_TOL:g} and two standard "
                "errors")
    p, expected = t["p_antipodal_at_beta_max"], t["p_predicted_at_beta_max"]
    if not p > 2 * t["p_antipodal_se"]:  # no antipodal end told from none
        if not t["p_settled_at_beta_max"]:
            return "unsettled"  # a short run: the share at T is not yet the T → ∞ one
        # against only beyond three standard errors (at two, 20 runs at T = 2 read
        # 0.150 ± 0.080 against 0.388 as a contradiction)
        return ("missed: P(antipodal) at the largest β more than three standard errors below "
                "the theorem's T → ∞ share" if expected - p > 3 * binomial_error(expected, runs)
                else "antipodal")
    return "held" if held else "threshold"


def _pm(t: dict) -> str:
    if t["measured"] is None:
        return "—"
    return f"{t['measured']:.4g} ± {t['measured_se']:.2g}"


