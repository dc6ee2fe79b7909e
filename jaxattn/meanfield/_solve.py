"""`solve`: the mean-field equation `∂_t μ = (σ²/2) Δμ − K div(μ X[μ])` on a grid
(`_kernels.py` states it and its map onto jaxattn), integrated by diffrax with the
exponential integrator `ETDRK4` on the grid's coefficients."""

import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._flow import CheckedTimes
from .._kernel import AbstractKernel
from .._programs import kept_jit
from .._validate import check_count, checked, refuse_first, surface_errors
from ._checks import check_beta, check_density, check_size, finite_reals
from ._etd import ETDRK4
from ._grid import AbstractGrid
from ._kernels import check_kernel, profiles
from ._measures import mode_distance

#: The default step: the transport term's time scale at the couplings of interest
#: (`K e^{β}` of order 10) is far longer; `tests/meanfield/test_meanfield.py` measures the order.
DT0 = 0.01


class Drift(eqx.Module):
    """`−K div(μ X[μ])` on the coefficients of `μ`: `X = ∇(G * μ)` (divided by `Z * μ`
    for softmax), formed on the grid, its divergence analysed back."""

    grid: AbstractGrid
    potential: Float[Array, "2 ..."]  # Funk–Hecke multipliers of G
    normaliser: Float[Array, "2 ..."] | None  # of Z (softmax), else None
    coupling: Float[Array, ""]

    def __call__(self, c):
        mu = self.grid.synthesis(c)
        field = self.grid.gradient(self.potential * c)
        if self.normaliser is not None:
            z = self.grid.synthesis(self.normaliser * c)
            field = tuple(f / z for f in field)
        return -self.coupling * self.grid.divergence(tuple(mu * f for f in field))


class LaidOutSteps(dfx.StepTo):
    """`StepTo(ts)` with steps its caller laid out (`step_times`: increasing, from `t0`
    to `t1`), so diffrax's checks of them, host callbacks in the program, are left out
    (as `CheckedTimes` leaves out those of the save times)."""

    def wrap(self, direction):
        return type(self)(ts=self.ts * direction)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        return self.ts[1], 2


def step_times(ts: np.ndarray, dt0: float) -> np.ndarray:
    """The steps: each interval between save times cut into equal steps of at most
    `dt0`, so that every save time is a step's end."""
    pieces = [np.linspace(a, b, max(1, math.ceil((b - a) / dt0 - 1e-9)) + 1)[:-1]
              for a, b in zip(ts[:-1], ts[1:])]
    return np.concatenate(pieces + [ts[-1:]])


def _check(grid, mu0, ts, beta, coupling, sigma, dt0, kernel):
    traced = isinstance(ts, jax.core.Tracer)
    mu0 = check_density(grid, mu0, "mu0")
    try:
        times = np.full(1, np.nan) if traced else np.asarray(ts, dtype=float)
    except (TypeError, ValueError):
        times = np.full(1, np.nan)
    refusals = [
        (traced, TypeError, "`ts` must be concrete (the steps are laid out on the host)."),
        (times.ndim != 1 or times.size < 1 or not np.all(np.isfinite(times))
         or np.any(np.diff(times) <= 0), ValueError,
         f"`ts` must be a 1-D array of increasing finite times, got {ts!r}."),
    ]
    # the scalars known now, each finite and within its bound
    for name, value, bound in (("beta", beta, "> 0"), ("sigma", sigma, "≥ 0"),
                               ("dt0", dt0, "> 0"), ("coupling", coupling, "")):
        known = not isinstance(value, jax.core.Tracer)
        v = (float(value) if finite_reals(value) and np.ndim(value) == 0 else math.nan) \
            if known else 0.0
        within = {"> 0": v > 0, "≥ 0": v >= 0, "": True}[bound]
        refusals.append((known and not (math.isfinite(v) and within), ValueError,
                         f"`{name}` must be finite{' and ' + bound if bound else ''}"
                         f" (a real number), got {value!r}."))
    refuse_first(refusals)
    kernel = check_kernel(kernel)
    dtype = jnp.result_type(mu0, float)
    check_beta(grid, beta, kernel, dtype)
    steps = int(np.sum(np.maximum(1, np.ceil(np.diff(times) / float(dt0) - 1e-9))))
    check_size(grid, times.size, steps, dtype)
    return mu0, times, kernel


