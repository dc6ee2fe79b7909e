"""`noisy-transition`: the phase transition of the noisy transformer on the sphere
(Mun & Rosenzweig 2026: arXiv 2604.16288 for d = 2, 2606.05140 for every d ≥ 2).

The model: `n` tokens on `S^{d−1}`, the unnormalised self-attention (`kernel="usa"`,
`P = I`, `U = c I`) and independent noise on every token (`ja.TokenNoise(σ)`, the
layers of `ja.run_layers` with noise `σ √τ`):

    dx_i = c e^{−β} P_{x_i} (1/n) Σ_j e^{β⟨x_i, x_j⟩} x_j dt + σ P_{x_i} ∘ dB^i_t.

Its mean-field limit is the gradient flow of the papers' free energy
`∫ ρ log ρ − K ∫∫ W_β(⟨x, y⟩) dρ dρ`, `W_β(t) = (e^{βt} − 1)/β`, with the coupling
`K = c e^{−β} / σ²` (the stationary densities solve `ρ ∝ exp(2K W_β * ρ)`, the
papers' normalisation: `K_#(0⁺) = d/2`, the von Mises–Fisher threshold). We take
`σ = √2` (each free token is Brownian motion with generator `Δ`), so `c = 2 K e^β`.
The uniform density loses linear stability at `K_#(β)` (`ja.theory.noisy_threshold`);
the transition is continuous (`K_c = K_#`) for `β ≤ β*` (`ja.theory.noisy_beta_star`)
and discontinuous (`K_c < K_#`) above.

What it measures, for d = 2 and 3 (`--max-dim`) and β ∈ {β*/2, β*, 2β*}:

1. Up and down sweeps of the coupling over `K/K_# ∈ [--k-min, --k-max]`: the up
   sweep starts uniform at the smallest coupling, the down sweep from a tight cap at
   the largest, and every coupling starts from the previous one's final state. The
   order parameter `r = |mean token|` is kept after every layer (`observe=`); each
   coupling runs `--burn` time units, then averages over `--window`. Every β, both
   sweeps and `--seeds` seeds run as one batch: one compiled program per d.
2. The threshold from the linear growth rate (`quench`, `ja.theory.fit_threshold`): at
   each coupling of `K/K_# ∈ 1 ± --rate-span` (`--rates` of them, all in one batch), two
   copies of the same uniform tokens tilted by `±TILT` towards `e₁` and driven by the
   same noise. Half the difference of their mean tokens' first coordinate decays as
   `e^{−γt}` over `--quench` time units, with `γ = (d − 1)(σ²/2)(1 − K/K_#)` in the
   linear theory: the mode `ℓ = 1` of the uniform density. The common noise cancels
   to first order in the tilt, so `γ` is read to a few per cent from one pair. The
   line through `(K, γ)` crosses 0 at the estimate; its standard error is the fit's
   (`--seeds` pairs per coupling). On the continuous side `K_c = K_#`; on the
   discontinuous side the same line finds where the uniform state itself becomes
   unstable, above the transition.
3. Equilibration: per coupling, the difference between the two halves of the
   averaging window in units of its standard error (`half_gap`), and the integrated
   autocorrelation time of `r²` against the window (`autocorrelation_time`).
4. Hysteresis (`hysteresis`): the couplings where the up sweep orders and where the
   down sweep loses order (`r` above `ORDERED / √n`); their difference over `K_#` is
   the width, resolved to the grid's spacing.
"""

import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .. import SelfAttentionDynamics, TokenNoise, run_layers
from .._app import figures
from .._manifold import normalize
from ..theory import fit_threshold, layer_diffusion, noisy_beta_star, noisy_threshold
from .base import AbstractExperiment, Param, Verdict
from .runner import MAX_LAYERS
from .verdicts import short

