"""`noisy-transition`: the phase transition of the noisy transformer on the sphere
(Mun & Rosenzweig 2026: arXiv 2604.16288 for d = 2, 2606.05140 for every d ≥ 2).

`n` tokens on `S^{d−1}`, kernel `"usa"`, `P = I`, `U = c I`, `ja.TokenNoise(σ)`, with the
papers' coupling `K = c e^{−β} / σ²`, `σ = √2` (so `c = 2 K e^β`). For d = 2, 3 and
β ∈ {β*/2, β*, 2β*} it measures `K_#` and `K_c` from the equation (`ja.meanfield`), the
particles' threshold at `τ → 0` from tilted pairs, and up and down sweeps of `K` with
their equilibration and hysteresis. The mapping, each step and the measured numbers:
`docs/noise.md` ("The noisy transition").
"""

import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .. import SelfAttentionDynamics, TokenNoise
from .. import meanfield as mf
from .._artifacts import figures
from .._files import atomic_write
from .._manifold import normalize
from ..meanfield import fold_coupling, transition_coupling
from ..meanfield._checks import MAX_STEPS
from ..metrics import WindowStatistics, fit_intercept, fit_slope, level_crossing, window_statistics
from ..theory import fit_threshold, layer_diffusion, noisy_beta_star, noisy_threshold
from .base import AbstractExperiment, Config, Param, Verdict
from .pieces import keyed_layers
from .verdicts import short

#: The noise's strength: each free token is Brownian motion with generator `Δ`.
SIGMA = math.sqrt(2.0)
#: The temperatures, as multiples of `β*` of each dimension.
BETA_RATIOS = (0.5, 1.0, 2.0)
#: The tilt of the growth-rate runs: tokens `N(x ± TILT e₁)`, a mean token ≈ 0.1.
TILT = 0.15
#: A sweep is ordered at a coupling when `r > ORDERED / √n` (the floor is `~1/√n`).
ORDERED = 5.0
#: The particles' target: `|K(τ → 0) / K_# − 1|` at most this (and 3 standard errors).
TARGET = 0.05
#: How closely the equation's growth rates must give `K_#` (relative): the rates are
#: linear in `K`, so only the solver's accuracy enters (measured: 1e-8).
SHARP_TOL = 1e-3
#: How closely the equation's free energies must give `K_c` (relative; interpolated
#: between caps on the ordered branch, measured 2.4e-4 and 6e-5: `docs/noise.md`).
CRITICAL_TOL = 0.005
#: The equation's grids: Fourier modes (d = 2) and the harmonics' degree (d = 3).
EQ_MODES, EQ_DEGREE = 32, 20
#: The equation's tilt, the times of its growth-rate fit and its largest step.
EQ_TILT, EQ_RATE_TIMES, EQ_DT = 1e-4, np.linspace(0.0, 2.0, 5), 0.05
#: The caps of the `K_c` runs (`e^{CAP x₁}`), their couplings `K/K_#` and settling time:
#: two caps lie between the fold and `K_c` (d = 2, β = 2β*: 0.902 and 0.919).
CAP, KC_RATIOS, EQ_SETTLE = 4.0, np.linspace(0.7, 1.0, 25), 40.0
#: A cap is ordered at the end when its `r` exceeds this. Below the fold
#: (`ja.meanfield.fold_coupling`) a cap is not on the ordered branch even when its `r`
#: exceeds this after `EQ_SETTLE`: near the saddle-node its decay is slow.
EQ_ORDERED = 0.1
#: Equilibrated: the window's halves within `GAP_Z` standard errors, and blocks at
#: least `BLOCK_TAUS` autocorrelation times long.
GAP_Z, BLOCK_TAUS = 3.0, 2.0
#: Hysteresis at a coupling: the down sweep above the up sweep by this many errors.
HYSTERESIS_Z = 3.0
#: Layers per call of `run_layers` (the states between calls are not kept).
CHUNK = 20
#: Systems per block (`pieces.keyed_layers`): each block is one program, so that a
#: system's numbers are the same bits on any number of devices or processes.
BLOCK = 2
#: The paper-resolution study of `--full` (it takes precedence over these flags).
FULL = {"tokens": 4000, "couplings": 23, "k_min": 0.3, "k_max": 1.4, "burn": 10.0,
        "window": 40.0, "rates": 17, "seeds": 8, "tau": 0.01, "sweep_tau": 0.02}
#: A small run for tests and smoke checks: `jaxattn run noisy-transition` with these.
QUICK = {"tokens": 200, "couplings": 5, "burn": 0.5, "window": 1.0, "rates": 5,
         "quench": 0.5, "seeds": 1, "blocks": 4}