@surface_errors
def solve(grid: AbstractGrid, mu0: Float[Array, "*grid"], ts, *, beta, coupling,
          kernel: str | AbstractKernel = "usa", sigma=1.0, dt0: float = DT0
          ) -> Float[Array, "T ..."]:
    """The densities `μ_t` at the times `ts` of the mean-field equation
    `∂_t μ = (σ²/2) Δμ − K div(μ X[μ])` (`X`, the kernels and the map onto jaxattn:
    `docs/meanfield_equation.md`), from `μ_{ts[0]} = mu0`.

    `ETDRK4` on the coefficients, steps of at most `dt0` ending on every save time (the
    page's "The integrator"). Traceable and differentiable in `mu0`, `beta`, `coupling`
    and `sigma` (vmap over couplings); `ts` must be concrete.

    **Arguments:**

    - `grid`: `Circle(modes)` (`d = 2`) or `Sphere(degree)` (`d = 3`).
    - `mu0`: the initial density on the grid (values at `grid.points`, with respect to
      the surface measure: `uniform(grid)`, `density(grid, x)`); it is projected onto
      the grid's band.
    - `ts`: increasing save times (`ts[0]` the start).
    - `beta`: the inverse temperature `β > 0`.
    - `coupling`: `K` (any real; `0` is Brownian motion alone).
    - `kernel`: `"usa"` (default), `"exp"` (the same equation) or `"softmax"`, or its
      member (`ja.USA()`, …).
    - `sigma`: the noise, `σ ≥ 0` (`1`: the papers' normalisation; `0`: the
      deterministic flow).
    - `dt0`: the largest step.

    **Returns:**

    The densities at `ts`, shape `(len(ts),) + grid.weights.shape`.
    """
    mu0, ts, kernel = _check(grid, mu0, ts, beta, coupling, sigma, dt0, kernel)
    return checked(*_solve(grid, mu0, jnp.asarray(ts), jnp.asarray(step_times(ts, dt0)),
                           beta, coupling, sigma, kernel), NONFINITE)


#: How far past the largest value of any density's band-limited projection (`in_range`)
#: a solved one may go before it is refused as a blown-up step, not a sharp density.
RANGE = 10.0
#: The refusal of a solve whose density left the floating-point range, or any density's.
NONFINITE = ("jaxattn: solve: the density became NaN, inf or far larger than any density "
             "of its mass on this grid: the transport is too stiff for `dt0` at this "
             "coupling (lower `dt0` or |coupling|).")


def in_range(grid: AbstractGrid, mus: Float[Array, "T ..."], mass: Float[Array, ""]
             ) -> Array:
    """Whether the densities `mus` (of mass `mass`) are finite and within `RANGE` times
    the largest value the band-limited projection of any density of that mass takes:
    `|Π μ(x)| ≤ mass · D/|S|` (`D` the band's dimension, at most the coefficients'
    slots; the projection kernel peaks at `D/|S|` on its diagonal). An unstable step
    leaves it by orders of magnitude at once; mass alone cannot tell (it is kept exactly)."""
    slots = grid.degrees().size
    bound = RANGE * jnp.abs(mass) * slots / jnp.sum(grid.weights)
    return jnp.all(jnp.isfinite(mus)) & (jnp.max(jnp.abs(mus)) <= bound)