#: The noise's strength: each free token is Brownian motion with generator `Δ`.
SIGMA = math.sqrt(2.0)
#: The temperatures, as multiples of `β*` of each dimension.
BETA_RATIOS = (0.5, 1.0, 2.0)
#: The tilt of the growth-rate runs: tokens `N(x ± TILT e₁)`, a mean token ≈ 0.1.
TILT = 0.15
#: A sweep is ordered at a coupling when `r > ORDERED / √n` (the floor is `~1/√n`).
ORDERED = 5.0
#: The target of the continuous side: `|K_estimate / K_# − 1|` at most this.
TARGET = 0.05
#: Layers per call of `run_layers` (the states between calls are not kept).
CHUNK = 20
#: The paper-resolution study of `--full` (it takes precedence over these flags).
FULL = {"tokens": 4000, "couplings": 23, "k_min": 0.3, "k_max": 1.4, "burn": 10.0,
        "window": 40.0, "rates": 17, "seeds": 8, "tau": 0.01, "sweep_tau": 0.02}
#: A small run for tests and smoke checks: `jaxattn run noisy-transition` with these.
QUICK = {"tokens": 200, "couplings": 5, "burn": 0.5, "window": 1.0, "rates": 5,
         "quench": 0.5, "seeds": 1, "blocks": 4}


def settings(config: dict) -> dict:
    """The run's effective settings: `config`, with `FULL` over it for `--full`."""
    cfg = dict(config) | (FULL if config.get("full") else {})
    if not cfg["rate_span"] < 1:
        raise ValueError(f"--rate-span must be < 1 (the couplings 1 ± span are K/K_# > 0), "
                         f"got {cfg['rate_span']!r}.")
    if not cfg["k_min"] < 1 < cfg["k_max"]:
        raise ValueError(f"need --k-min < 1 < --k-max (the couplings K/K_# must straddle the "
                         f"threshold), got {cfg['k_min']!r} and {cfg['k_max']!r}.")
    if cfg["window"] / cfg["sweep_tau"] < 2 * cfg["blocks"]:
        raise ValueError(f"--window / --sweep-tau = {cfg['window'] / cfg['sweep_tau']:.3g} "
                         f"layers is too "
                         f"few for --blocks {cfg['blocks']} (need two layers a block): "
                         "lengthen --window or take fewer --blocks.")
    for flags, length, step in (("(--burn + --window) / --sweep-tau",
                                 cfg["burn"] + cfg["window"], cfg["sweep_tau"]),
                                ("--quench / --tau", cfg["quench"], cfg["tau"])):
        if not length / step <= MAX_LAYERS:
            raise ValueError(f"{flags} = {length / step:.3g} layers is "
                             f"more than {MAX_LAYERS} (JAX counts in int32): take a larger "
                             "step.")
    return cfg


def coupling_grid(cfg: dict) -> np.ndarray:
    """The couplings `K/K_#` of the sweeps, ascending."""
    return np.linspace(cfg["k_min"], cfg["k_max"], cfg["couplings"])


def rate_grid(cfg: dict) -> np.ndarray:
    """The couplings `K/K_#` of the growth-rate runs: `1 ± --rate-span`."""
    return np.linspace(1 - cfg["rate_span"], 1 + cfg["rate_span"], cfg["rates"])


def betas_of(d: int) -> np.ndarray:
    """`β` of dimension `d`: `BETA_RATIOS` times `β*`."""
    return np.asarray(BETA_RATIOS) * noisy_beta_star(d)


def layer_coupling(K, beta, d: int, tau, threshold):
    """The coupling to give `usa_model` so that layers of step `τ` realise `K` at the
    uniform state.

    A noisy layer `x ← N(x + τ v + σ√τ P_x ξ)` is the SDE only as `τ → 0`: its
    diffusion is `σ² ja.theory.layer_diffusion(d, τ, σ)`, and the radial part `τ⟨x, v⟩`
    (`= σ² β K / (2 K_#)` at the uniform state) divides both the drift and the noise's
    step, the coupling `drift/σ²` growing by `1 + τ⟨x, v⟩` (first order in `τ`).
    Uncorrected, `τ = 0.05` moves `K/K_#` from 0.5 to 0.63 (d = 3, β = β*).

    **Arguments:**

    - `K`: the coupling wanted; `beta`, `d`: the model's; `tau`: the step;
      `threshold`: `K_#(β)` of dimension `d`.

    **Returns:**

    The nominal coupling (`K` itself at `τ = 0`).
    """
    s2 = SIGMA**2
    return K * layer_diffusion(d, tau, SIGMA) / (1 + tau * s2 * beta * K / (2 * threshold))


