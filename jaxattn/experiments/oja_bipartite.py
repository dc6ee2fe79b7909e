"""`oja-bipartite`: the consensus and bipartite equilibria of the Oja system and the
single-head map, their stability by `jacfwd`, by the closed form and by simulation
(paper 004 App. D, Theorems 2, 3, Fig. 13)."""


import math

import jax
import jax.numpy as jnp
import numpy as np

from .._layers import run_layers
from .._programs import kept_jit
from .._validate import too_big
from ..spectral import (
    bipartite_closed_form,
    bipartite_point,
    equilibria,
    fixed_tolerance,
    oja_system,
    perturbation_growth,
    single_head,
)
from . import power_plots as plots
from .base import Param, Verdict
from .paper004 import AbstractPowerExperiment

#: Fig. 13's default radius, where the escape of a larger perturbation is judged.
FIG13_RADIUS = 0.97


class OjaBipartite(AbstractPowerExperiment):
    name = "oja-bipartite"
    theorem = "paper 004 Theorems 2-3"
    title = ("paper 004 App. D (Theorems 2, 3, Fig. 13): consensus/bipartite equilibria of "
             "the Oja system and the single-head map, jacfwd vs closed form vs simulation")
    params = (
        Param("instances", int, 20, "random symmetric U (and P) per map", 1),
        Param("tokens", int, 6, "tokens n of the random instances", 2),
        Param("dim", int, 3, "dimension d", 2),
        Param("tau", float, 1.0, "step τ", 0.0),
        Param("radius", float, FIG13_RADIUS, "Fig. 13: spectral radius of the stable bipartite "
              "point", 0.0),
    )

    def refusals(self, config):
        yield (not config.radius < 1, "--radius must be < 1: Fig. 13 draws a stable "
               f"bipartite point, got {config.radius:g}.")
        reached = _fig13_q(config)[1]
        yield (abs(reached - config.radius) > 1e-6, f"--radius {config.radius:g} is out of "
               f"reach at --tau {config.tau:g}: no P = q I with q in [0, 10] gives it "
               f"(the nearest found: {reached:.4g}); choose another --radius or --tau.")
        # `equilibria`'s jacfwd: its E = d (n − ⌈n/2⌉ + 1) points at once, each pushing
        # n d tangents through the (n, n) attention, 3 floats each (881 GB measured at
        # n = 300, d = 3)
        n, d = config.tokens, config.dim
        points = d * (n - (n + 1) // 2 + 1)
        yield too_big(24.0 * points * n * d * n * n, f"--tokens {n}, --dim {d}: the "
                      "Jacobians of the equilibria need at least", "choose smaller values")

    def simulate(self, config, progress):
        # rows on the host: iterating over a device array would compile a program
        draws = zip(*map(np.asarray, _draws(config.seed, config.instances, config.dim)))
        rows = [_instance(*draw, config) for draw in draws]
        table = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        return table | _fig13(config)

    def verdict(self, config, data):
        fixed = data["residual"] < fixed_tolerance(data["residual"].dtype)
        decided = fixed & (np.abs(data["radius"] - 1) > 0.02)
        jac = data["radius"] < 1
        def close(a, b):  # to rounding, relative above 1
            return np.abs(a - b) < 1e-6 * np.maximum(1, a)

        agree_cf = close(data["radius"], data["predicted"])
        # Radius 1 to rounding (a neutral direction): the linearisation decides nothing,
        # and Theorem 3's strict conditions are judged off that boundary only.
        marginal = fixed & close(data["predicted"], 1)
        stable = jac & fixed & ~marginal
        agree_t3 = (data["theorem3"] == jac) & ~marginal
        agree_sim = (data["growth"] < 1) == jac
        n = {"equilibria": int(fixed.sum()), "decided": int(decided.sum()),
             "stable": int(stable.sum()),
             "stable_bipartite": int((stable & (data["m"] < data["n"])).sum()),
             "closed_form_agrees": int((agree_cf & fixed).sum()),
             "theorem3_agrees": int((agree_t3 & fixed).sum()), "marginal": int(marginal.sum()),
             "simulation_agrees": int((agree_sim & decided).sum()),
             "fig13_small_absorbed": fig13_outcome(data["fig13_final"][0],
                                                   data["fig13_eps"][0]) == "absorbed",
             "fig13_large_escapes": fig13_outcome(data["fig13_final"][1], data["fig13_eps"][1],
                                                  data["fig13_spread"]) == "escapes to consensus"}
        # The escape is paper 004's observation ("the (very) small basin"), not a theorem:
        # judged at its τ = 1 and the default radius; elsewhere the basin can hold every
        # perturbation tried (τ = 0.1, or --radius 0.76 at τ = 1), so it is reported.
        judged = config.tau == 1 and config.radius == FIG13_RADIUS
        rest = (n["closed_form_agrees"] == n["equilibria"] == n["theorem3_agrees"] + n["marginal"]
                and n["simulation_agrees"] == n["decided"]
                and (n["fig13_large_escapes"] or not judged))
        ok = rest and n["fig13_small_absorbed"]
        needed, layers = _fig13_layers(config)
        # Too slow a decay to see within the layers run: no contradiction, no agreement.
        undecided = "" if ok or not rest or needed <= layers else (
            f"at --radius {config.radius:g} the small perturbation needs {needed:,} layers to "
            f"fall below 1e-2 of its size, more than the {layers:,} run; choose a smaller "
            "--radius.")
        line = (f"{n['equilibria']} equilibria: jacfwd radius = closed form in "
                f"{n['closed_form_agrees']}, Theorem 3 conditions agree in "
                f"{n['theorem3_agrees']}"
                + (f" (and {n['marginal']} with radius 1 to rounding, where neither decides)"
                   if n["marginal"] else "")
                + f", simulation agrees in {n['simulation_agrees']}/"
                f"{n['decided']} decided; {n['stable_bipartite']} stable bipartite points; "
                f"Fig. 13: small perturbation absorbed {n['fig13_small_absorbed']}, larger "
                f"one escapes to consensus {n['fig13_large_escapes']}"
                + ("" if judged else f" (judged at τ = 1 and --radius {FIG13_RADIUS:g} "
                   f"only, not at τ = {config.tau:g}, --radius {config.radius:g})"))
        return Verdict(bool(ok), line, n, undecided=undecided)

    def draw(self, config, data, folder):
        spreads = _spread(data["fig13_paths"][:, -1])  # both paths' (the data: the large's)
        titles = list(map(fig13_outcome, data["fig13_final"], data["fig13_eps"], spreads))
        return plots.oja(data, self.stem(folder), titles,
                         fixed_tolerance(data["residual"].dtype))


def fig13_outcome(final, size, spread=np.inf) -> str:
    """How a Fig. 13 perturbation of `size` ended at distance `final` from the
    bipartite point, its tokens `spread` apart: the one criterion of the verdict and
    of the figure's titles. "absorbed": below 1e-2 of its size; "escapes to
    consensus": farther than 0.5, every token together (spread below 1e-6);
    "escapes": farther than 0.5 otherwise; else "not settled"."""
    if final < 1e-2 * size:
        return "absorbed"
    if final > 0.5:
        return "escapes to consensus" if spread < 1e-6 else "escapes"
    return "not settled"


def _spread(end):
    """How far apart a path's final tokens `(..., n, d)` lie: the largest distance of a
    token from the first."""
    return np.max(np.linalg.norm(end - end[..., :1, :], axis=-1), axis=-1)


#: The most layers Fig. 13 runs: 34 paths of 10 tokens on S², 160 MB.
_FIG13_MAX_LAYERS = 20_000


def _fig13_layers(config) -> tuple[int, int]:
    """The layers Fig. 13 needs and the layers it runs: to time 400 (400 layers at the
    paper's τ = 1) and enough for the predicted decay `radius^L` of a small
    perturbation to reach 1e-3, ten times below the verdict's 1e-2; at most
    `_FIG13_MAX_LAYERS`."""
    needed = max(400, round(400 / config.tau),
                 math.ceil(math.log(1e-3) / math.log(config.radius)))
    return needed, min(needed, _FIG13_MAX_LAYERS)


def _random_symmetric(key, d, scale):
    A = jax.random.normal(key, (d, d))
    return scale * (A + A.T) / 2


@kept_jit(static_argnames=("instances", "d"))
def _draws(seed, instances: int, d: int):
    """Each instance's random symmetric `U`, `P` of larger scale, and the key of its
    perturbations, drawn from `PRNGKey(seed)` and stacked over the instances (one
    small program: a loop over the keys made one as large as 4 MB)."""
    def draw(key):
        ku, kp, ks = jax.random.split(key, 3)
        return _random_symmetric(ku, d, 1.0), _random_symmetric(kp, d, 2.0), ks

    return jax.vmap(draw)(jax.random.split(jax.random.PRNGKey(seed), instances))


def _instance(U, P, ks, config):
    """Both maps on one random instance: the Oja system with `U`, and the single-head
    map with the same `U` and `P`."""
    n, tau = config.tokens, config.tau
    out = []
    for kind, dyn in (("oja", oja_system(U)), ("head", single_head(U, P))):
        eq = equilibria(dyn, n, tau=tau)
        g = perturbation_growth(dyn, eq.points, ks, eps=1e-6, layers=400, tau=tau)
        E = eq.m.shape[0]
        out.append({"map": np.full(E, kind), "m": np.asarray(eq.m), "n": np.full(E, n),
                    "index": np.asarray(eq.index), "residual": np.asarray(eq.residual),
                    "radius": np.asarray(eq.radius), "predicted": np.asarray(eq.predicted),
                    "theorem3": np.asarray(eq.theorem3), "growth": np.asarray(g)})
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}