@kept_jit
def _solve(grid, mu0, ts, steps, beta, coupling, sigma, kernel,
           adjoint=dfx.RecursiveCheckpointAdjoint()):
    """The densities at `ts` and whether they are finite and within a density's range
    (`in_range`; checked by the caller: the program holds no callback, `CheckedTimes`),
    `ts` checked and `steps` laid out by the caller."""
    c0 = grid.analysis(mu0)
    g, z = profiles(beta, kernel)
    transport = Drift(grid, grid.multipliers(g), None if z is None else grid.multipliers(z),
                      jnp.asarray(coupling))
    term = dfx.ODETerm(lambda t, c, args: transport(c))
    solver = ETDRK4(0.5 * jnp.asarray(sigma) ** 2 * grid.laplacian)
    if ts.shape[0] == 1:
        return mu0[None], jnp.all(jnp.isfinite(mu0))
    # the laid-out steps, all within `max_steps`: the solve cannot fail but by overflowing
    sol = dfx.diffeqsolve(term, solver, ts[0], ts[-1], None, c0,
                          stepsize_controller=LaidOutSteps(steps), saveat=dfx.SaveAt(ts=ts),
                          max_steps=steps.shape[0], adjoint=CheckedTimes(adjoint, ts),
                          throw=False)
    mus = jax.vmap(grid.synthesis)(sol.ys)
    return mus, in_range(grid, mus, jnp.sum(grid.weights * mu0))


@surface_errors
def fluctuation_distance(grid: AbstractGrid, mu0: Float[Array, "*grid"], ts, n: int,
                         degree: int = 4, *, beta, coupling,
                         kernel: str | AbstractKernel = "usa", dt0: float = DT0
                         ) -> Float[Array, " T"]:
    """The root-mean-square `mode_distance` at the times `ts` between `n` particles
    drawn independently from `mu0` and moved by the deterministic flow (`σ = 0`), and
    the equation's solution from `mu0`, to leading order in `1/n`:
    `E‖Π(μ_t^n − μ_t)‖² = E_{x∼μ_0} ‖Π J_t (δ_x − μ_0)‖² / n` (`J_t` the derivative of
    `mu0 ↦ μ_t`; docs/meanfield_equation.md, "Grids and the solver").

    **Arguments:**

    - `grid`, `mu0`, `ts`, `beta`, `coupling`, `kernel`, `dt0`: as for `solve`.
    - `n`: the number of particles, `≥ 1`.
    - `degree`: the modes compared, `1 ≤ ℓ ≤ degree` (at most the grid's).

    **Returns:**

    The predicted RMS distances at `ts`, `(len(ts),)`.
    """
    mu0, ts, kernel = _check(grid, mu0, ts, beta, coupling, 0.0, dt0, kernel)
    degree = check_count(degree, "degree", 1, int(np.max(np.asarray(grid.degrees()))))
    n = check_count(n, "n", 1)
    return checked(*_fluctuation(grid, mu0, jnp.asarray(ts), jnp.asarray(step_times(ts, dt0)),
                                 beta, coupling, kernel, degree), NONFINITE) / math.sqrt(n)


@kept_jit
def _fluctuation(grid, mu0, ts, steps, beta, coupling, kernel, degree):
    points = grid.points.reshape(-1, grid.dim)
    probability = (grid.weights * mu0).reshape(-1)
    deltas = jax.vmap(lambda p: grid.synthesis(grid.empirical(p[None])))(points)
    # forward mode: one tangent per point, carried with the solution
    _, carried, finite = jax.linearize(
        lambda m: _solve(grid, m, ts, steps, beta, coupling, 0.0, kernel, dfx.ForwardMode()),
        mu0, has_aux=True)
    # (points, T, *grid); in `mu0`'s dtype, which the tangents must have (a float32
    # density on a float64 grid)
    moved = jax.vmap(carried)((deltas - mu0[None]).astype(mu0.dtype))
    zero = jnp.zeros_like(mu0)
    square = jax.vmap(jax.vmap(lambda m: mode_distance(grid, m, zero, degree) ** 2))(moved)
    return jnp.sqrt(jnp.sum(probability[:, None] * square, axis=0)), finite
