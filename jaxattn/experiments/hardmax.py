"""`hardmax`: the `β → ∞` limit of attention as Frank–Wolfe (Alcalde, Geshkovski,
Ruiz-Balet, "Attention's forward pass and Frank–Wolfe", arXiv 2508.09628, revised
abstract).

The update (`frank_wolfe`, built from `dyn.attention` in a `lax.scan`: the library's
`norm="none"` layer lacks the residual `−x_i`):

    x_i ← x_i + γ_t (Σ_j α_ij x_j − x_i),    γ_t = τ (constant) or 2/(t + 2),

with `α` softmax at `β` or `kernel="hardmax"`. In 2-D and float64 it measures PSD `P`
(Voronoi cells, `voronoi_checks`), NSD `P` (the collapse, `energy`, the Frank–Wolfe
gap) and softmax against hardmax (`ONE_STEP`, `RATE_TOL`). The reading, the measured
numbers and what changed: `docs/limits.md` ("The hardmax limit").
"""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray
from scipy.spatial import ConvexHull, Delaunay, cKDTree
from tqdm.auto import tqdm

from .._artifacts import figures
from .._dynamics import SelfAttentionDynamics
from .._programs import kept_jit
from ..metrics import fit_slope
from .base import AbstractExperiment, Param, Verdict
from .verdicts import short

#: A small run for tests and smoke checks: `jaxattn run hardmax` with these.
QUICK = {"vertices": 5, "tokens": 12, "steps": 40, "betas": 9, "nsd_steps": 400}

#: Relative tolerance of the Voronoi checks (float64 rounding over the run).
TOL = 1e-9
#: The one-step distance's rate is fitted on `ONE_STEP` values `β = (4 … 18)/g`,
#: and must match the score gap `g` to `RATE_TOL` (relative): 10 % off fails.
ONE_STEP, RATE_TOL = 8, 0.03
#: The softmax → hardmax parts are judged where the largest β reaches the hardmax
#: regime: `β_max · g ≥ REACH` (`g` the start's score gap; `e^{−5}` = 0.7 %).
REACH = 5.0


@kept_jit
def frank_wolfe(dyn: SelfAttentionDynamics, x0: Float[Array, "n d"], steps: int,
                tau: float, schedule: bool = False) -> Float[Array, "s n d"]:
    """The attention step as Frank–Wolfe, `x_i ← x_i + γ_t (Σ_j α_ij x_j − x_i)`.

    **Arguments:**

    - `dyn`: the model; its first head's `attention(0, x)` gives `α`.
    - `x0`: tokens `(n, d)`.
    - `steps`: the number of steps.
    - `tau`: the constant step size `γ_t = τ` (unused with `schedule`).
    - `schedule`: `γ_t = 2/(t + 2)`, Frank–Wolfe's classical step sizes.

    **Returns:**

    The tokens at steps `0 … steps`, `(steps + 1, n, d)`.
    """
    def step(x, t):
        mixed = dyn.attention(jnp.zeros((), x.dtype), x)[0] @ x
        gamma = 2 / (t + 2) if schedule else tau
        x = x + gamma * (mixed - x)
        return x, x

    _, ys = jax.lax.scan(step, x0, jnp.arange(steps, dtype=x0.dtype))
    return jnp.concatenate([x0[None], ys])


def key_query(key: PRNGKeyArray, random_psd: bool) -> np.ndarray:
    """The PSD key–query matrix: the identity, or `A Aᵀ + I/2` scaled to trace 2."""
    if not random_psd:
        return np.eye(2)
    A = np.asarray(jax.random.normal(key, (2, 2)))
    P = A @ A.T + np.eye(2) / 2
    return 2 * P / np.trace(P)


def voronoi_start(key: PRNGKeyArray, P: np.ndarray, m: int, n: int) -> np.ndarray:
    """`m` sites on the ellipse `vᵀ P v = 1` (angles jittered about an even spread)
    then `n` interior tokens, random convex combinations of them: `(m + n, 2)`."""
    jitter, weights = map(np.asarray, _voronoi_draws(key, m, n))
    angle = 2 * np.pi * (np.arange(m) + 0.5 * jitter) / m
    L = np.linalg.cholesky(P)
    sites = np.linalg.solve(L.T, np.stack([np.cos(angle), np.sin(angle)])).T
    return np.concatenate([sites, weights @ sites])


