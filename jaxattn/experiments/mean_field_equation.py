"""`mean-field`: the mean-field equation itself (`ja.meanfield`), on the circle (`d = 2`).

1. **Particles → the equation**: `n` samples of `μ_0` moved by
   `ja.meanfield.circle_particles` against the equation, the RMS `mode_distance` at
   `t = --horizon` for `n = 10², 10³, …` (predicted `∝ n^{−1/2}`), and its growth from
   `t = 0`, the sampling error carried by the flow, against the linearised equation's
   (`ja.meanfield.fluctuation_distance`).
2. **The noisy phase diagram at `n = ∞`** (USA, `σ = 1`): `K_#` from the first mode's
   growth rate and, above `β*`, `K_c` from the settled caps' free energy.

The setup, the tolerances and the measured numbers: `docs/meanfield_equation.md`.
"""

import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .. import SelfAttentionDynamics, solve_flow
from .. import meanfield as mf
from .._artifacts import figures
from .._artifacts.trajectories import superscript
from ..meanfield._checks import MAX_STEPS, kernel_band
from ..meanfield._solve import DT0
from ..metrics import fit_crossing, fit_intercept, fit_slope, level_crossing, mean_error
from ..theory import noisy_beta_star, noisy_threshold
from .base import AbstractExperiment, Param, Verdict
from .verdicts import short

#: The first modes compared between particles and equation: `1 ≤ |k| ≤ DEGREE`.
DEGREE = 4
#: The most samples of the initial density at one `n`, and the most points flowed in
#: one vmapped program (samples × `n`; the samples of one `n` go in equal chunks, so one
#: program serves them all).
MAX_SAMPLES, CHUNK = 128, 400_000
#: The particles' tolerances, and how far the Fourier-mode particles may end from
#: `solve_flow`'s from the same sample: ten times `RTOL`, the integrators' accuracy (the
#: fields agree to rounding; at `rtol = 1e-12` the two end within 1e-13,
#: `tests/meanfield/test_meanfield_particles.py`). At `n = 10⁵` the sampling distance is 8e-3:
#: `RTOL` is four orders below it.
RTOL, ATOL, PAIRWISE_TOL = 1e-7, 1e-9, 1e-6
#: The predicted slope of the distance against `n`; the fit must agree with it within
#: `SLOPE_Z` standard errors, and those must resolve a 5 % error (`SLOPE_RESOLVE`).
SLOPE, SLOPE_Z = -0.5, 3.0
SLOPE_RESOLVE = 0.05 * abs(SLOPE)
#: The growth of the distance from `t = 0` to the horizon, measured against
#: `ja.meanfield.fluctuation_distance`'s (extrapolated to `n = ∞` in `1/n`): asked within
#: `SLOPE_Z` standard errors, which must resolve a 10 % error.
GROWTH_RESOLVE = 0.1
#: How closely the growth rates' zero crossing must give `K_#` (relative): the rates
#: are linear in `K`, so only the solver's accuracy enters.
SHARP_TOL = 1e-3
#: How closely the free energies' crossing must give `K_c` (relative): the crossing
#: is read between refined couplings 1 % apart.
CRITICAL_TOL = 0.005
#: The phase diagram's ranges (`β/β*`, `K/K_#`), its tilt and its cap.
BETA_RANGE, K_RANGE, TILT, CAP = (0.5, 2.5), (0.6, 1.4), 1e-4, 4.0
#: Times of the growth-rate fit. A down run is ordered and settled when its `r` at
#: the end is above `ORDERED` and moved less than `SETTLED` over the second half.
RATE_TIMES, ORDERED, SETTLED = np.linspace(0.0, 2.0, 5), 0.1, 1e-3
#: The grid of the phase diagram, and its step.
PHASE_MODES, PHASE_DT = 32, 0.05
#: Caps near the grid's free-energy crossing: this many over ± this fraction of it.
REFINE, REFINE_SPAN = 9, 0.04


