"""`antipodal`: antipodal clusters under the common value noise (Fedorov, Sander, Elie,
Marion, Laurière, "Clustering in Deep Stochastic Transformers", arXiv 2601.21942).

Tokens on the unit sphere `S^{d−1}` under `ja.SelfAttentionDynamics(P = I, U = I, β)`
with `noise=ja.ValueNoise(σ)`: one matrix Brownian motion per system, shared by its
tokens (`dx_i = v_i dt + σ P_{x_i} dB_t m_i`, Itô, `m_i = Σ_j α_ij x_j`), run as
`ja.run_layers` (the noise scaled by `√τ`). For two tokens the cosine `ρ = ⟨x_1, x_2⟩`
is a one-dimensional diffusion (`ja.theory.antipodal_drift`, `antipodal_diffusion`;
`docs/noise.md`, "Antipodal clusters"): consensus `ρ = 1` always attracts, and the
antipodal end `ρ = −1` attracts with positive probability exactly when its exponent
`ja.theory.antipodal_rate(β, d, σ) < 0`, i.e. past `ja.theory.antipodal_threshold(d, σ)`
in `β`. The run measures, per dimension `d`:

- `P(antipodal)`: the share of `runs` pairs from independent uniform starts whose
  gap `1 + ρ` (as `|x_1 + x_2|²/2`, no cancellation) ends below `GAP`, with its
  binomial standard error, beside `ja.theory.antipodal_probability` (the scale function's
  `T → ∞` prediction from the same starts);
- the exponent at the antipodal end: the mean of `log((1 + ρ_T)/(1 + ρ_0))/T_e` from
  starts at gap `START_GAP` (`T_e = EXPONENT_TIME`), against `antipodal_rate`; the
  measured threshold is where its linear interpolation over `β` crosses 0;

and, for `n = 3, 4, 8` tokens at `--formation-beta` in `--formation-dim`, how often
the tokens end as one cluster, as two antipodal groups (and of which sizes) or
otherwise (`formation`).
"""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._app import figures
from .._dynamics import SelfAttentionDynamics
from .._layers import run_layers
from .._manifold import normalize
from .._noise import ValueNoise
from ..theory import (
    antipodal_probability,
    antipodal_rate,
    antipodal_threshold,
)
from .base import AbstractExperiment, Param, Verdict
from .pieces import advance
from .verdicts import short