@kept_jit(static_argnames=("m", "n"))
def _voronoi_draws(key, m: int, n: int):
    """`voronoi_start`'s random numbers, one program: the angles' jitter `(m,)` and the
    interior tokens' convex weights `(n, m)`."""
    k_angle, k_weight = jax.random.split(key)
    return jax.random.uniform(k_angle, (m,)), jax.random.dirichlet(k_weight, jnp.ones(m), (n,))


@kept_jit(static_argnames=())
def _keys(seed):
    """The keys of `P`, of the start and of the NSD start, one program (a list: iterating
    over a device array would compile a program)."""
    return list(jax.random.split(jax.random.PRNGKey(seed), 3))


def voronoi_cells(x: np.ndarray, sites: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The index of the nearest site in the `P`-metric (scipy's k-d tree in whitened
    coordinates `Lᵀ x`): the Voronoi cell of each row of `x`."""
    L = np.linalg.cholesky(P)
    return cKDTree(sites @ L).query(x @ L)[1]


def score_gap(x: np.ndarray, P: np.ndarray) -> float:
    """The smallest gap between a token's largest score `x_iᵀ P x_j` and its second."""
    s = np.sort(x @ P @ x.T, axis=-1)
    return float(np.min(s[:, -1] - s[:, -2]))


def fw_gap(ys: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The mean Frank–Wolfe gap `max_j x_iᵀ P x_j − x_iᵀ P x_i` over the tokens, per step."""
    s = np.einsum("tid,de,tje->tij", ys, P, ys)
    return np.mean(s.max(-1) - np.einsum("tii->ti", s), axis=-1)


def quadratic_energy(ys: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The mean of the paper's energy `f(x_i) = −½ x_iᵀ P x_i` over the tokens, per step,
    less `f` at the collapse point (the last step's mean token): `≥ 0` for NSD `P`
    near the end, and `O(1/t)` by the paper."""
    end = ys[-1].mean(0)
    energy = -0.5 * np.einsum("tid,de,tie->ti", ys, P, ys).mean(-1)
    return energy + 0.5 * end @ P @ end


def in_hull(points: np.ndarray, hull_of: np.ndarray) -> np.ndarray:
    """Whether each of `points` lies in the convex hull of `hull_of` (scipy)."""
    return Delaunay(hull_of).find_simplex(points) >= 0


def voronoi_checks(data, tau: float) -> dict[str, np.ndarray]:
    """Per interior token: the prediction's parts, from the saved PSD run."""
    ys, P, m = data["ys_psd"], data["P"], int(data["vertices"])
    sites, inner, cell = ys[0, :m], ys[:, m:], data["cell"]
    target = sites[cell]                                      # (n, 2)
    start = inner[0] - target
    size = np.linalg.norm(start, axis=-1)
    off = inner - target                                      # (s, n, 2)
    across = np.abs(off[..., 0] * start[:, 1] - off[..., 1] * start[:, 0]) / size
    hard = np.argmax(np.einsum("tid,de,ke->tik", inner, P, sites), axis=-1)
    dist = np.linalg.norm(off, axis=-1)
    # a token on its site (τ = 1 lands there in one step) has no ratio left to test
    there = dist[:-1] <= 1e-12 * size
    ratio = np.where(there, 1 - tau, dist[1:] / np.where(there, 1.0, dist[:-1]))
    return {
        "site_move": np.max(np.abs(ys[:, :m] - sites)),
        "in_cell": np.all(hard == cell, axis=0),
        "straight": np.max(across, axis=0) / size,
        "ratio_error": np.max(np.abs(ratio - (1 - tau)), axis=0),
        "final": dist[-1] / size,
    }


def rates(data) -> dict[str, float]:
    """The fitted rates: the one-step distance `∝ e^{−β r}` on `ONE_STEP` values of β
    (`r` beside the start's score gap `score_gap`), the local slopes
    `Δ log(distance)/Δ log β` of the whole run's largest distance, the NSD gap and
    energy `∝ t^q` for `γ_t = 2/(t + 2)` (gap: second half of the run; energy: `t`
    from `T/20` to `T/4`, clear of the collapse point it is measured from), and the
    gap's factor per step for constant `τ`."""
    betas, run = data["betas"], data["dist_run"]
    one = data["dist_one_fit"]
    keep = one > 1e-13
    t = np.arange(len(data["gap_fw"]), dtype=float)
    half = (t >= t[-1] / 2) & (data["gap_fw"] > 1e-15)
    early = (t >= t[-1] / 20) & (t <= t[-1] / 4) & (data["energy_fw"] > 1e-15)
    const = (t >= 1) & (data["gap_const"] > 1e-13)
    log_t = np.log(np.maximum(t, 1))
    return {
        "one_step_rate": -fit_slope(data["betas_one"][keep], np.log(one[keep]))[0],
        "one_step_points": int(keep.sum()),
        "score_gap": float(data["score_gap"]),
        "run_local_slopes": (np.diff(np.log(np.maximum(run, 1e-300)))
                             / np.diff(np.log(betas))).tolist(),
        "gap_exponent": fit_slope(log_t[half], np.log(data["gap_fw"][half]))[0],
        "energy_exponent": fit_slope(log_t[early], np.log(data["energy_fw"][early]))[0],
        "gap_factor_constant": math.exp(fit_slope(t[const], np.log(data["gap_const"][const]))[0]),
        "center_fw": float(np.linalg.norm(data["ys_nsd_fw"][-1].mean(0))),
        "center_constant": float(np.linalg.norm(data["ys_nsd"][-1].mean(0))),
        "centers_in_initial_hull": bool(np.all(in_hull(
            np.stack([data["ys_nsd_fw"][-1].mean(0), data["ys_nsd"][-1].mean(0)]),
            data["ys_nsd"][0]))),
        "radius": float(np.max(np.linalg.norm(data["ys_nsd"][0], axis=-1))),
    }


class Hardmax(AbstractExperiment):
    name = "hardmax"
    title = ("The hardmax limit β → ∞ as Frank–Wolfe (Alcalde, Geshkovski, Ruiz-Balet "
             "2025): Voronoi cells for PSD P, collapse for NSD P, softmax → hardmax")
    theorem = "Alcalde, Geshkovski, Ruiz-Balet 2025: hardmax attention as Frank–Wolfe"
    params = (
        Param("vertices", int, 6, "sites on the ellipse vᵀPv = 1 (hull vertices)", 3),
        Param("tokens", int, 24, "interior tokens (random convex combinations)", 1),
        Param("steps", int, 60, "Frank–Wolfe steps of the PSD and softmax runs", 1),
        Param("tau", float, 0.2, "constant step size γ = τ in (0, 1)", 0.0),
        Param("random_psd", bool, False, "a random positive definite P, not the identity"),
        Param("betas", int, 13, "number of β from 1 to --beta-max (log-spaced)", 2),
        Param("beta_max", float, 1e4, "largest β of the softmax runs", 1.0),
        Param("nsd_steps", int, 2000, "steps of the NSD runs (≥ 40: the energy's exponent "
              "is fitted on t in [T/20, T/4])", 40),
    )

    def refusals(self, config):
        left = (1 - min(config.tau, 1.0)) ** config.steps  # of each token's way, at the end
        return ((config.tau > 1, f"--tau is a Frank–Wolfe step size: it must be ≤ 1, got "
                 f"{config.tau!r}."),
                # x + γ(v − x) = v: each token jumps to a vertex at every step; the NSD run
                # kept its spread (× 1.0000 per step) and still read "collapse"
                (config.tau == 1, "--tau 1 jumps every token onto a vertex at each step (x + "
                 "γ(v − x) = v), so the constant-step run cannot collapse; choose --tau < 1."),
                (left > 0.5, f"--tau {config.tau:g} over --steps {config.steps} leaves the "
                 f"tokens {left:.0%} of their way from their sites: the Voronoi prediction "
                 "would be tested on tokens that hardly moved; raise --tau or --steps."))

    def simulate(self, config, progress):
        k_p, k_x, k_n = _keys(config.seed)
        P = key_query(k_p, config.random_psd)
        m, tau, steps = config.vertices, config.tau, config.steps
        x0 = voronoi_start(k_x, P, m, config.tokens)
        eye = jax.device_put(np.eye(2)[None])  # device_put: jnp.asarray may compile a copy

        def model(sign, **kw):
            return SelfAttentionDynamics(jax.device_put(sign * P[None]), eye, norm="none", **kw)

        ys = np.asarray(frank_wolfe(model(1, kernel="hardmax"), x0, steps, tau))
        betas = np.geomspace(1, config.beta_max, config.betas)
        one, run = np.zeros(len(betas)), np.zeros(len(betas))
        at = np.zeros(len(betas), dtype=np.int64)
        for b, beta in enumerate(tqdm(betas, desc=self.name, disable=not progress,
                                      leave=False)):
            soft = np.asarray(frank_wolfe(model(1, beta=beta), x0, steps, tau))
            gap = np.linalg.norm(soft - ys, axis=-1).max(-1)
            one[b], run[b], at[b] = gap[1], gap.max(), np.argmax(gap)
        gap0 = score_gap(x0, P)
        betas_one = np.linspace(4.0, 18.0, ONE_STEP) / gap0  # from 4/g to 18/g
        one_fit = np.array([np.abs(np.asarray(frank_wolfe(
            model(1, beta=beta), x0, 1, tau))[1] - ys[1]).max()
            for beta in betas_one])
        z = np.asarray(jax.random.normal(k_n, (m + config.tokens, 2)))
        z = z - z.mean(0)  # the origin inside the hull
        nsd = model(-1, kernel="hardmax")
        ys_fw = np.asarray(frank_wolfe(nsd, z, config.nsd_steps, tau, schedule=True))
        ys_c = np.asarray(frank_wolfe(nsd, z, config.nsd_steps, tau))
        return {"P": P, "vertices": np.asarray(m), "ys_psd": ys,
                "cell": voronoi_cells(x0[m:], x0[:m], P), "hull": ConvexHull(x0).vertices,
                "betas": betas, "dist_one": one, "dist_run": run, "run_step": at,
                "betas_one": betas_one, "dist_one_fit": one_fit,
                "score_gap": np.asarray(gap0),
                "gap_fw": fw_gap(ys_fw, -P), "gap_const": fw_gap(ys_c, -P),
                "energy_fw": quadratic_energy(ys_fw, -P),
                "energy_const": quadratic_energy(ys_c, -P),
                "ys_nsd": ys_c[:steps + 1], "ys_nsd_fw": ys_fw[-1:]}

    def verdict(self, config, data):
        c, r = voronoi_checks(data, config.tau), rates(data)
        held = (c["in_cell"] & (c["straight"] < TOL) & (c["ratio_error"] < TOL))
        hull_ok = sorted(data["hull"].tolist()) == list(range(int(data["vertices"])))
        n_held, n = int(held.sum()), len(held)
        rate_error = abs(r["one_step_rate"] / r["score_gap"] - 1)
        first = data["run_step"] == 1
        criteria = (  # each part of the verdict, and what it says when it fails
            (c["site_move"] < TOL, "sites stationary"),  # to rounding: τ = 1 moves 1e-16
            (hull_ok, "the hull's vertices are the sites"),
            (n_held == n, "the Voronoi prediction for every interior token"),
            (r["gap_exponent"] <= -1, "FW gap ∝ t^-1 or faster"),
            (r["energy_exponent"] <= -1, "energy ∝ t^-1 or faster"),
            (r["centers_in_initial_hull"], "collapse points inside the initial hull"),
            (rate_error <= RATE_TOL, f"one-step rate within {RATE_TOL:g}"),
            (r["one_step_points"] >= 3, "≥ 3 β resolved for the one-step fit"),
            (data["dist_run"][-1] < data["dist_run"][0],
             "the run's largest distance smaller at the largest β than at β = 1"))
        missed = [words for held_, words in criteria if not held_]
        ok = not missed
        # the last three parts need β past the hardmax regime: short of it, undecided
        reach = float(data["betas"][-1] * r["score_gap"])
        short_of = bool(missed) and reach < REACH and all(
            words in {w for _, w in criteria[-3:]} for words in missed)
        undecided = (f"the largest β × the start's score gap is {reach:.2g}, short of the "
                     f"hardmax regime ({REACH:g}): raise --beta-max to "
                     f"{REACH / r['score_gap']:.3g}") if short_of else ""
        slopes = ", ".join(f"{v:.2g}" for v in r["run_local_slopes"])
        line = (f"PSD: sites stationary (moved {short(c['site_move'])}), the Voronoi "
                f"prediction held for {n_held}/{n} interior tokens (in their cell, on a "
                f"straight line, distance × {1 - config.tau:g} per step); NSD: quadratic "
                f"energy ∝ t^{short(r['energy_exponent'])} and mean FW gap ∝ "
                f"t^{short(r['gap_exponent'])} with γ = 2/(t+2) (paper: O(t^-1)), × "
                f"{short(r['gap_factor_constant'])} per step with γ = τ, collapse points "
                f"{'inside' if r['centers_in_initial_hull'] else 'OUTSIDE'} the initial hull; "
                f"softmax → hardmax: one step e^(−{short(r['one_step_rate'])} β) fitted on "
                f"{r['one_step_points']} β, against the start's score gap "
                f"{short(r['score_gap'])} (relative error {rate_error:.2g}, asked ≤ {RATE_TOL:g}); "
                f"the run's largest distance has local slopes in log β of [{slopes}] "
                f"(reached at the first step for {int(first.sum())} of {first.size} β)"
                + (f" — NOT: {'; '.join(missed)}" if missed else ""))
        numbers = r | {"one_step_rate_error": rate_error, "rate_tolerance": RATE_TOL,
                       "run_first_step_betas": data["betas"][first].tolist(),
                       "voronoi_held": n_held, "interior_tokens": n,
                       "hull_vertices_are_sites": hull_ok,
                       "site_move": float(c["site_move"]),
                       "max_off_line": float(c["straight"].max()),
                       "max_ratio_error": float(c["ratio_error"].max()),
                       "max_final_distance": float(c["final"].max())}
        extra = {"betas": data["betas"].tolist(), "dist_one": data["dist_one"].tolist(),
                 "dist_run": data["dist_run"].tolist()}
        return Verdict(bool(ok), line, numbers, extra, undecided)

    def draw(self, config, data, folder: Path):
        plt = figures.pyplot()
        fig, axes = plt.subplots(1, 4, figsize=(18, 4.9))
        _draw_cells(axes[0], data)
        _draw_nsd(axes[1], data["ys_nsd"])
        _draw_gaps(axes[2], data, config.tau)
        _draw_betas(axes[3], data, rates(data))
        P = "I" if not config.random_psd else "random PD"
        return figures.save_figure(fig, self.stem(folder),
                                   f"Hardmax attention as Frank–Wolfe: P = ±{P}, τ = "
                                   f"{config.tau:g}, {int(data['vertices'])} sites, "
                                   f"{config.tokens} interior tokens")


def _draw_cells(ax, data) -> None:
    """The PSD run over the Voronoi cells (nearest site in the `P`-metric) in the hull."""
    import matplotlib
    from matplotlib.colors import ListedColormap
    from matplotlib.path import Path as Outline

    ys, P, m = data["ys_psd"], data["P"], int(data["vertices"])
    sites = ys[0, :m]
    lo, hi = sites.min(0) - 0.1, sites.max(0) + 0.1
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 300), np.linspace(lo[1], hi[1], 300))
    grid = np.stack([gx.ravel(), gy.ravel()], -1)
    cell = voronoi_cells(grid, sites, P).astype(float)
    hull = ys[0, data["hull"]]  # counterclockwise (scipy)
    inside = Outline(np.concatenate([hull, hull[:1]])).contains_points(grid)
    cell[~inside] = np.nan
    colors = [matplotlib.colormaps["tab10"](k % 10) for k in range(m)]
    ax.pcolormesh(gx, gy, cell.reshape(gx.shape), cmap=ListedColormap(colors), alpha=0.25,
                  vmin=-0.5, vmax=m - 0.5, shading="auto")
    ax.plot(*np.concatenate([hull, hull[:1]]).T, color="0.4", lw=0.8)
    # each path thinner than the one before: paths into one site overlap, all show
    widths = np.linspace(2.6, 0.8, len(data["cell"]))
    for i, c in enumerate(data["cell"]):
        path = ys[:, m + i]
        ax.plot(*path.T, "-", color=colors[c], lw=widths[i])
        ax.plot(*path[0], "o", ms=4, mfc="white", mec=colors[c])
    ax.plot(*sites.T, "k*", ms=11, label="sites (hull vertices): stationary")
    ax.plot([], [], "o", ms=4, mfc="white", mec="0.3", label="interior tokens at t = 0")
    ax.set(aspect="equal", xlabel="$x_1$", ylabel="$x_2$",
           title="PSD: straight to the cell's site")
    figures.legend_below(ax, ncol=1)