def _fig13(config):
    """Fig. 13: the single-head map on S² with `U = diag(1, 0.5, −0.3)`, `P = q I`, `q`
    chosen (bisection on the closed form) so that 8 tokens at `e₁` and 2 at `−e₁`
    form a stable bipartite point of spectral radius `--radius`; perturbations of
    growing size, the smallest escaping one drawn beside a small absorbed one."""
    n, m, tau = _FIG13_N, _FIG13_M, config.tau
    q = _fig13_q(config)[0]
    sizes = np.logspace(-3, 0.3, 34)
    U, P, x, starts = _fig13_arrays(config.seed + 13, _FIG13_LAM, q, sizes, n, m)
    dyn = single_head(U, P)
    layers = _fig13_layers(config)[1]
    paths = [np.asarray(run_layers(dyn, start, layers, tau)) for start in starts]
    x = np.asarray(x)
    final = np.asarray([np.max(np.linalg.norm(p[-1] - x, axis=-1)) for p in paths], float)
    escaped = np.nonzero(final > 0.5)[0]
    big = int(escaped[0]) if escaped.size else len(sizes) - 1
    small, end = max(big - 4, 0), paths[big][-1]
    return {"fig13_q": np.asarray(q), "fig13_sizes": sizes, "fig13_dist": final,
            "fig13_paths": np.stack([paths[small], paths[big]]),
            "fig13_eps": sizes[[small, big]], "fig13_final": final[[small, big]],
            "fig13_spread": np.float64(_spread(end)),
            "fig13_point": np.asarray(x), "fig13_layers": np.asarray(layers)}