def usa_model(d: int, K, beta) -> SelfAttentionDynamics:
    """The USA model of coupling `K` at `β` with noise `SIGMA`: `U = 2K e^β I`
    (`K = c e^{−β}/σ²`, the module's mapping)."""
    eye = jnp.eye(d)[None]
    return SelfAttentionDynamics(eye, K * SIGMA**2 * jnp.exp(beta) * eye, beta=beta,
                                 kernel="usa")


def _mean_token(x):
    return jnp.mean(x, axis=0)


def starts(key, batch: tuple[int, ...], n: int, d: int) -> jnp.ndarray:
    """`(*batch, 2, n, d)`: uniform tokens (the up sweep) and a tight cap around
    `e₁` (the down sweep)."""
    k_up, k_down = jax.random.split(key)
    up = normalize(jax.random.normal(k_up, batch + (n, d)))
    cap = jnp.eye(d)[0].reshape((1,) * (len(batch) + 1) + (d,))
    down = normalize(cap + 0.2 * jax.random.normal(k_down, batch + (n, d)))
    return jnp.stack([up, down], axis=len(batch))


def sweep(d: int, cfg: dict, key, *, progress: bool) -> np.ndarray:
    """`r` after every layer: `(betas, 2, couplings, seeds, steps)`, the second axis
    the up and the down sweep (the down sweep stored in ascending `K` as well)."""
    n, seeds, tau = cfg["tokens"], cfg["seeds"], cfg["sweep_tau"]
    ratios, betas = coupling_grid(cfg), betas_of(d)
    chunks = math.ceil((cfg["burn"] + cfg["window"]) / tau / CHUNK)
    nb, nk = len(betas), len(ratios)
    k_start, k_run = jax.random.split(key)
    x = starts(k_start, (nb, seeds), n, d).transpose(0, 2, 1, 3, 4)  # (β, 2, seeds, n, d)
    beta = jnp.broadcast_to(jnp.asarray(betas)[:, None, None], (nb, 2, seeds))
    thresholds = jnp.asarray([noisy_threshold(float(b), d) for b in betas])
    noise = TokenNoise(SIGMA)
    out = np.empty((nb, 2, nk, seeds, chunks * CHUNK))
    with tqdm(total=nk * chunks, desc=f"noisy-transition d={d}", disable=not progress,
              leave=False) as bar:
        for s in range(nk):
            up_down = jnp.asarray([ratios[s], ratios[nk - 1 - s]])
            K = thresholds[:, None, None] * up_down[None, :, None] * jnp.ones((1, 1, seeds))
            K = layer_coupling(K, beta, d, tau, thresholds[:, None, None])
            dyn = eqx.filter_vmap(lambda k, b: usa_model(d, k, b))(K.ravel(), beta.ravel())
            flat = x.reshape((-1, n, d))
            for c in range(chunks):
                chunk_key = jax.random.fold_in(k_run, s * chunks + c)
                m, xs = run_layers(dyn, flat, CHUNK, tau, observe=_observe, noise=noise,
                                   key=chunk_key)
                r = np.linalg.norm(np.asarray(m[:, 1:]), axis=-1).reshape(nb, 2, seeds, CHUNK)
                out[:, 0, s, :, c * CHUNK:(c + 1) * CHUNK] = r[:, 0]
                out[:, 1, nk - 1 - s, :, c * CHUNK:(c + 1) * CHUNK] = r[:, 1]
                flat = xs[:, -1]
                bar.update()
            x = flat.reshape(x.shape)
    return out


def _observe(x):
    return _mean_token(x), x