def _draw_nsd(ax, ys) -> None:
    ax.plot(0, 0, "+", color="0.3", ms=12, mew=1.5, label="origin", zorder=1)
    for path in np.moveaxis(ys, 1, 0):
        ax.plot(*path.T, "-", color="C3", lw=0.8, alpha=0.7)
        ax.plot(*path[0], "o", ms=4, mfc="white", mec="C3")
    ax.plot(*ys[-1].T, ".", color="k", ms=6, label=f"after {len(ys) - 1} steps", zorder=3)
    ax.set(aspect="equal", xlabel="$x_1$", ylabel="$x_2$",
           title="NSD: the tokens collapse (γ = τ)")
    figures.legend_below(ax, ncol=2)


def _draw_gaps(ax, data, tau: float) -> None:
    """The NSD runs: the paper's quadratic energy (less its value at the collapse
    point) and the mean Frank–Wolfe gap, with the `O(1/t)` rate."""
    t = np.arange(len(data["gap_fw"]))
    floor = figures.resolution(np.float64, order=1)  # a difference of O(1) scores
    # the energy is measured from the last step's collapse point: drawn to T/4 only,
    # where that point's own offset is negligible (the fit's window)
    clear = np.where(t <= t[-1] / 4, 1.0, np.nan)
    for values, label, color, style, width in (
            (data["gap_fw"], "FW gap, γ = 2/(t+2)", "C0", "-", 3.5),
            (data["energy_fw"] * clear, "energy, γ = 2/(t+2) (to T/4)", "C2", "-", 1.2),
            (data["gap_const"], f"FW gap, γ = τ = {tau:g}", "C3", "-", 3.5),
            (data["energy_const"] * clear, f"energy, γ = τ = {tau:g}", "C1", "--", 1.2)):
        shown, cut = figures.above_floor(values[1:], floor)
        ax.loglog(t[1:], shown, color=color, ls=style, lw=width,
                  alpha=0.5 if width > 2 else 1.0, label=label)
        if cut:
            figures.mark_floor(ax, floor, np.float64)
    ax.loglog(t[1:], data["energy_fw"][1] / t[1:], "k:", label="$t^{-1}$ (paper's rate)")
    ax.set(xlabel="step t", ylabel=r"$\bar f(x_t)-f(x_\infty)$ and mean FW gap",
           title="NSD: quadratic energy and FW gap")
    figures.legend_below(ax, ncol=2)