#: A pair ends antipodal when `1 + ρ_T < GAP`, in one cluster when `1 − ρ_T < GAP`.
GAP = 1e-2
#: The exponent runs start at gap `1 + ρ_0 = START_GAP` and last `EXPONENT_TIME`.
START_GAP, EXPONENT_TIME = 1e-4, 4.0
#: The numbers of tokens of the formations study.
FORMATION_TOKENS = (3, 4, 8)
#: Layers per compiled piece of a run (only each piece's last layer is kept).
PIECE = 100


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
    `ValueNoise(σ)`, each run its own key), in pieces of at most `piece` layers (each
    with its key `fold_in(key, i)`), keeping only each piece's last layer."""
    eye = jnp.eye(x.shape[-1], dtype=x.dtype)[None]
    dyn = SelfAttentionDynamics(eye, eye, beta=beta)

    def step(i, x):
        count = min(piece, layers - i * piece)
        return run_layers(dyn, x, count, tau, noise=ValueNoise(sigma),
                          key=jax.random.fold_in(key, i))[:, -1], None

    return advance(step, x, -(-layers // piece), desc="", progress=False)[0]


def layers_for(time: float, tau: float) -> int:
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


def binomial_se(p, runs: int):
    """The standard error `√(p(1 − p)/runs)` of a share `p` of `runs`."""
    p = np.asarray(p, dtype=float)
    return np.sqrt(p * (1 - p) / runs)


def zero_crossing(betas, values) -> float:
    """The first `β` where the linear interpolation of `values` over `betas` goes from
    `≥ 0` to `< 0`; NaN if it never does."""
    betas, values = np.asarray(betas, float), np.asarray(values, float)
    for i in range(len(betas) - 1):
        v0, v1 = values[i], values[i + 1]
        if v0 >= 0 > v1:
            return float(betas[i] + (betas[i + 1] - betas[i]) * v0 / (v0 - v1))
    return float(betas[0]) if values.size and values[0] < 0 else math.nan


def dims_of(config) -> list[int]:
    return [2 ** (k + 1) for k in range(config["dims"])]


def betas_of(config) -> np.ndarray:
    return np.linspace(config["beta_max"] / config["betas"], config["beta_max"],
                       config["betas"])


class Antipodal(AbstractExperiment):
    name = "antipodal"
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
        Param("tau", float, 0.02, "layer step τ (the noise scaled by √τ)", 0.0),
        Param("horizon", float, 12.0, "final time T of the probability runs", 0.0),
        Param("formation_beta", float, 2.5, "β of the n > 2 formations", 0.0),
        Param("formation_dim", int, 4, "dimension d of the n > 2 formations", 2),
    )

    def simulate(self, config, progress):
        if config["tau"] > 0.5:
            raise ValueError(f"--tau must be ≤ 0.5 (a layer is one step of the SDE), got "
                             f"{config['tau']!r}.")
        key = jax.random.PRNGKey(config["seed"])
        dims, betas, runs = dims_of(config), betas_of(config), config["runs"]
        sigma, tau = config["sigma"], config["tau"]
        shape = (len(dims), len(betas))
        data = {"dims": np.asarray(dims), "betas": betas, "p_antipodal": np.zeros(shape),
                "p_consensus": np.zeros(shape), "rate": np.zeros(shape),
                "rate_se": np.zeros(shape)}
        total = len(dims) * len(betas) * 2 + len(FORMATION_TOKENS)
        with tqdm(total=total, desc=self.name, disable=not progress, leave=False) as bar:
            for i, d in enumerate(dims):
                k_start, k_gap, k_run = jax.random.split(jax.random.fold_in(key, d), 3)
                x0 = normalize(jax.random.normal(k_start, (runs, 2, d)))
                x0_gap = pair_start(k_gap, runs, d, START_GAP)
                for j, beta in enumerate(betas):
                    k_p, k_e = jax.random.split(jax.random.fold_in(k_run, j))
                    plus, minus = gaps(noisy_layers(beta, sigma, x0,
                                                    layers_for(config["horizon"], tau), tau, k_p))
                    data["p_antipodal"][i, j] = float(jnp.mean(plus < GAP))
                    data["p_consensus"][i, j] = float(jnp.mean(minus < GAP))
                    bar.update()
                    layers = layers_for(EXPONENT_TIME, tau)
                    plus, _ = gaps(noisy_layers(beta, sigma, x0_gap, layers, tau, k_e))
                    growth = np.log(np.asarray(plus) / START_GAP) / (layers * tau)
                    data["rate"][i, j] = growth.mean()
                    data["rate_se"][i, j] = growth.std(ddof=1) / math.sqrt(runs)
                    bar.update()
            data["formation"] = np.zeros((len(FORMATION_TOKENS), runs), dtype=np.int64)
            for i, n in enumerate(FORMATION_TOKENS):
                k_start, k_run = jax.random.split(jax.random.fold_in(key, 1000 + n))
                x = normalize(jax.random.normal(k_start, (runs, n, config["formation_dim"])))
                x = noisy_layers(config["formation_beta"], sigma, x,
                                 layers_for(config["horizon"], tau), tau, k_run)
                data["formation"][i] = formation(x)
                bar.update()
        return data

    def thresholds(self, config, data) -> dict[str, dict]:
        """Per `d`: the predicted `β_c`, the measured one (the zero crossing of the
        measured exponent) and the grid step, and `P(antipodal)` at the largest `β`."""
        out = {}
        betas, runs = data["betas"], config["runs"]
        for i, d in enumerate(data["dims"]):
            p = data["p_antipodal"][i, -1]
            out[f"d={int(d)}"] = {
                "predicted": antipodal_threshold(int(d), config["sigma"]),
                "measured": _json(zero_crossing(betas, data["rate"][i])),
                "step": float(betas[1] - betas[0]),
                "p_antipodal_at_beta_max": float(p),
                "p_antipodal_se": float(binomial_se(p, runs)),
                "p_predicted_at_beta_max": antipodal_probability(betas[-1], int(d),
                                                                 config["sigma"])}
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
        ok = all(t["measured"] is not None and
                 abs(t["measured"] - t["predicted"]) <= t["step"]
                 and t["p_antipodal_at_beta_max"] > 2 * t["p_antipodal_se"]
                 for t in found.values() if t["predicted"] < data["betas"][-1])
        words = "; ".join(
            f"{key}: β_c predicted {t['predicted']:.3g}, measured {short(t['measured'])} "
            f"(grid step {t['step']:.2g}), P(antipodal) at β = {data['betas'][-1]:g}: "
            f"{t['p_antipodal_at_beta_max']:.3f} ± {t['p_antipodal_se']:.3f} "
            f"(T → ∞: {t['p_predicted_at_beta_max']:.3f})" for key, t in found.items())
        forms = self.formations(data)
        two = "; ".join(f"{key}: {1 - s['one cluster'] - s['other']:.2f} antipodal"
                        for key, s in forms.items())
        line = (f"σ = {config['sigma']:g}, {config['runs']} runs per point: {words}. "
                f"n > 2 at β = {config['formation_beta']:g}, d = {config['formation_dim']}: "
                f"{two}")
        numbers = {"thresholds": found, "gap": GAP, "start_gap": START_GAP,
                   "exponent_time": EXPONENT_TIME}
        return Verdict(ok, line, numbers, {"formations": forms})

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(18, 5.4))
        self._draw_probability(axes[0], config, data)
        self._draw_rate(axes[1], config, data)
        self._draw_formations(axes[2], config, data)
        return figures.save_figure(
            fig, self.stem(folder),
            f"Two tokens under common value noise σ = {config['sigma']:g} ({config['runs']} "
            f"runs per point, T = {config['horizon']:g}, τ = {config['tau']:g}): the antipodal "
            "end attracts past the predicted $\\beta_c$")

    @staticmethod
    def _draw_probability(ax, config, data):
        betas, runs = data["betas"], config["runs"]
        fine = np.linspace(betas[0] / 4, betas[-1], 200)
        for i, d in enumerate(data["dims"]):
            d = int(d)
            p = data["p_antipodal"][i]
            ax.errorbar(betas, p, yerr=binomial_se(p, runs), fmt="o", ms=4, capsize=3,
                        color=f"C{i}", label=f"d = {d}: measured (± 1 s.e.)")
            ax.plot(fine, [antipodal_probability(b, d, config["sigma"]) for b in fine],
                    color=f"C{i}", lw=1, ls="--", label=f"d = {d}: predicted, T → ∞")
            ax.axvline(antipodal_threshold(d, config["sigma"]), color=f"C{i}", lw=0.8,
                       ls=":")
        ax.set(xlabel=r"$\beta$", ylabel=r"P(antipodal): $1+\rho_T$ < " + f"{GAP:g}",
               title=r"P(antipodal), uniform starts; dotted: predicted $\beta_c$")
        figures.legend_below(ax, ncol=2)

    @staticmethod
    def _draw_rate(ax, config, data):
        betas = data["betas"]
        fine = np.linspace(betas[0] / 4, betas[-1], 200)
        for i, d in enumerate(data["dims"]):
            d = int(d)
            ax.errorbar(betas, data["rate"][i], yerr=data["rate_se"][i], fmt="o", ms=4,
                        capsize=3, color=f"C{i}", label=f"d = {d}: measured (± 1 s.e.)")
            ax.plot(fine, antipodal_rate(fine, d, config["sigma"]), color=f"C{i}", lw=1,
                    label=rf"d = {d}: predicted $\lambda$")
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xlabel=r"$\beta$", ylabel=r"$\log((1+\rho_T)/(1+\rho_0))\,/\,T$",
               title=rf"exponent at $\rho=-1$ ($1+\rho_0$ = {START_GAP:g}, "
                     rf"T = {EXPONENT_TIME:g}): attracts below 0")
        figures.legend_below(ax, ncol=2)

    @staticmethod
    def _draw_formations(ax, config, data):
        runs = config["runs"]
        width = 0.8 / (len(FORMATION_TOKENS))
        labels = ["one cluster"] + [f"k = {k}" for k in range(1, max(FORMATION_TOKENS) // 2 + 1)]
        labels += ["other"]
        xs = np.arange(len(labels))
        for i, (n, ends) in enumerate(zip(FORMATION_TOKENS, data["formation"])):
            codes = [0] + list(range(1, max(FORMATION_TOKENS) // 2 + 1)) + [-1]
            share = np.array([np.mean(ends == c) if c <= n // 2 else np.nan for c in codes])
            ax.bar(xs + (i - 1) * width, share, width, yerr=binomial_se(share, runs),
                   capsize=2, color=f"C{i + 3}", label=f"n = {n}")
        ax.set_xticks(xs, labels)
        ax.set(ylabel="share of runs", ylim=(0, 1),
               title=f"n tokens, β = {config['formation_beta']:g}, d = "
                     f"{config['formation_dim']}: antipodal groups k : n − k")
        figures.legend_below(ax, ncol=3)


def _json(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