def initial_density(grid) -> jnp.ndarray:
    """The particles' and the equation's common start: `(1 + 0.8 x₁ + 0.3 x₂)/2π`."""
    x = grid.points
    return mf.uniform(grid) * (1 + 0.8 * x[..., 0] + 0.3 * x[..., 1])


def sizes(max_tokens: int) -> list[int]:
    return [10**k for k in range(2, int(math.log10(max_tokens) + 1e-9) + 1)]


def convergence(config, progress) -> dict[str, np.ndarray]:
    """Part 1: per `n`, the RMS distance at `t = 0` and at `t = horizon` over
    `--seeds · n_max / n` samples (at most `MAX_SAMPLES`: the small `n` are cheap and
    the noisiest). The particles move under `ja.meanfield.circle_particles` (the field
    in Fourier modes, `O(n)` per step); `pairwise_gap` is their largest distance from
    `ja.solve_flow`'s (the pairwise sum, `O(n²)`) on the first sample of the smallest
    `n`. `distance` is the RMS at the horizon with the distance at `t = 0` as a control
    variate (`controlled_rms`); `distance_plain` without it."""
    grid, beta = mf.Circle(config.modes), config.beta
    ts = np.array([0.0, config.horizon])
    mu0 = initial_density(grid)
    mu = mf.solve(grid, mu0, ts, beta=beta, coupling=1.0, kernel="exp", sigma=0.0)
    ns = sizes(config.max_tokens)
    counts = [min(MAX_SAMPLES, config.seeds * ns[-1] // n) for n in ns]
    dist, spread = np.zeros((2, len(ns))), np.zeros(len(ns))
    plain, exact = np.zeros(len(ns)), np.zeros(len(ns))
    key = jax.random.PRNGKey(config.seed)
    flow = jax.vmap(lambda x: mf.circle_particles(x, jnp.asarray(ts), beta=beta, kernel="exp",
                                                  rtol=RTOL, atol=ATOL))
    for i, (n, count) in enumerate(tqdm(list(zip(ns, counts)), desc="particles",
                                        disable=not progress, leave=False)):
        chunks = -(-count // max(1, CHUNK // n))
        step = -(-count // chunks)  # equal chunks: one compiled program per n
        keys = jax.random.split(jax.random.fold_in(key, i), chunks * step)
        d2 = np.zeros((2, chunks * step))
        for start in range(0, chunks * step, step):
            x0 = draw(n, keys[start:start + step])
            xs = flow(x0)
            if i == start == 0:
                gap = pairwise_gap(x0[0], xs[0], beta, ts)
            for j in range(2):
                d2[j, start:start + len(x0)] = [
                    float(mf.mode_distance(grid, mf.density(grid, x), mu[j], DEGREE)) ** 2
                    for x in xs[:, j]]
        d2 = d2[:, :count]
        exact[i] = float(mf.sampling_distance(grid, mu0, n, DEGREE))
        dist[0, i], plain[i] = np.sqrt(np.mean(d2, axis=1))
        dist[1, i], spread[i] = controlled_rms(d2[1], d2[0], exact[i] ** 2)
    return {"tokens": np.array(ns), "samples": np.array(counts),
            "distance_start": dist[0], "distance_start_exact": exact, "distance": dist[1],
            "distance_error": spread, "distance_plain": plain, "pairwise_gap": gap}


def controlled_rms(y, z, z_mean) -> tuple[float, float]:
    """`√E[y]` and its standard error from samples `y` (squared distances at the
    horizon), with `z` (the same samples' squared distances at `t = 0`, whose mean
    `z_mean` is known exactly) as a control variate: `ȳ − c (z̄ − z_mean)`, `c` the
    regression coefficient of `y` on `z`. Its variance is `1 − ρ²` of the plain mean's
    (ρ ≈ 0.6–0.75 here); with fewer than 3 samples, the plain mean (NaN error for 1)."""
    y, z, count = np.asarray(y, float), np.asarray(z, float), len(y)
    if count < 3:
        m, se = map(float, mean_error(y))
    else:
        c = np.cov(y, z)[0, 1] / np.var(z, ddof=1)
        m = float(np.mean(y) - c * (np.mean(z) - z_mean))
        se = float(np.std(y - c * z, ddof=2) / math.sqrt(count))
    rms = math.sqrt(max(m, 0.0))
    # the RMS's standard error (delta method): se(mean d²) / (2 RMS)
    return rms, se / (2 * rms) if rms > 0 else math.nan


def draw(n: int, keys) -> jnp.ndarray:
    """`n` samples of `μ_0` per key, `(keys, n, 2)`. Its modes are `|k| ≤ 1`, so they
    are drawn on `Circle(2)`, whose distribution function costs `O(n)` per bisection
    step where the comparison's grid costs `O(n · modes)` (the same points to
    rounding)."""
    band = mf.Circle(2)
    mu0 = initial_density(band)
    return jax.vmap(lambda k: mf.sample(band, mu0, n, k))(keys)


def pairwise_gap(x0, xs, beta, ts) -> np.ndarray:
    """The largest distance between the particles `xs` that `circle_particles` moved
    from `x0` and `ja.solve_flow`'s (one head, `P = U = I`, kernel `"exp"`: `K = 1`), at
    the same tolerances."""
    eye = jnp.eye(2)[None]
    dyn = SelfAttentionDynamics(eye, eye, beta=beta, kernel="exp")
    pairwise = solve_flow(dyn, x0, jnp.asarray(ts), rtol=RTOL, atol=ATOL)
    return np.asarray(jnp.max(jnp.abs(pairwise - xs)))


def runs(grid, starts, ks, beta, ts):
    """Every start at every coupling (one vmapped solve): `r` at `ts` and the final
    free energy, `(starts, couplings, …)`."""

    def run(mu0, k):
        mus = mf.solve(grid, mu0, ts, beta=beta, coupling=k, dt0=PHASE_DT)
        return jax.vmap(lambda m: mf.order_parameter(grid, m))(mus), \
            mf.free_energy(grid, mus[-1], beta, k)

    return jax.vmap(lambda mu0: jax.vmap(lambda k: run(mu0, k))(ks))(starts)


def phase_diagram(config, progress) -> dict[str, np.ndarray]:
    """Part 2: per `β` (rows) and `K` (columns), the up runs' `r(t)` at `RATE_TIMES`,
    `settle/2` and `settle`, the down runs' `r` at the last two and free energy, and
    the uniform's. Where the caps' free energy crosses the uniform one's on the grid,
    `REFINE` more caps over `±REFINE_SPAN` of that crossing (`refine_*`)."""
    grid, d = mf.Circle(PHASE_MODES), 2
    betas = noisy_beta_star(d) * np.linspace(*BETA_RANGE, config.betas)
    ratios = np.linspace(*K_RANGE, config.couplings)
    ts = np.append(RATE_TIMES, [config.settle / 2, config.settle])
    cap = mf.cap(grid, CAP)
    starts = jnp.stack([mf.uniform(grid) * (1 + TILT * grid.points[..., 0]), cap])
    shape = (len(betas), len(ratios))
    out = {k: np.zeros(shape + s) for k, s in
           (("r_up", (len(ts),)), ("r_down", ()), ("r_down_half", ()), ("f_down", ()),
            ("f_uniform", ()), ("couplings", ()))}
    out |= {f"refine_{k}": np.full((len(betas), REFINE), np.nan)
            for k in ("couplings", "r", "r_half", "gap")}
    for i, beta in enumerate(tqdm(betas, desc="phase diagram", disable=not progress,
                                  leave=False)):
        ks = ratios * noisy_threshold(beta, d)
        r, f = runs(grid, starts, jnp.asarray(ks), beta, ts)
        f_uniform = np.asarray(mf.free_energy(grid, mf.uniform(grid), beta, jnp.asarray(ks)))
        out["couplings"][i], out["f_uniform"][i] = ks, f_uniform
        out["r_up"][i], out["r_down"][i], out["f_down"][i] = r[0], r[1, :, -1], f[1]
        out["r_down_half"][i] = r[1, :, -2]
        # on the parabola through the three smallest couplings where the caps settled
        first = np.flatnonzero(settled(r[1, :, -1], r[1, :, -2]))[:3]
        guess = fit_crossing(ks[first], (f[1] - f_uniform)[first], degree=2)[0]
        if math.isfinite(guess):
            fine = guess * np.linspace(1 - REFINE_SPAN, 1 + REFINE_SPAN, REFINE)
            r, f = runs(grid, cap[None], jnp.asarray(fine), beta, ts)
            f_uniform = np.asarray(mf.free_energy(grid, mf.uniform(grid), beta,
                                                  jnp.asarray(fine)))
            out["refine_couplings"][i], out["refine_gap"][i] = fine, f[0] - f_uniform
            out["refine_r"][i], out["refine_r_half"][i] = r[0, :, -1], r[0, :, -2]
    return out | {"betas": betas, "ratios": ratios, "times": ts}


def settled(r, r_half) -> np.ndarray:
    """Where a cap settled ordered: `r > ORDERED`, moved less than `SETTLED` over the
    second half of the run."""
    r, r_half = np.asarray(r), np.asarray(r_half)
    return (r > ORDERED) & (np.abs(r - r_half) < SETTLED)


def fitted_slope(data) -> tuple[float, float]:
    """The least-squares slope of `log distance` against `log n`, and its standard
    error from the RMS's (`distance_error`, carried through the fit; NaN where a size
    had one sample)."""
    return fit_slope(np.log(data["tokens"]), np.log(data["distance"]),
                     se=data["distance_error"] / data["distance"], weighted=False)


@functools.cache
def predicted_growth(modes: int, beta: float, horizon: float) -> float:
    """How much the RMS distance grows from `t = 0` to `horizon` to leading order in
    `1/n`, the same at every `n`: the sampling error carried by the linearised equation
    (`ja.meanfield.fluctuation_distance`). Cached: the verdict reads it per call."""
    grid = mf.Circle(modes)
    d = mf.fluctuation_distance(grid, initial_density(grid), np.array([0.0, horizon]), 1,
                                DEGREE, beta=beta, coupling=1.0, kernel="exp")
    return float(d[1] / d[0])


def fitted_growth(data, growth: float) -> tuple[float, float]:
    """The measured growth over the predicted one, `distance / (sampling_distance ·
    growth)` per `n`, extrapolated to `n = ∞` (the line in `1/n` at 0, weighted by the
    RMS's errors), and its standard error."""
    scale = data["distance_start_exact"] * growth
    return fit_intercept(1.0 / data["tokens"], data["distance"] / scale,
                         se=data["distance_error"] / scale)


def _power(n) -> str:
    """`10²`-style for a power of ten."""
    return f"10{superscript(round(math.log10(n)))}"


def predictions(betas) -> tuple[np.ndarray, np.ndarray]:
    """`K_#(β)` (`ja.theory.noisy_threshold`) and `K_c(β)` (`transition_coupling`;
    NaN at and below `β*`, where it is `K_#`) on the circle."""
    sharp = np.array([noisy_threshold(b, 2) for b in betas])
    critical = np.array([mf.transition_coupling(b, 2) if b > noisy_beta_star(2) * (1 + 1e-9)
                         else math.nan for b in betas])
    return sharp, critical


def measured_sharp(data) -> np.ndarray:
    """Per `β`: the zero crossing in `K` of the fitted growth rates (a line in `K`)."""
    t = data["times"][: len(RATE_TIMES)]
    logs = np.log(data["r_up"][..., : len(RATE_TIMES)])
    return np.array([fit_crossing(ks, [fit_slope(t, series)[0] for series in row])[0]
                     for ks, row in zip(data["couplings"], logs)])


def measured_critical(data) -> np.ndarray:
    """Per `β`: where the refined caps' free energy first falls below the uniform one's,
    interpolated linearly between the two couplings around the sign change (both caps
    still ordered, `r > ORDERED`); NaN where there is none. The caps near `K_c` are
    still settling at the end (the ordered branch's saddle-node is close), but the free
    energy has converged at second order where `r` has at first."""
    return np.array([level_crossing(ks, gap, falling=True, keep=r > ORDERED) for ks, gap, r
                     in zip(data["refine_couplings"], data["refine_gap"], data["refine_r"])])


class MeanFieldEquation(AbstractExperiment):
    name = "mean-field"
    title = ("The mean-field equation: particles converge to it as n^(-1/2), and its noisy "
             "phase diagram at n = ∞ has the predicted K_# and K_c")
    theorem = "Mun & Rosenzweig 2026 (K_#, K_c); the mean-field limit (Geshkovski et al.)"
    params = (
        Param("modes", int, 32, "Fourier modes of the particles' comparison", 8),
        Param("beta", float, 1.0, "β of the particles' comparison (σ = 0)", 0.0),
        Param("horizon", float, 1.0, "time of the particles' comparison", 0.0),
        Param("max_tokens", int, 100_000, "the largest n (n = 10², 10³, … up to it; "
              "10⁶ takes minutes on a CPU)", 1000),
        Param("seeds", int, 48, "samples of the initial density at the largest n, at "
              "least 2 (one has no standard error; the slope's falls as 1/√seeds)", 2),
        Param("betas", int, 5, "temperatures of the phase diagram, β/β* in [0.5, 2.5]", 2),
        Param("couplings", int, 13, "couplings of the phase diagram, K/K_# in [0.6, 1.4]", 3),
        Param("settle", float, 40.0, "time the phase diagram's runs settle (> 4: its half "
              "comes after the growth-rate fit's last time, 2)", 4.0),
    )

    def refusals(self, config):
        """What `mf.solve` and `circle_particles` would refuse or fail at, in flags,
        before the particles' part runs."""
        dtype = jnp.result_type(float)
        limit = 0.98 * math.log(float(jnp.finfo(dtype).max))  # as `mf.solve`'s check
        yield (config.beta > limit, f"--beta {config.beta:g} is past the exp kernel's range in "
               f"{jnp.dtype(dtype).name} (β ≤ {limit:.4g}: its force grows as e^β/β).")
        need = kernel_band(config.beta, 0.0)  # the circle's ν = d/2 − 1 = 0
        yield (config.modes < need, f"--modes {config.modes} cannot represent the kernel at "
               f"--beta {config.beta:g}: raise --modes to at least {need}.")
        for flag, time, dt in (("--horizon", config.horizon, DT0),
                               ("--settle", config.settle, PHASE_DT)):
            steps = math.ceil(time / dt - 1e-9)
            yield (steps > MAX_STEPS, f"{flag} {time:g} takes {steps:.3g} steps of {dt:g}, "
                   f"more than {MAX_STEPS:.0e}: give at most {flag} {MAX_STEPS * dt:g}.")

    def simulate(self, config, progress):
        return convergence(config, progress) | phase_diagram(config, progress)

    def verdict(self, config, data):
        slope, slope_err = fitted_slope(data)
        gap = float(data["pairwise_gap"])
        k_sharp, k_critical = predictions(data["betas"])
        sharp = measured_sharp(data) / k_sharp
        above = np.isfinite(k_critical)
        kc = k_critical[above]
        critical = measured_critical(data)[above] / kc
        sharp_err = float(np.max(np.abs(sharp - 1)))
        critical_err = float(np.max(np.abs(critical - 1))) if critical.size else math.nan
        growth = predicted_growth(config.modes, config.beta, config.horizon)
        ratio, ratio_err = fitted_growth(data, growth)
        resolved = SLOPE_Z * slope_err <= SLOPE_RESOLVE  # NaN: not resolved
        growth_resolved = SLOPE_Z * ratio_err <= GROWTH_RESOLVE
        # a contradiction is a check that resolves its tolerance and misses it; a check
        # that cannot resolve it (or measured nothing) leaves the run undecided
        missed = ((resolved and abs(slope - SLOPE) > SLOPE_Z * slope_err)
                  or (growth_resolved and abs(ratio - 1) > SLOPE_Z * ratio_err)
                  or not gap <= PAIRWISE_TOL or not sharp_err <= SHARP_TOL
                  or critical_err > CRITICAL_TOL)  # NaN: none measured, not missed
        unsettled = critical.size and not np.isfinite(critical_err)
        why = [w for w, lacking in (
            ("raise --seeds", not (resolved and growth_resolved)),
            ("no cap settled ordered near K_c within --settle: raise --settle", unsettled))
               if lacking]
        ok = not missed and not why
        asked = (f"asked within {SLOPE_Z:g} standard errors, which resolve a 5 % error"
                 if resolved else
                 f"{SLOPE_Z:g} standard errors are {SLOPE_Z * slope_err:.3f} > "
                 f"{SLOPE_RESOLVE:g}: a 5 % error is not resolved, raise --seeds")
        line = (f"particles → equation: distance ∝ n^{slope:.3f} ± {slope_err:.3f} over n = "
                f"{_power(data['tokens'][0])}…{_power(data['tokens'][-1])} (predicted {SLOPE}, "
                f"{asked}); growth from t = 0 to {config.horizon:g} at n = ∞ "
                f"{ratio:.3f} ± {ratio_err:.3f} of the linearised equation's ×{growth:.3f} "
                f"(asked within {SLOPE_Z:g} standard errors, ≤ {GROWTH_RESOLVE:g}); "
                f"Fourier-mode particles = solve_flow's to {short(gap)} (asked "
                f"≤ {PAIRWISE_TOL:g}); K_# from the growth rates to {short(sharp_err)} (asked ≤ "
                f"{SHARP_TOL:g}); K_c from the free energies to "
                f"{'— (none settled)' if unsettled else short(critical_err)} "
                f"(asked ≤ {CRITICAL_TOL:g}) at β/β* = "
                + ", ".join(f"{b:.3g}" for b in data["betas"][above] / noisy_beta_star(2)))
        numbers = {"slope": slope, "slope_error": slope_err, "growth": growth,
                   "growth_ratio": ratio, "growth_ratio_error": ratio_err, "pairwise_gap": gap,
                   "sharp_error": sharp_err, "critical_error": critical_err,
                   "sharp_ratio": sharp.tolist(), "critical_ratio": critical.tolist(),
                   "K_c": kc.tolist()}
        return Verdict(bool(ok), line, numbers, undecided="" if missed else "; ".join(why))

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        fig, axes = plt.subplots(1, 3, figsize=(18, 5.6))
        _draw_convergence(axes[0], config, data)
        # from uniform, r ends between ~1e-8 (decayed) and ~0.2 (grown): a log scale shows
        # where K_# parts them (on the cap's 0–1 scale the map was one dark colour)
        for ax, key, what, label in (
                (axes[1], "up", "from uniform (tilt 1e-4)", "order parameter $r$ at the end (log)"),
                (axes[2], "down", f"from a cap (κ = {CAP:g})", "order parameter $r$ at the end")):
            fig.colorbar(_draw_phase(ax, data, key, what), ax=ax, label=label)
        return figures.save_figure(
            fig, self.stem(folder),
            f"The mean-field equation on the circle: particles against the equation "
            f"(σ = 0, β = {config.beta:g}, t = {config.horizon:g}), and the noisy "
            f"phase diagram at n = ∞ (t = {config.settle:g})")


def _draw_convergence(ax, config, data):
    ns = data["tokens"]
    for key, label, color in (("distance_start", "t = 0 (sampling)", "0.5"),
                              ("distance", f"t = {config.horizon:g} (t = 0 its control "
                                           "variate)", "C0")):
        rms = data[key]
        slope = fit_slope(np.log(ns), np.log(rms))[0]
        bars, error = None, ""
        if key == "distance":
            bars, error = data["distance_error"], f" ± {fitted_slope(data)[1]:.3f}"
        # no caps: at 10⁵ the bars are shorter than the marker
        ax.errorbar(ns, rms, yerr=bars, fmt="o-", color=color, capsize=0,
                    label=f"{label}: slope {slope:.3f}{error}")
    if "distance_start_exact" in data:  # runs before the control variate lack it
        ax.plot(ns, data["distance_start_exact"], "_", color="k", ms=16, mew=1.5,
                label="t = 0 exact (sampling_distance)", zorder=1.5)
        growth = predicted_growth(config.modes, config.beta, config.horizon)
        ax.plot(ns, growth * data["distance_start_exact"], "_", color="C3", ms=16, mew=1.5,
                label=f"t = {config.horizon:g} linearised equation (fluctuation_distance, "
                      f"×{growth:.3f})", zorder=1.5)
    ax.set(xscale="log", yscale="log")
    ref = 2 * data["distance"][0] * (ns / ns[0]) ** SLOPE  # above the data, not on it
    ax.loglog(ns, ref, "k--", lw=0.9, label=r"$\propto n^{-1/2}$")
    counts = data["samples"]
    ax.set(xlabel=f"tokens $n$ (RMS over {int(counts[0])} … {int(counts[-1])} samples)",
           ylabel=f"RMS distance of modes $1 \\leq |k| \\leq {DEGREE}$",
           title=f"particles against the equation\n(circle_particles; = solve_flow to "
                 f"{float(data['pairwise_gap']):.0e} at n = {int(ns[0])})")
    figures.legend_below(ax, ncol=1)


def _draw_phase(ax, data, key, what):
    """The final order parameter over `(β, K/K_#(β))`, with `K_#` (the line 1), `K_c`
    and what the runs read."""
    betas, ratios = data["betas"], data["ratios"]
    from matplotlib.colors import LogNorm  # (matplotlib loads with the figures)

    r = data["r_up"][..., -1] if key == "up" else data["r_down"]
    floor = np.min(r[r > 0]) if np.any(r > 0) else 1e-12
    scale = dict(norm=LogNorm(vmin=floor, vmax=max(1.0, float(np.max(r))))) if key == "up" \
        else dict(vmin=0, vmax=1)
    mesh = ax.pcolormesh(betas, ratios, np.maximum(r, floor).T if key == "up" else r.T,
                         shading="nearest", cmap="viridis", **scale)
    star = noisy_beta_star(2)
    sharp, critical = predictions(betas)
    ax.axhline(1.0, color="C1", lw=2, label=r"$K_\#(\beta)$ (linear stability)")
    above = np.isfinite(critical)
    ax.plot(np.r_[star, betas[above]], np.r_[1.0, critical[above] / sharp[above]], color="red",
            ls="--", lw=1.6, label=r"$K_c(\beta)$ (zonal minimisation, at these $\beta$)")
    ax.axvline(star, color="C2", ls=":", lw=1.4, label=r"$\beta^*$")
    if key == "up":
        ax.plot(betas, measured_sharp(data) / sharp, "o", mfc="none", mec="C1", ms=10, mew=1.5,
                label=r"$K_\#$ read from the growth rates")
    else:
        ax.plot(betas[above], measured_critical(data)[above] / sharp[above], "+", color="magenta",
                ms=14, mew=2, label=r"$K_c$ read from the caps' free energy")
    ax.set(xlabel=r"$\beta$", ylabel=r"coupling $K / K_\#(\beta)$", title=f"n = ∞, {what}")
    figures.legend_below(ax, ncol=2)
    return mesh