def _draw_betas(ax, data, r) -> None:
    """The one-step fit's points and `e^{−βg}`, and the run's largest distance
    (hollow where it is reached at the first step)."""
    betas, one = data["betas_one"], data["dist_one_fit"]
    floor = figures.resolution(np.float64, order=1)
    gap = r["score_gap"]
    wide = np.geomspace(data["betas"][0], betas[-1], 200)
    ref = one[0] * np.exp(-gap * (wide - betas[0]))
    ax.loglog(wide, np.where((ref > floor) & (wide >= betas[0] / 2), ref, np.nan), "-",
              color="0.75", lw=4, label=f"$e^{{-\\beta g}}$, g = {short(gap)} (score gap)")
    shown, _ = figures.above_floor(one, floor, stop=False)
    ax.loglog(betas, shown, "o", color="C1", ms=5,
              label=f"after one step: fit, rate {short(r['one_step_rate'])}")
    run, first = data["dist_run"], data["run_step"] == 1
    ax.loglog(data["betas"], run, "-", color="C0", lw=1.0)
    ax.loglog(data["betas"][~first], run[~first], "s", color="C0", ms=6,
              label="largest over the run")
    ax.loglog(data["betas"][first], run[first], "s", mfc="white", mec="C0", ms=6,
              label="largest over the run, reached at step 1")
    ax.set(xlabel=r"$\beta$", ylabel="softmax − hardmax distance",
           title="softmax → hardmax as β grows")
    figures.plain_log_labels(ax.xaxis)
    figures.legend_below(ax, ncol=1)