def settings(config):
    """The run's effective settings: `config`, with `FULL` over it for `--full` (the
    runner has put it there already; a config built by hand gets it here)."""
    full = config.full and any(config[k] != v for k, v in FULL.items())
    return config | FULL if full else config


def coupling_grid(cfg: Config) -> np.ndarray:
    """The couplings `K/K_#` of the sweeps, ascending."""
    return np.linspace(cfg.k_min, cfg.k_max, cfg.couplings)


def step_levels(cfg: Config) -> tuple[float, float]:
    """The layer steps of the growth-rate runs: `τ/2` and `τ`."""
    return cfg.tau / 2, cfg.tau


def rate_grid(cfg: Config) -> np.ndarray:
    """The couplings `K/K_#` of the growth-rate runs: `1 ± --rate-span`."""
    return np.linspace(1 - cfg.rate_span, 1 + cfg.rate_span, cfg.rates)


def beta_grid(d: int) -> np.ndarray:
    """`β` of dimension `d`: `BETA_RATIOS` times `β*`."""
    return np.asarray(BETA_RATIOS) * noisy_beta_star(d)


def layer_coupling(K, beta, d: int, tau, threshold):
    """The coupling to give `usa_model` so that layers of step `τ` realise `K` at the
    uniform state: the diffusion `σ² ja.theory.layer_diffusion(d, τ, σ)` exactly, the
    radial part `τ⟨x, v⟩ = σ² β K / (2 K_#)` to first order (`docs/noise.md`, "The
    layers' step moves the coupling").

    **Arguments:**

    - `K`: the coupling wanted; `beta`, `d`: the model's; `tau`: the step;
      `threshold`: `K_#(β)` of dimension `d`.

    **Returns:**

    The nominal coupling (`K` itself at `τ = 0`).
    """
    return K * layer_diffusion(d, tau, SIGMA) / (1 + tau * SIGMA**2 * beta * K / (2 * threshold))


def usa_model(d: int, K, beta) -> SelfAttentionDynamics:
    """The USA model of coupling `K` at `β` with noise `SIGMA`: `U = 2K e^β I`
    (`K = c e^{−β}/σ²`, the module's mapping)."""
    eye = jnp.eye(d)[None]
    return SelfAttentionDynamics(eye, K * SIGMA**2 * jnp.exp(beta) * eye, beta=beta,
                                 kernel="usa")


def starts(key, batch: tuple[int, ...], n: int, d: int) -> jnp.ndarray:
    """`(*batch, 2, n, d)`: uniform tokens (the up sweep) and a tight cap around
    `e₁` (the down sweep)."""
    k_up, k_down = jax.random.split(key)
    up = normalize(jax.random.normal(k_up, batch + (n, d)))
    cap = jnp.eye(d)[0].reshape((1,) * (len(batch) + 1) + (d,))
    down = normalize(cap + 0.2 * jax.random.normal(k_down, batch + (n, d)))
    return jnp.stack([up, down], axis=len(batch))


def sweep(d: int, cfg: Config, key, *, progress: bool) -> np.ndarray:
    """`r` after every layer: `(betas, 2, couplings, seeds, steps)`, the second axis
    the up and the down sweep (the down sweep stored in ascending `K` as well)."""
    n, seeds, tau = cfg.tokens, cfg.seeds, cfg.sweep_tau
    ratios, betas = coupling_grid(cfg), beta_grid(d)
    chunks = math.ceil((cfg.burn + cfg.window) / tau / CHUNK)
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
                m, xs = keyed_layers(dyn, flat, jax.random.split(chunk_key, len(flat)),
                                     CHUNK, tau, noise=noise, observe=_observe, block=BLOCK)
                r = np.linalg.norm(m[:, 1:], axis=-1).reshape(nb, 2, seeds, CHUNK)
                out[:, 0, s, :, c * CHUNK:(c + 1) * CHUNK] = r[:, 0]
                out[:, 1, nk - 1 - s, :, c * CHUNK:(c + 1) * CHUNK] = r[:, 1]
                flat = xs[:, -1]
                bar.update()
            x = flat.reshape(x.shape)
    return out


def _observe(x):
    """The mean token and the tokens (`run_layers`' `observe`)."""
    return jnp.mean(x, axis=0), x