def window_blocks(r: np.ndarray, window_steps: int, blocks: int) -> np.ndarray:
    """Block means of `r²` over the last `window_steps` steps: `(..., seeds·blocks)`
    from `r` `(..., seeds, steps)` (the window cut into `blocks` equal blocks per seed;
    a remainder at the window's start is dropped)."""
    size = window_steps // blocks
    tail = r[..., r.shape[-1] - size * blocks:] ** 2
    means = tail.reshape(tail.shape[:-1] + (blocks, size)).mean(-1)
    return means.reshape(means.shape[:-2] + (-1,))


def quench(d: int, cfg: dict, key) -> np.ndarray:
    """The decay of a small tilt at every coupling of `rate_grid`: `(betas, couplings,
    seeds, steps + 1)`, half the difference of the mean token's first coordinate
    between two systems tilted by `±TILT` towards `e₁` from the same uniform tokens
    and driven by the same noise (the common noise cancels to first order in the
    tilt). All couplings run as one batch, one compiled program per d and β."""
    n, seeds, tau = cfg["tokens"], cfg["seeds"], cfg["tau"]
    ratios, betas = rate_grid(cfg), betas_of(d)
    steps = math.ceil(cfg["quench"] / tau)
    out = []
    for i, beta in enumerate(betas):
        threshold = noisy_threshold(float(beta), d)
        K = layer_coupling(np.repeat(ratios, seeds) * threshold, beta, d, tau, threshold)
        base = normalize(jax.random.normal(jax.random.fold_in(key, i), (len(K), n, d)))
        tilt = TILT * jnp.eye(d)[0][None, None]
        # (K·seeds, 2, n, d)
        x0 = jnp.stack([normalize(base + tilt), normalize(base - tilt)], axis=1)
        dyn = eqx.filter_vmap(lambda k: usa_model(d, k, beta))(jnp.asarray(K))
        m = _pairs(dyn, x0, jax.random.fold_in(key, 100 + i), steps, tau)
        out.append(np.asarray(m).reshape(len(ratios), seeds, steps + 1))
    return np.stack(out)


def _pairs(dyn, x0, key, steps, tau):
    """`(m₊ − m₋)/2` along `e₁` per step for each pair of systems `x0[:, 0]`,
    `x0[:, 1]`: one key for both halves, so system `b` of each draws the same noise."""
    noise = TokenNoise(SIGMA)
    m = [run_layers(dyn, x0[:, side], steps, tau, observe=_first_coordinate, noise=noise,
                    key=key) for side in (0, 1)]
    return (np.asarray(m[0]) - np.asarray(m[1])) / 2


def _first_coordinate(x):
    return jnp.mean(x[:, 0])