#: Fig. 13's map: `U = diag(λ)`, `n` tokens, `m` of them at `e₁`.
_FIG13_LAM, _FIG13_N, _FIG13_M = np.array([1.0, 0.5, -0.3]), 10, 8


def _fig13_q(config) -> tuple[float, float]:
    """Fig. 13's `q` (`P = q I`, bisected in `[0, 10]`) for the radius `--radius` at
    `--tau`, and the radius it gives (another where none in `[0, 10]` gives it)."""
    def radius(q):
        return float(_closed_form(_FIG13_LAM, 0, _FIG13_M, _FIG13_N, q, config.tau)[0])

    q = _bisect(lambda q: radius(q) - config.radius, 0.0, 10.0)
    return q, radius(q)


#: The closed form as one program (the bisection calls it 61 times).
_closed_form = kept_jit(bipartite_closed_form, static_argnames=())


@kept_jit(static_argnames=("n", "m"))
def _fig13_arrays(seed, lam, q, sizes, n: int, m: int):
    """Fig. 13's weights `U = diag(λ)`, `P = q I`, its bipartite point `x` and the
    starts `x + s z` for each size `s`, `z` a random tangent perturbation of largest
    row norm 1 (one program; a list, as in `_draws`)."""
    x = bipartite_point(jnp.eye(3)[0], n, m)
    z = jax.random.normal(jax.random.PRNGKey(seed), x.shape)
    z = z - jnp.sum(z * x, -1, keepdims=True) * x
    z = z / jnp.max(jnp.linalg.norm(z, axis=-1))
    return jnp.diag(lam), q * jnp.eye(3), x, [x + s * z for s in sizes]


def _bisect(f, lo, hi, iters=60):
    flo = f(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        fmid = f(mid)
        if (fmid > 0) == (flo > 0):
            lo, flo = mid, fmid
        else:
            hi = mid
    return (lo + hi) / 2