def quench(d: int, cfg: Config, key, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """The decay of a small tilt at every coupling of `rate_grid`, with layers of step
    `tau`: `(g, K)`, `g` `(betas, couplings, seeds, steps + 1)` half the difference of
    the mean token's first coordinate between two systems tilted by `±TILT` towards
    `e₁` from the same uniform tokens and driven by the same noise (the common noise
    cancels to first order in the tilt), and `K` `(betas, couplings)` the couplings
    run. All couplings run as one batch, one compiled program per d, β and step."""
    n, seeds = cfg.tokens, cfg.seeds
    ratios, betas = rate_grid(cfg), beta_grid(d)
    steps = math.ceil(cfg.quench / tau)
    out, couplings, tilt = [], [], TILT * jnp.eye(d)[0][None, None]
    for i, beta in enumerate(betas):
        threshold = noisy_threshold(float(beta), d)
        K = np.repeat(ratios, seeds) * threshold
        nominal = layer_coupling(K, beta, d, tau, threshold)
        base = normalize(jax.random.normal(jax.random.fold_in(key, i), (len(K), n, d)))
        dyn = eqx.filter_vmap(lambda k: usa_model(d, k, beta))(jnp.asarray(nominal))
        # one key per pair: system `b` tilted either way draws the same noise
        keys = jax.random.split(jax.random.fold_in(key, 100 + i), len(K))
        plus, minus = (keyed_layers(dyn, normalize(base + sign * tilt), keys, steps, tau,
                                    noise=TokenNoise(SIGMA), observe=_first_coordinate,
                                    block=BLOCK) for sign in (1, -1))
        out.append(np.asarray((plus - minus) / 2).reshape(len(ratios), seeds, steps + 1))
        couplings.append(ratios * threshold)
    return np.stack(out), np.stack(couplings)


def _first_coordinate(x):
    return jnp.mean(x[:, 0])


def equation_grid(d: int) -> mf.AbstractGrid:
    """The mean-field equation's grid of dimension `d`: `Circle(EQ_MODES)` or
    `Sphere(EQ_DEGREE)`."""
    return mf.Circle(EQ_MODES) if d == 2 else mf.Sphere(EQ_DEGREE)


def equation_rates(d: int, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """The equation's growth-rate runs: `(K, r)`, the couplings `(betas, rates)` (the
    couplings of `rate_grid` times `K_#`) and the order parameter `r` of the uniform
    density tilted by `EQ_TILT` along `e₁` at `EQ_RATE_TIMES`, `(betas, rates, times)`
    (`r` is the tilt's amplitude: the mean point stays on `e₁`). One vmapped solve."""
    grid, betas = equation_grid(d), beta_grid(d)
    mu0 = mf.uniform(grid) * (1 + EQ_TILT * grid.points[..., 0])
    K = rate_grid(cfg)[None] * np.array([noisy_threshold(float(b), d) for b in betas])[:, None]

    def run(beta, k):
        mus = mf.solve(grid, mu0, EQ_RATE_TIMES, beta=beta, coupling=k, dt0=EQ_DT)
        return jax.vmap(lambda m: mf.order_parameter(grid, m))(mus)

    r = jax.vmap(run)(jnp.repeat(jnp.asarray(betas), K.shape[1]), jnp.asarray(K.ravel()))
    return K, np.asarray(r).reshape(K.shape + (len(EQ_RATE_TIMES),))


def equation_caps(d: int) -> dict[str, np.ndarray]:
    """The equation's `K_c` runs, above `β*` (NaN rows at and below it): caps
    `e^{CAP x₁}` settled for `EQ_SETTLE` at `K/K_# ∈ KC_RATIOS`; per `(β, coupling)`
    the coupling `K`, the settled cap's free energy less the uniform density's
    (`gap`), and its `r` at the end and at half the time."""
    grid, betas = equation_grid(d), beta_grid(d)
    cap, uniform = mf.cap(grid, CAP), mf.uniform(grid)
    out = {k: np.full((len(betas), len(KC_RATIOS)), math.nan) for k in ("K", "gap", "r", "r_half")}
    above = [i for i, b in enumerate(betas) if b > noisy_beta_star(d) * (1 + 1e-9)]
    K = KC_RATIOS[None] * np.array([noisy_threshold(float(betas[i]), d) for i in above])[:, None]

    def run(beta, k):
        mus = mf.solve(grid, cap, np.array([0.0, EQ_SETTLE / 2, EQ_SETTLE]), beta=beta,
                       coupling=k, dt0=EQ_DT)
        gap = mf.free_energy(grid, mus[-1], beta, k) - mf.free_energy(grid, uniform, beta, k)
        return gap, mf.order_parameter(grid, mus[-1]), mf.order_parameter(grid, mus[1])

    b = jnp.repeat(jnp.asarray(betas[above]), len(KC_RATIOS))
    gap, r, r_half = jax.vmap(run)(b, jnp.asarray(K.ravel()))
    for name, values in zip(out, (K, gap, r, r_half)):
        out[name][above] = np.asarray(values).reshape(K.shape)
    return out


def fit_rates(t: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The decay rate `γ` of each series `g(t) ∝ e^{−γ t}` (least squares on `log g`,
    over the times where `g > 0`), for `g` `(..., steps)`; NaN with fewer than 3
    positive values."""
    flat = g.reshape(-1, g.shape[-1])
    rates = np.full(len(flat), math.nan)
    for i, series in enumerate(flat):
        keep = series > 0
        if keep.sum() >= 3:
            rates[i] = -fit_slope(t[keep], np.log(series[keep]))[0]
    return rates.reshape(g.shape[:-1])


def windows(cfg: Config, r: np.ndarray) -> list[WindowStatistics]:
    """The up and the down sweep's window at each coupling, from `r` `(2, couplings,
    seeds, steps)` (`ja.metrics.window_statistics`, judged by `GAP_Z` and
    `BLOCK_TAUS`)."""
    steps = int(round(cfg.window / cfg.sweep_tau))
    return [window_statistics(r[s], steps, cfg.blocks, gap_z=GAP_Z, block_taus=BLOCK_TAUS)
            for s in (0, 1)]


def hysteresis(ratios: np.ndarray, up: WindowStatistics,
               down: WindowStatistics) -> tuple[np.ndarray, float]:
    """`(where, width)`: the couplings where both sweeps are equilibrated and the down
    sweep's `r` is above the up sweep's by more than `HYSTERESIS_Z` standard errors,
    and their count times the grid's step; the width is NaN where no coupling is
    equilibrated in both sweeps."""
    both = up.equilibrated & down.equilibrated
    se = np.sqrt(up.se**2 + down.se**2)
    where = both & (down.mean - up.mean > HYSTERESIS_Z * se)
    return where, (float(where.sum() * (ratios[1] - ratios[0])) if both.any() else math.nan)


class NoisyTransition(AbstractExperiment):
    name = "noisy-transition"
    distributable = True
    title = ("The noisy transformer's phase transition (Mun & Rosenzweig 2026): K_# and K_c "
             "from the mean-field equation, K_# from particles at τ → 0, hysteresis where "
             "equilibrated")
    theorem = "Mun & Rosenzweig 2026, the noisy USA transition (arXiv 2604.16288, 2606.05140)"
    params = (
        Param("tokens", int, 2000, "tokens n per system", 2),
        Param("max_dim", int, 3, "the largest dimension d (d = 2 … max-dim, at most 3)", 2),
        Param("couplings", int, 9, "couplings K/K_# per sweep", 3),
        Param("k_min", float, 0.4, "smallest K/K_#", 0.0),
        Param("k_max", float, 1.5, "largest K/K_#", 0.0),
        Param("burn", float, 3.0, "time per coupling before the averaging window", 0.0),
        Param("window", float, 6.0, "averaging window per coupling (time)", 0.0),
        Param("tau", float, 0.02, "the larger layer step τ of the growth-rate runs (they "
              "also run at τ/2, for τ → 0)", 0.0),
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

    def refusals(self, config):
        cfg = settings(config)
        sweep_layers = (cfg.burn + cfg.window) / cfg.sweep_tau
        return (
            (not cfg.max_dim <= 3, f"--max-dim must be 2 or 3 (the mean-field equation's grids "
             f"are the circle and S²), got {cfg.max_dim!r}."),
            (not cfg.rate_span < 1, f"--rate-span must be < 1 (the couplings 1 ± span are "
             f"K/K_# > 0), got {cfg.rate_span!r}."),
            (not cfg.k_min < 1 < cfg.k_max, f"need --k-min < 1 < --k-max (the couplings K/K_# "
             f"must straddle the threshold), got {cfg.k_min!r} and {cfg.k_max!r}."),
            (cfg.blocks // 2 * cfg.seeds < 2, f"--blocks {cfg.blocks} with --seeds "
             f"{cfg.seeds} leaves one block mean in each half of a window, and the "
             "equilibration check needs their spread: take --blocks 4 or --seeds 2."),
            (cfg.window / cfg.sweep_tau < 2 * cfg.blocks, f"--window / --sweep-tau = "
             f"{cfg.window / cfg.sweep_tau:.3g} layers is too few for --blocks {cfg.blocks} "
             "(need two layers a block): lengthen --window or take fewer --blocks."),
            (cfg.quench < 2 * cfg.tau, f"--quench {cfg.quench:g} is shorter than two "
             f"layers of --tau {cfg.tau:g} (each growth rate is fit to at least three "
             "points): lengthen --quench or take a smaller --tau."),
            # as many layers as `mf.solve` takes steps at most, a run of hours already
            *((not layers <= MAX_STEPS, f"{flags} = {layers:.3g} layers is more than "
               f"{MAX_STEPS:.0e}: take a larger step.")
              for flags, layers in (("--couplings × (--burn + --window) / --sweep-tau",
                                     cfg.couplings * sweep_layers),
                                    ("--quench / (--tau / 2)", 2 * cfg.quench / cfg.tau))))

    def simulate(self, config, progress):
        cfg = settings(config)
        key = jax.random.PRNGKey(config.seed)
        data = {"ratios": coupling_grid(cfg), "rate_ratios": rate_grid(cfg),
                "rate_taus": np.asarray(step_levels(cfg)), "eq_times": EQ_RATE_TIMES,
                "kc_ratios": KC_RATIOS}
        for d in range(2, cfg.max_dim + 1):
            data[f"betas_d{d}"] = beta_grid(d)
            data[f"eq_K_d{d}"], data[f"eq_r_d{d}"] = equation_rates(d, cfg)
            data |= {f"kc_{k}_d{d}": v for k, v in equation_caps(d).items()}
            for j, tau in enumerate(step_levels(cfg)):
                data[f"g{j}_d{d}"], data[f"K_rates_d{d}"] = quench(
                    d, cfg, jax.random.fold_in(key, 1000 + 10 * d + j), tau)
            data[f"r_d{d}"] = sweep(d, cfg, jax.random.fold_in(key, d), progress=progress)
        return data

    def verdict(self, config, data):
        rows = measure(config, data)
        sharp = _worst(row["K_equation"] / row["K_theory"] - 1 for row in rows)
        critical = _worst(row["K_c_equation"] / row["K_c_theory"] - 1 for row in rows
                          if not row["continuous"])
        # the fold: every settled cap at or above `fold_coupling` is ordered (one at
        # least); a fold set too high leaves `K_c` unbracketed, which `critical` fails
        off_branch = sum(row["caps_above_fold"] - row["caps_ordered_above_fold"]
                         + (row["caps_above_fold"] == 0) for row in rows
                         if not row["continuous"])
        particles = _worst(row["rel_error"] for row in rows)
        z = _worst(row["z"] for row in rows)
        spread = _worst(row["K_se"] / row["K_theory"] for row in rows)
        checks = (sharp <= SHARP_TOL, critical <= CRITICAL_TOL, off_branch == 0,
                  particles <= TARGET and z <= 3 and spread <= TARGET / 2)
        ok = all(checks)  # a NaN (an unread measure) fails
        # particles within 3 s.e. but off by more than TARGET, or with an error above
        # TARGET / 2 (too large to tell a K_# 10 % off): neither agree nor contradict
        unresolved = not checks[3] and z <= 3
        # no estimate at all (NaN) decides nothing
        unread = math.isnan(particles) or math.isnan(z)
        undecided = ("" if not all(checks[:3]) else
                     "the particles' K_# could not be estimated (NaN): "
                     "raise --tokens, --seeds or --window" if unread else
                     f"the particles' K_# is within 3 standard errors but off by more than "
                     f"{TARGET:.0%}, or its standard error ({short(spread)} of K_#) is above "
                     f"{TARGET / 2:.1%}: raise --tokens or --seeds" if unresolved else "")
        parts = [f"d={row['d']} β/β*={row['beta_ratio']:g}: particles K/K_# = "
                 f"{short(row['K_estimate'] / row['K_theory'])} ± "
                 f"{short(row['K_se'] / row['K_theory'])}"
                 + ("" if row["continuous"] else
                    f", K_c/K_# = {short(row['K_c_equation'] / row['K_theory'])} "
                    f"(predicted {short(row['K_c_theory'] / row['K_theory'])}), fold "
                    f"{short(row['K_fold'] / row['K_theory'])} "
                    f"({row['caps_ordered_above_fold']}/{row['caps_above_fold']} caps above "
                    "it ordered)")
                 # at or below β* the transition is continuous: a gap between the sweeps
                 # is the finite window's, not a hysteresis (the figure shades none)
                 + (", no hysteresis (continuous)" if row["continuous"] else
                    f", hysteresis {short(row['hysteresis_width'])}"
                    if math.isfinite(row["hysteresis_width"]) else
                    ", no hysteresis read (no coupling equilibrated in both sweeps)")
                 + f" ({row['equilibrated']}/{row['couplings']} equilibrated)" for row in rows]
        words = ["within" if c else "NOT within" for c in checks]
        # which of the particles' three conditions failed, each in its own words
        near, close = particles <= TARGET, z <= 3
        resolved = "" if spread <= TARGET / 2 else f", s.e. NOT within {TARGET / 2:.1%}"
        line = (f"equation: K_# {words[0]} {SHARP_TOL:g} ({short(sharp)}), K_c from the "
                f"caps above the fold {words[1]} {CRITICAL_TOL:g} ({short(critical)}), the "
                f"caps above the fold {'' if checks[2] else 'NOT '}all ordered "
                f"({off_branch} not); particles at τ → 0 {'' if near else 'NOT '}within "
                f"{TARGET:.0%} and {'' if close else 'NOT '}within 3 s.e. of K_#{resolved} "
                f"(worst relative error {short(particles)}, worst z {short(z)}, "
                f"worst s.e. {short(spread)}); "
                + "; ".join(parts))
        numbers = {"max_rel_error_equation_sharp": sharp,
                   "max_rel_error_equation_critical": critical,
                   "caps_unordered_above_fold": off_branch,
                   "max_rel_error_particles": particles, "max_z_particles": z,
                   "max_se_particles": spread}
        plain = {k: v for k, v in settings(config).items()
                 if isinstance(v, (int, float, bool, str))}
        return Verdict(bool(ok), line, numbers, extra={"cases": rows, "settings": plain},
                       undecided=undecided)

    def draw(self, config, data, folder: Path):
        rows = measure(config, data)
        _write_table(rows, Path(folder) / "table.csv")
        return draw_sweeps(settings(config), data, rows, self.stem(folder))


def _worst(errors) -> float:
    """The largest `|error|`; NaN if any is NaN (an unread measure), 0 for none."""
    errors = np.abs(np.fromiter(errors, float))
    return float(np.max(errors)) if errors.size else 0.0


def measure(config: Config, data) -> list[dict]:
    """One row per `(d, β)`: the equation's `K_#` and `K_c` against the predictions,
    the particles' threshold at `τ/2`, `τ` and extrapolated to `τ → 0`, the
    equilibration and the hysteresis where equilibrated."""
    cfg = settings(config)
    return [_row(cfg, data, d, i, float(beta)) for d in range(2, cfg.max_dim + 1)
            for i, beta in enumerate(np.asarray(data[f"betas_d{d}"]))]


def rates_of(g: np.ndarray, tau: float) -> np.ndarray:
    """The decay rates `(couplings, seeds)` of one β's tilted pairs `g` (layers of step
    `tau`)."""
    return fit_rates(np.arange(g.shape[-1]) * tau, g)


def particle_threshold(data, d: int, i: int) -> dict:
    """The particles' threshold of `(d, β_i)` at each step of `rate_taus`, and the
    straight line through them at `τ = 0` (`ja.metrics.fit_intercept`)."""
    taus, K = np.asarray(data["rate_taus"]), np.asarray(data[f"K_rates_d{d}"])[i]
    fits = [fit_threshold(K, rates_of(np.asarray(data[f"g{j}_d{d}"])[i], tau))
            for j, tau in enumerate(taus)]
    values, se = np.array([f[0] for f in fits]), np.array([f[1] for f in fits])
    if np.all(np.isfinite(values)) and np.all(se > 0):
        zero, zero_se = fit_intercept(taus, values, se=se)
    else:
        zero, zero_se = math.nan, math.nan
    return {"K_estimate": zero, "K_se": zero_se, "K_at_tau": values.tolist(),
            "K_se_at_tau": se.tolist(), "rate_at_zero": fits[-1][2]}


def branch_caps(K: np.ndarray, r: np.ndarray, K_fold: float) -> tuple[np.ndarray, np.ndarray]:
    """`(above, on_branch)`: the settled caps at couplings `K` (NaN: not run) at or above
    the fold `K_fold`, and those of them ordered (`r > EQ_ORDERED`): the caps on the
    ordered branch, the only ones the `K_c` interpolation reads."""
    above = np.asarray(K) >= K_fold
    return above, above & (np.asarray(r) > EQ_ORDERED)


def _row(cfg, data, d, i, beta) -> dict:
    ratios, star = np.asarray(data["ratios"]), noisy_beta_star(d)
    K_theory = noisy_threshold(beta, d)
    continuous = bool(beta <= star * (1 + 1e-9))
    eq_K = np.asarray(data[f"eq_K_d{d}"])[i]
    eq_rates = fit_rates(np.asarray(data["eq_times"]), np.asarray(data[f"eq_r_d{d}"])[i])
    K_eq = fit_threshold(eq_K, eq_rates)[0]
    kc = {k: np.asarray(data[f"kc_{k}_d{d}"])[i] for k in ("K", "gap", "r")}
    K_fold = fold_coupling(beta, d)
    above, on_branch = branch_caps(kc["K"], kc["r"], K_fold)
    particles = particle_threshold(data, d, i)
    up, down = windows(cfg, np.asarray(data[f"r_d{d}"])[i])
    where, width = hysteresis(ratios, up, down)
    both = up.equilibrated & down.equilibrated
    return {"d": d, "beta": beta, "beta_ratio": round(beta / star, 6), "K_theory": K_theory,
            "continuous": continuous, "K_equation": K_eq,
            "K_c_theory": K_theory if continuous else transition_coupling(beta, d),
            "K_c_equation": K_eq if continuous else level_crossing(
                kc["K"], kc["gap"], falling=True, keep=on_branch),
            "K_fold": K_fold, "caps_above_fold": int(above.sum()),
            "caps_ordered_above_fold": int(on_branch.sum()),
            "caps_ordered_below_fold": int((~above & (kc["r"] > EQ_ORDERED)).sum()),
            **particles, "rel_error": particles["K_estimate"] / K_theory - 1,
            "z": ((particles["K_estimate"] - K_theory) / particles["K_se"]
                  if particles["K_se"] > 0 else math.nan),
            "rate_at_zero_theory": (d - 1) * SIGMA**2 / 2
            * layer_diffusion(d, cfg.tau, SIGMA),
            "hysteresis_width": width, "hysteresis_at": ratios[where].tolist(),
            "equilibrated": int(both.sum()), "couplings": len(ratios),
            "grid_step": float(ratios[1] - ratios[0]),
            # the largest over the numbers read (NaN if none, without NumPy's warning)
            "max_half_gap": float(np.fmax.reduce(np.abs(np.r_[up.gap, down.gap]))),
            "max_autocorrelation_time": float(np.fmax.reduce(np.r_[up.autocorrelation,
                                                                   down.autocorrelation])
                                              * cfg.sweep_tau),
            "window": float(cfg.window)}


def _write_table(rows: list[dict], path: Path) -> None:
    keys = [k for k in rows[0] if not isinstance(rows[0][k], list)]
    lines = [",".join(keys)] + [",".join(f"{row[k]:.6g}" if isinstance(row[k], float)
                                         else str(row[k]) for k in keys) for row in rows]
    text = ("\n".join(lines) + "\n").encode()
    atomic_write(path, lambda f: f.write(text))  # as every file of a run


def draw_sweeps(cfg: Config, data, rows: list[dict], stem: Path) -> list[Path]:
    """Per `(d, β)`: `r` against `K/K_#` (up and down sweeps, unequilibrated couplings
    faded, hysteresis shaded where equilibrated and the transition discontinuous; the
    floor `1/√n`, `K_#`, and above `β*` `K_c` and the fold, where the ordered branch
    ends: `ja.meanfield.fold_coupling`), and below it the growth rates: the
    particles' at `τ/2` and `τ` with their lines, the equation's (in the particles'
    time), and the estimate at `τ → 0`."""
    dims = list(range(2, cfg.max_dim + 1))
    fig, axes = figures.pyplot().subplots(
        2 * len(dims), len(BETA_RATIOS) + 1, figsize=(15.5, 5.8 * len(dims)), squeeze=False,
        width_ratios=[1] * len(BETA_RATIOS) + [0.55])
    n, ratios = cfg.tokens, np.asarray(data["ratios"])
    for row in rows:
        d, j = row["d"], BETA_RATIOS.index(row["beta_ratio"])
        i = 2 * dims.index(d)
        _draw_order(axes[i, j], row, ratios, windows(cfg, np.asarray(data[f"r_d{d}"])[j]), n)
        _draw_fit(axes[i + 1, j], data, row, j)
    for ax_row in axes:  # each row's legend in its own column, off the data
        ax_row[-1].axis("off")
        handles = {}
        for ax in ax_row[:-1]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        ax_row[-1].legend(list(handles.values()), list(handles), loc="center left",
                          fontsize=8, frameon=False)
    fig.tight_layout()
    taus = ", ".join(f"{t:g}" for t in data["rate_taus"])
    return figures.save_figure(fig, stem, f"The noisy USA transition: n = {n}, "
                               f"σ = √2; sweeps: τ = {cfg.sweep_tau:g}, window "
                               f"{cfg.window:g} after {cfg.burn:g} per coupling; rates: "
                               f"τ = {taus} over {cfg.quench:g}; {cfg.seeds} "
                               "seed(s); the equation at n = ∞")


def _draw_order(ax, row, ratios, windows, n) -> None:
    up, down = windows
    for w, marker, ls, color, label in ((up, "o", "-", "C0", "up sweep"),
                                        (down, "s", "--", "C3", "down sweep")):
        ax.errorbar(ratios, w.mean, yerr=w.se, fmt="none", ecolor=color, capsize=0)
        ax.plot(ratios, w.mean, ls, color=color, label=label)
        face = "none" if color == "C3" else color
        for keep, alpha, what in ((w.equilibrated, 1.0, ", equilibrated"),
                                  (~w.equilibrated, 0.3, ", not equilibrated")):
            if keep.any():
                ax.plot(ratios[keep], w.mean[keep], marker, color=color, mfc=face, ms=6,
                        alpha=alpha, label=label + what)
    step = row["grid_step"]
    # a continuous transition has no hysteresis: a gap there is the finite window's
    for k, at in enumerate([] if row["continuous"] else row["hysteresis_at"]):
        ax.axvspan(at - step / 2, at + step / 2, color="C3", alpha=0.12,
                   label="hysteresis (equilibrated)" if k == 0 else None)
    ax.axhline(1 / math.sqrt(n), color="0.5", ls=":", lw=1, label=r"floor $1/\sqrt{n}$")
    ax.axvline(1.0, color="k", lw=1, label=r"$K_\#$")
    if not row["continuous"]:
        ax.axvline(row["K_c_theory"] / row["K_theory"], color="C4", lw=1.2,
                   label=r"$K_c$ (free energy)")
        ax.axvline(row["K_fold"] / row["K_theory"], color="C4", ls=":", lw=1.2,
                   label="fold: the ordered branch's end (continuation)")
    ax.set_xlim(ratios[0] - 0.02, ratios[-1] + 0.02)
    kind = "continuous" if row["continuous"] else "discontinuous"
    ax.set_title(f"d = {row['d']}, β = {row['beta_ratio']:g} β* ({kind}); "
                 f"{row['equilibrated']}/{row['couplings']} equilibrated", fontsize=9)
    ax.set(xlabel=r"$K / K_\#(\beta)$", ylabel=r"order parameter $|\bar x|$", ylim=(0, 1.02))


def _draw_fit(ax, data, row, j) -> None:
    d, K_theory = row["d"], row["K_theory"]
    ratios = np.asarray(data[f"K_rates_d{d}"])[j] / K_theory
    xs = np.linspace(ratios[0], ratios[-1], 50)
    eq = fit_rates(np.asarray(data["eq_times"]), np.asarray(data[f"eq_r_d{d}"])[j])
    ax.plot(np.asarray(data[f"eq_K_d{d}"])[j] / K_theory, SIGMA**2 * eq, "k-", lw=2.5,
            alpha=0.35, label=r"equation ($n = \infty$, $\tau = 0$)")
    for k, tau in enumerate(np.asarray(data["rate_taus"])):
        rates = rates_of(np.asarray(data[f"g{k}_d{d}"])[j], tau)
        color, marker = ("C0", "o") if k == 0 else ("C1", "s")
        ax.plot(np.repeat(ratios, rates.shape[1]), rates.ravel(), marker, color=color, ms=5,
                mfc=color if k == 0 else "none", label=f"particles, τ = {tau:g}")
        finite = np.isfinite(rates).all(-1)
        if finite.sum() >= 2:
            ax.plot(xs, np.polyval(np.polyfit(np.repeat(ratios[finite], rates.shape[1]),
                                              rates[finite].ravel(), 1), xs),
                    color=color, lw=1)
    ax.axhline(0, color="0.5", lw=0.6)
    ax.axvline(1.0, color="k", lw=1)
    est, se = row["K_estimate"] / K_theory, row["K_se"] / K_theory
    lo, hi = xs[0] - 0.02, xs[-1] + 0.02
    if math.isfinite(est):
        # outside the couplings drawn, the estimate is marked at the edge it lies past
        shown = min(max(est, lo), hi)
        ax.axvline(shown, color="C2", ls="--" if shown == est else ":", lw=1.2,
                   label=r"particles at $\tau \to 0$"
                   + ("" if shown == est else f" (d = {row['d']}, β = {row['beta_ratio']:g} "
                                              f"β*: {short(est)}, off the axis)"))
        if math.isfinite(se):
            ax.axvspan(est - se, est + se, color="C2", alpha=0.2, label="± 1 s.e.")
    ax.set(xlim=(lo, hi), xlabel=r"$K / K_\#(\beta)$",
           ylabel=r"decay rate $\gamma$ of a tilt")
    # a rate line with no zero crossing leaves no estimate: said, not "nan ± nan"
    read = (rf"$K/K_\#$ = {short(est)} ± {short(se)}" if math.isfinite(est) else
            r"$K/K_\#$: no zero crossing")
    ax.set_title(rf"particles at $\tau \to 0$: {read}; equation: "
                 f"{short(row['K_equation'] / K_theory)}", fontsize=9)