def fit_rates(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The decay rate `γ` of each series `g(t) ∝ e^{−γ t}` (least squares on `log g`,
    over the times where `g > 0`), for `g` `(..., steps)`; NaN with fewer than 3
    positive values."""
    flat = g.reshape(-1, g.shape[-1])
    rates = np.full(len(flat), math.nan)
    for i, series in enumerate(flat):
        keep = series > 0
        if keep.sum() >= 3:
            rates[i] = -np.polyfit(t[keep], np.log(series[keep]), 1)[0]
    return rates.reshape(g.shape[:-1])


def half_gap(r2: np.ndarray) -> np.ndarray:
    """`(mean of the window's second half − first half) / its standard error`, per
    leading index, from block means `(..., seeds, blocks)` (blocks in time order)."""
    half = r2.shape[-1] // 2
    a, b = r2[..., :half].reshape(r2.shape[:-2] + (-1,)), r2[..., -half:].reshape(
        r2.shape[:-2] + (-1,))
    se = np.sqrt(a.var(-1, ddof=1) / a.shape[-1] + b.var(-1, ddof=1) / b.shape[-1])
    return (b.mean(-1) - a.mean(-1)) / np.maximum(se, 1e-300)


def autocorrelation_time(series: np.ndarray) -> float:
    """The integrated autocorrelation time of a series, in steps: `1 + 2 Σ_k ρ_k`
    summed up to the first window `M ≥ 5 τ(M)` (Sokal's rule); NaN for a constant
    series."""
    x = np.asarray(series, float) - np.mean(series)
    var = x @ x / len(x)
    if not var > 0:
        return math.nan
    f = np.fft.rfft(x, 2 * len(x))
    acf = np.fft.irfft(f * np.conj(f))[: len(x)] / (var * len(x))
    tau = 2 * np.cumsum(acf) - 1
    m = np.arange(len(x))
    stop = np.nonzero(m >= 5 * tau)[0]
    return float(tau[stop[0]] if len(stop) else tau[-1])


def hysteresis(ratios: np.ndarray, r_up: np.ndarray, r_down: np.ndarray, n: int
               ) -> tuple[float, float, float]:
    """`(on, off, width)`: the smallest `K/K_#` where the up sweep is ordered, the
    smallest where the down sweep still is (`r > ORDERED/√n`, its mean), and
    `on − off` (0 when they agree); NaN where a sweep never orders."""
    cut = ORDERED / math.sqrt(n)
    up, down = np.nonzero(r_up > cut)[0], np.nonzero(r_down > cut)[0]
    on = float(ratios[up[0]]) if len(up) else math.nan
    off = float(ratios[down[0]]) if len(down) else math.nan
    return on, off, on - off


class NoisyTransition(AbstractExperiment):
    name = "noisy-transition"
    title = ("The noisy transformer's phase transition (Mun & Rosenzweig 2026): the order "
             "parameter against the coupling, its threshold K_# and hysteresis")
    theorem = "Mun & Rosenzweig 2026, the noisy USA transition (arXiv 2604.16288, 2606.05140)"
    params = (
        Param("tokens", int, 2000, "tokens n per system", 2),
        Param("max_dim", int, 3, "the largest dimension d (d = 2 … max-dim)", 2),
        Param("couplings", int, 9, "couplings K/K_# per sweep", 3),
        Param("k_min", float, 0.4, "smallest K/K_#", 0.0),
        Param("k_max", float, 1.5, "largest K/K_#", 0.0),
        Param("burn", float, 3.0, "time per coupling before the averaging window", 0.0),
        Param("window", float, 6.0, "averaging window per coupling (time)", 0.0),
        Param("tau", float, 0.02, "the layers' step τ of the growth-rate runs", 0.0),
        Param("sweep_tau", float, 0.05, "the layers' step τ of the sweeps", 0.0),
        Param("rates", int, 9, "couplings of the growth-rate fit", 4),
        Param("rate_span", float, 0.3, "the growth-rate couplings span K/K_# = 1 ± this", 0.0),
        Param("quench", float, 1.0, "time over which each growth rate is read", 0.0),
        Param("seeds", int, 1, "systems per (β, sweep) and tilted pairs per coupling", 1),
        Param("blocks", int, 4, "time blocks per seed and coupling (equilibration check)", 2),
        Param("full", bool, False, "the paper-resolution study (n = 4000, τ = 0.01, 23 "
              "couplings, window 40, 17 rates, 8 seeds; over the flags above)"),
    )
    #: Flags that set other parameters (`runner.experiment_config` records the values used
    #: and refuses a flag the preset sets).
    presets = {"full": FULL}

    def check_config(self, config):
        settings(config)

    def simulate(self, config, progress):
        cfg = settings(config)
        key = jax.random.PRNGKey(config["seed"])
        data = {"ratios": coupling_grid(cfg), "rate_ratios": rate_grid(cfg)}
        for d in range(2, cfg["max_dim"] + 1):
            data[f"g_d{d}"] = quench(d, cfg, jax.random.fold_in(key, 1000 + d))
            data[f"r_d{d}"] = sweep(d, cfg, jax.random.fold_in(key, d), progress=progress)
            data[f"betas_d{d}"] = betas_of(d)
        return data

    def verdict(self, config, data):
        rows = measure(config, data)
        continuous = [row for row in rows if row["continuous"]]
        ok = all(abs(row["rel_error"]) <= TARGET and abs(row["z"]) <= 2 for row in continuous)
        parts = [f"d={row['d']} β/β*={row['beta_ratio']:g}: K/K_# = "
                 f"{short(row['K_estimate'] / row['K_theory'])} ± "
                 f"{short(row['K_se'] / row['K_theory'])}, hysteresis "
                 f"{short(row['hysteresis_width'])}" for row in rows]
        line = (f"{'within' if ok else 'NOT within'} {TARGET:.0%} of K_# on the continuous "
                f"side; " + "; ".join(parts))
        numbers = {"max_rel_error_continuous": max((abs(r["rel_error"]) for r in continuous),
                                                   default=math.nan)}
        return Verdict(ok, line, numbers, extra={"cases": rows, "settings": _plain(
            settings(config))})

    def draw(self, config, data, folder: Path):
        rows = measure(config, data)
        _write_table(rows, Path(folder) / "table.csv")
        return draw_sweeps(settings(config), data, rows, self.stem(folder))


def _plain(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if isinstance(v, (int, float, bool, str))}


def measure(config: dict, data) -> list[dict]:
    """One row per `(d, β)`: the threshold's estimate, its standard error, the theory,
    the hysteresis and the equilibration checks."""
    cfg = settings(config)
    rows = []
    for d in range(2, cfg["max_dim"] + 1):
        for i, beta in enumerate(np.asarray(data[f"betas_d{d}"])):
            rows.append(_row(cfg, data, d, i, float(beta)))
    return rows


def rates_of(cfg: dict, g: np.ndarray) -> np.ndarray:
    """The decay rates `(couplings, seeds)` of one β's tilted pairs `g`."""
    return fit_rates(np.arange(g.shape[-1]) * cfg["tau"], g)


def _row(cfg, data, d, i, beta) -> dict:
    n, ratios, star = cfg["tokens"], np.asarray(data["ratios"]), noisy_beta_star(d)
    steps = int(round(cfg["window"] / cfg["sweep_tau"]))
    K_theory = noisy_threshold(beta, d)
    rates = rates_of(cfg, np.asarray(data[f"g_d{d}"])[i])
    K_est, se, gamma0 = fit_threshold(np.asarray(data["rate_ratios"]) * K_theory, rates)
    r = np.asarray(data[f"r_d{d}"])[i]
    blocks = window_blocks(r, steps, cfg["blocks"])  # (2, couplings, seeds·blocks)
    gaps = half_gap(blocks.reshape(blocks.shape[:-1] + (cfg["seeds"], cfg["blocks"])))
    tail = r[..., r.shape[-1] - steps:] ** 2
    taus = [autocorrelation_time(s) for s in tail.reshape(-1, steps)]
    mean_r = r[..., r.shape[-1] - steps:].mean((-1, -2))
    on, off, width = hysteresis(ratios, mean_r[0], mean_r[1], n)
    return {"d": d, "beta": beta, "beta_ratio": round(beta / star, 6), "K_theory": K_theory,
            "K_estimate": K_est, "K_se": se, "rel_error": K_est / K_theory - 1,
            "z": (K_est - K_theory) / se if se > 0 else math.nan,
            "rate_at_zero": gamma0, "rate_at_zero_theory": (d - 1) * SIGMA**2 / 2
            * layer_diffusion(d, cfg["tau"], SIGMA),
            "continuous": bool(beta <= star * (1 + 1e-9)),
            "hysteresis_on": on, "hysteresis_off": off, "hysteresis_width": width,
            "grid_step": float(ratios[1] - ratios[0]),
            "max_half_gap": float(np.nanmax(np.abs(gaps))),
            "max_autocorrelation_time": float(np.nanmax(taus) * cfg["sweep_tau"]),
            "window": float(cfg["window"])}


def _write_table(rows: list[dict], path: Path) -> None:
    keys = list(rows[0])
    lines = [",".join(keys)] + [",".join(f"{row[k]:.6g}" if isinstance(row[k], float)
                                         else str(row[k]) for k in keys) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def draw_sweeps(cfg: dict, data, rows: list[dict], stem: Path) -> list[Path]:
    """Per `(d, β)`: `r` against `K/K_#` (up and down sweeps, the floor `1/√n`, `K_#`
    and the estimate ± its error), and below it the growth rates with the fitted line."""
    plt = figures.pyplot()
    dims = list(range(2, cfg["max_dim"] + 1))
    fig, axes = plt.subplots(2 * len(dims), len(BETA_RATIOS) + 1,
                             figsize=(14.5, 5.6 * len(dims)),
                             squeeze=False, width_ratios=[1] * len(BETA_RATIOS) + [0.5])
    n, ratios = cfg["tokens"], np.asarray(data["ratios"])
    steps = int(round(cfg["window"] / cfg["sweep_tau"]))
    for row in rows:
        i, j = 2 * dims.index(row["d"]), BETA_RATIOS.index(row["beta_ratio"])
        r = np.asarray(data[f"r_d{row['d']}"])[j]
        _draw_order(axes[i, j], row, ratios, r, n, steps)
        g = np.asarray(data[f"g_d{row['d']}"])[j]
        _draw_fit(axes[i + 1, j], row, np.asarray(data["rate_ratios"]), rates_of(cfg, g))
    for ax_row in axes:  # each row's legend in its own column, off the data
        ax_row[-1].axis("off")
        ax_row[-1].legend(*ax_row[0].get_legend_handles_labels(), loc="center left",
                          fontsize=8, frameon=False)
    fig.tight_layout()
    return figures.save_figure(fig, stem, f"The noisy USA transition: n = {n}, "
                               f"σ = √2; sweeps: τ = {cfg['sweep_tau']:g}, window "
                               f"{cfg['window']:g} after {cfg['burn']:g} per coupling; rates: "
                               f"τ = {cfg['tau']:g} over {cfg['quench']:g}; {cfg['seeds']} "
                               "seed(s)")


def _draw_order(ax, row, ratios, r, n, steps) -> None:
    mean = r[..., r.shape[-1] - steps:].mean((-1, -2))
    ax.plot(ratios, mean[0], "o-", color="C0", label="up sweep")
    ax.plot(ratios, mean[1], "s--", mfc="none", color="C3", label="down sweep")
    ax.axhline(1 / math.sqrt(n), color="0.5", ls=":", lw=1, label=r"floor $1/\sqrt{n}$")
    ax.axvline(1.0, color="k", lw=1, label=r"$K_\#$")
    est, se = row["K_estimate"] / row["K_theory"], row["K_se"] / row["K_theory"]
    if math.isfinite(est):
        ax.axvline(est, color="C2", ls="--", lw=1.2, label="estimate")
        if math.isfinite(se):
            ax.axvspan(max(est - se, ratios[0]), min(est + se, ratios[-1]), color="C2",
                       alpha=0.2)
    ax.set_xlim(ratios[0] - 0.02, ratios[-1] + 0.02)
    kind = "continuous" if row["continuous"] else "discontinuous"
    ax.set_title(f"d = {row['d']}, β = {row['beta_ratio']:g} β* ({kind})", fontsize=10)
    ax.set_xlabel(r"$K / K_\#(\beta)$")
    ax.set_ylabel(r"order parameter $|\bar x|$")
    ax.set_ylim(0, 1.02)


def _draw_fit(ax, row, ratios, rates) -> None:
    for k in range(rates.shape[1]):
        ax.plot(ratios, rates[:, k], "o", color="C0", ms=4, alpha=0.8,
                label="tilted pairs" if k == 0 else None)
    est, a = row["K_estimate"] / row["K_theory"], row["rate_at_zero"]
    xs = np.linspace(ratios[0], ratios[-1], 50)
    if math.isfinite(est):
        ax.plot(xs, a * (1 - xs / est), color="C2", label="fit")
    ax.plot(xs, row["rate_at_zero_theory"] * (1 - xs), color="k", lw=0.8, ls=":",
            label=r"theory $(d-1) D (1 - K/K_\#)$")
    ax.axhline(0, color="0.5", lw=0.6)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel(r"$K / K_\#(\beta)$")
    ax.set_ylabel(r"decay rate $\gamma$ of a tilt")
    ax.set_title(rf"estimate $K/K_\#$ = {short(est)} ± {short(row['K_se'] / row['K_theory'])}",
                 fontsize=9)
