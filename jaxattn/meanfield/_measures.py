"""Densities on a grid and what is read from them: `uniform`, `cap`, `density` (particles →
density), `order_parameter`, `free_energy`, `mode_distance`, `sampling_distance`."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._kernel import AbstractKernel
from .._programs import kept_jit
from .._validate import check_count, check_scalar, is_one_key, refuse_first, too_big
from ._checks import check_beta, check_density, check_grid, finite_reals
from ._circle import Circle
from ._grid import AbstractGrid
from ._kernels import check_kernel, interaction


def area(d: int) -> float:
    """`|S^{d−1}| = 2 π^{d/2} / Γ(d/2)`."""
    return 2 * math.pi ** (d / 2) / math.gamma(d / 2)


def uniform(grid: AbstractGrid) -> Float[Array, "*grid"]:
    """The uniform probability density `1/|S^{d−1}|` on the grid."""
    check_grid(grid)
    return jnp.full(grid.weights.shape, 1 / area(grid.dim))


def cap(grid: AbstractGrid, kappa) -> Float[Array, "*grid"]:
    """The von Mises–Fisher cap `e^{κ x₁} / ∫ e^{κ x₁} dS` about `e₁`, a probability
    density on the grid (a start near the ordered branch). `kappa`: its concentration
    `κ ≥ 0` (`0`: the uniform density)."""
    check_grid(grid)
    return _cap(grid, check_scalar(kappa, "kappa", nonnegative=True))


@kept_jit(static_argnames=())
def _cap(grid, kappa):
    c = jnp.exp(kappa * (grid.points[..., 0] - 1))  # ≤ 1: no overflow at large κ
    return c / jnp.sum(grid.weights * c)


def density(grid: AbstractGrid, x: Float[Array, "n d"], *, smoothing: float = 0.0
            ) -> Float[Array, "*grid"]:
    """The empirical measure `(1/n) Σ δ_{x_i}` of unit vectors as a density on the
    grid: its projection onto the grid's band, after Brownian motion for the time
    `smoothing` (the heat kernel, `e^{smoothing Δ/2}`; `0` keeps the bare projection,
    which oscillates and is not positive).

    **Arguments:**

    - `grid`: the grid.
    - `x`: `(n, d)` points, normalised here.
    - `smoothing`: the heat kernel's time, `≥ 0`.

    **Returns:**

    The density's values at `grid.points`.
    """
    check_grid(grid)
    smoothing = check_scalar(smoothing, "smoothing", nonnegative=True)
    kind = type(x).__name__
    try:
        x, numeric = np.asarray(x, dtype=float), True
    except (TypeError, ValueError):
        x, numeric = np.zeros(()), False
    refuse_first((
        (not numeric, TypeError, f"`x` must be an array of numbers, got {kind}."),
        (x.ndim != 2 or x.shape[-1] != grid.dim or x.shape[0] < 1, ValueError,
         f"`x` must be (n, {grid.dim}) points of S^{grid.dim - 1}, got shape {x.shape}."),
    ))
    # before any pass over the points: too many for the memory is said in one line
    refuse_first([too_big(16.0 * x.shape[0] * np.asarray(grid.degrees()).size,
                          f"the density of {x.shape[0]} points (their modes) needs about",
                          "pass fewer points")])
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    refuse_first([(not np.all(np.isfinite(x)) or np.any(norms == 0),
                   "`x` must be finite and nonzero (points of the sphere).")])
    return _density(grid, x / norms, smoothing)


@kept_jit(static_argnames=())
def _density(grid, x, smoothing):
    return grid.synthesis(grid.empirical(x) * jnp.exp(0.5 * smoothing * grid.laplacian))


def order_parameter(grid: AbstractGrid, mu: Float[Array, "*grid"]) -> Float[Array, ""]:
    """`r = |∫ x dμ(x)|`, the norm of the mean point (0 for the uniform density, 1 for
    a point mass). `mu`: a density on the grid (finite, `≥ 0`, of positive mass)."""
    return _order_parameter(grid, check_density(grid, mu))


@kept_jit(static_argnames=())
def _order_parameter(grid, mu):
    m = jnp.tensordot(grid.weights * mu, grid.points, axes=grid.weights.ndim)
    return jnp.linalg.norm(m)


def free_energy(grid: AbstractGrid, mu: Float[Array, "*grid"], beta, coupling,
                kernel: str | AbstractKernel = "usa", *, sigma=1.0) -> Float[Array, ""]:
    """The papers' free energy `F(μ) = σ² ∫ μ log(|S^{d−1}| μ) dS − K ∫∫ W_β(⟨x, y⟩)
    dμ(x) dμ(y)`, `W_β(t) = (e^{βt} − 1)/β`: the equation with `"usa"` or `"exp"` is
    its gradient flow, `∂_t μ = ½ div(μ ∇ δF/δμ)`, so `F(μ_t)` does not increase.
    The uniform density has `F = −K E[W_β(⟨x, y⟩)]`. `μ` must be finite
    and `> 0` (a logarithm is taken).

    **Arguments:**

    - `grid`, `mu`: a density on the grid.
    - `beta`, `coupling`: `β > 0` and `K`.
    - `kernel`: `"usa"` or `"exp"` (or their members); `"softmax"` is refused (its
      normalised equation is no such gradient flow).
    - `sigma`: the noise (`1`: the papers').

    **Returns:**

    `F(μ)` as a scalar.
    """
    kernel = check_kernel(kernel)
    known = not isinstance(coupling, jax.core.Tracer)
    refuse_first((
        (kernel.normalised, "free_energy: the softmax equation is not the gradient flow of a "
                            "free energy; use kernel='usa' or 'exp'."),
        (known and not finite_reals(coupling),
         f"`coupling` must be finite, got {coupling!r}."),
    ))
    mu = check_density(grid, mu, strict=True)
    for name, value, positive in (("beta", beta, True), ("sigma", sigma, False)):
        if not isinstance(value, jax.core.Tracer):
            check_scalar(value, name, positive=positive, nonnegative=not positive)
    check_beta(grid, beta, kernel, jnp.result_type(mu, float))
    return _free_energy(grid, mu, beta, coupling, sigma)


@kept_jit(static_argnames=())
def _free_energy(grid, mu, beta, coupling, sigma):
    c = grid.analysis(mu)
    potential = grid.synthesis(grid.multipliers(interaction(beta)) * c)
    entropy = jnp.sum(grid.weights * mu * jnp.log(area(grid.dim) * mu))
    return jnp.asarray(sigma) ** 2 * entropy - coupling * jnp.sum(grid.weights * mu * potential)


def mode_distance(grid: AbstractGrid, mu: Float[Array, "*grid"], nu: Float[Array, "*grid"],
                  degree: int = 4) -> Float[Array, ""]:
    """The `L²` distance of two densities' parts of degree `1 ≤ ℓ ≤ degree` (Fourier
    modes `1 ≤ |k| ≤ degree` on the circle): `(∫ |Π(μ − ν)|² dS)^{1/2}`. Between the
    empirical measure of `n` samples of `μ` and `μ` it is of order `n^{−1/2}`.
    `mu`, `nu`: finite arrays on the grid (any sign: a bare projection too); `degree`
    at most the grid's.
    """
    mu, nu = (check_density(grid, m, name, signed=True) for m, name in ((mu, "mu"), (nu, "nu")))
    with jax.ensure_compile_time_eval():  # static, even for a grid used inside a jit
        top = int(np.max(np.asarray(check_grid(grid).degrees())))
    return _mode_distance(grid, mu, nu, check_count(degree, "degree", 1, top))


@kept_jit(static_argnames=("degree",))
def _mode_distance(grid, mu, nu, degree):
    ell = grid.degrees()
    diff = grid.analysis(mu) - grid.analysis(nu)
    keep = (ell >= 1) & (ell <= degree)
    # a stored coefficient of order m > 0 (k > 0 on the circle) stands for m and −m;
    # ∫|e^{ikθ}|² dθ = 2π, and the Y_ℓm are orthonormal
    order = jnp.arange(diff.shape[1]) > 0
    positive = jnp.broadcast_to(order if grid.dim == 2 else order[:, None], diff.shape)
    weight = jnp.where(positive, 2.0, 1.0) * (2 * jnp.pi if grid.dim == 2 else 1.0)
    return jnp.sqrt(jnp.sum(jnp.where(keep, weight * diff**2, 0.0)))


def sampling_distance(grid: AbstractGrid, mu: Float[Array, "*grid"], n: int,
                      degree: int = 4) -> Float[Array, ""]:
    """The root-mean-square `mode_distance` between the empirical measure of `n`
    independent samples of `mu` and `mu` itself, exactly:
    `E‖Π(μ_n − μ)‖² = (K − ‖Πμ‖²)/n`, where `Π` keeps the degrees `1…degree` and
    `K = N/|S^{d−1}|` is its kernel on the diagonal (`N` harmonics: `2·degree` on
    the circle, `(degree + 1)² − 1` on S², by the addition theorem). `mu` must be
    band-limited to the grid; `degree` at most the grid's."""
    degree = check_count(degree, "degree", 1, int(np.max(np.asarray(check_grid(grid).degrees()))))
    n = check_count(n, "n", 1)
    mu = check_density(grid, mu, signed=True)
    count = 2 * degree if grid.dim == 2 else (degree + 1) ** 2 - 1
    projected = mode_distance(grid, mu, jnp.zeros_like(mu), degree)
    # ≥ 0 exactly; rounding took a point mass's `K − ‖Πμ‖²` (0) below 0: NaN
    return jnp.sqrt(jnp.maximum(count / area(grid.dim) - projected**2, 0) / n)


def sample(grid: AbstractGrid, mu: Float[Array, "*grid"], n: int, key) -> Float[Array, "n d"]:
    """`n` independent points drawn from the density `mu` (its band-limited form), by
    inverting its distribution function (bisection to rounding). On the circle only.

    **Arguments:**

    - `grid`: a `Circle`.
    - `mu`: a positive density on the grid.
    - `n`: the number of points, `≥ 1`.
    - `key`: a JAX random key.

    **Returns:**

    `(n, 2)` unit vectors.
    """
    if not isinstance(grid, Circle):
        raise ValueError("sample: only on a Circle (the sphere's densities are not inverted).")
    n = check_count(n, "n", 1)
    refuse_first([(not is_one_key(key), TypeError, "sample: `key` must be one JAX key "
                   f"(jax.random.key(seed) or PRNGKey(seed)), got {type(key).__name__}.")])
    mu = check_density(grid, mu, strict=True)
    refuse_first([too_big(16.0 * n * grid.modes, f"a sample of n = {n} points needs about",
                          "pass a smaller n")])
    return _sample(grid, mu, n, key)


@kept_jit(static_argnames=("n",))
def _sample(grid, mu, n, key):
    c = grid.analysis(mu)
    z = c[0, 1:] + 1j * c[1, 1:]
    k = jnp.arange(1.0, grid.modes + 1)

    def cdf(theta):  # ∫_0^θ μ, the series integrated term by term
        waves = (jnp.exp(1j * k[None, :] * theta[:, None]) - 1) / (1j * k[None, :])
        return c[0, 0] * theta + 2 * jnp.real(waves @ z)

    u = jax.random.uniform(key, (n,), dtype=mu.dtype) * cdf(jnp.array([2 * jnp.pi]))[0]

    def halve(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        below = cdf(mid) < u
        return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 60, halve, (jnp.zeros(n, mu.dtype),
                                              jnp.full(n, 2 * jnp.pi, mu.dtype)))
    theta = 0.5 * (lo + hi)
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)
