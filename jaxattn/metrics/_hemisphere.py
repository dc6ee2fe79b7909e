"""Do the tokens lie in one open hemisphere? The domain of Theorem 4.1 (paper 001
§4), decided by a convex program on the host (`hemisphere`), and Wendel's probability
that random tokens do (Remark 4.3)."""

from math import comb
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from .._manifold import w_inner, w_norm
from .._programs import kept_jit
from .._validate import (
    as_float_array,
    check_count,
    check_metric,
    is_concrete,
    known_nonfinite,
)

# The origin counts as inside the hull of the tokens (no open hemisphere) when the
# nearest hull point is this close to it, relative to the largest token.
_HULL_RTOL = 1e-10


class Hemisphere(NamedTuple):
    """What `hemisphere` returns, per sequence.

    - `inside`: whether all tokens lie in one open hemisphere `{y : ⟨z, y⟩_W > 0}`.
    - `z`: a certificate, the centre of the widest such hemisphere, `|z|_W = 1`
      (zeros where none exists).
    - `margin`: `max_z min_i ⟨z, x_i⟩_W / |z|_W` where positive; `0` where no open
      hemisphere exists (the maximum is then `≤ 0`; its exact negative value is
      a nonconvex problem and is not computed).
    """

    inside: Bool[Array, "*batch"]
    z: Float[Array, "*batch d"]
    margin: Float[Array, "*batch"]


def _nearest_hull_point(u: np.ndarray) -> np.ndarray:
    """Barycentric weights `λ` of the point of `conv{u_i}` nearest the origin.

    Minimising `|Σ μ_i u_i|² + (Σ μ_i − 1)²` over `μ ≥ 0` is a nonnegative least
    squares problem (solved exactly by Lawson–Hanson's active set method); its
    minimiser is `μ = s λ` with `λ` the nearest hull point's weights and
    `s = 1 / (1 + |p|²)`, since the objective is `s²|p|² + (s − 1)²` for fixed `λ`.
    """
    import scipy.optimize  # here: it takes 0.2 s to import, and most runs never call it

    n, d = u.shape
    A = np.vstack([u.T, np.ones((1, n))])
    mu, _ = scipy.optimize.nnls(A, np.eye(d + 1)[-1], maxiter=50 * (n + d + 1))  # b = e_{d+1}
    return mu / mu.sum()


def _solve_one(x: np.ndarray, chol: np.ndarray):
    # In coordinates u = Lᵀx (W = L Lᵀ) the W-geometry is Euclidean; scaled by a power
    # of two (exact) to the size 1 the least squares is conditioned for: tokens of
    # 1e±200, or of 1e−15, gave a wrong margin or `inside`.
    u = x @ chol
    top = np.abs(u).max()
    u = u / 2.0 ** np.floor(np.log2(top)) if top > 0 else u
    # An open hemisphere holds the tokens or not by their directions alone: decided on
    # those (tokens of lengths 1e5 and 1e-5 were said to hold none).
    lengths = np.linalg.norm(u, axis=1, keepdims=True)
    directions = u / np.where(lengths > 0, lengths, 1.0)
    if not np.linalg.norm(_nearest_hull_point(directions) @ directions) > _HULL_RTOL:
        n, d = x.shape
        return False, np.zeros(d), np.zeros(n)
    lam = _nearest_hull_point(u)
    p = lam @ u
    y = p / np.linalg.norm(p)
    # |z|_W = |Lᵀz| = |y| = 1.
    z = np.linalg.solve(chol.T, y)
    return True, z, lam


def _host_hemisphere(x, W):
    x = np.asarray(x, dtype=np.float64)
    batch, (n, d) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, n, d)
    inside = np.zeros(len(flat), bool)
    z = np.full((len(flat), d), np.nan)
    lam = np.full((len(flat), n), np.nan)
    try:  # a traced W is checked only here: not SPD (or NaN) leaves every answer NaN
        chol = np.linalg.cholesky(np.asarray(W, dtype=np.float64))
    except np.linalg.LinAlgError:
        chol = None
    for k, xk in enumerate(flat):
        if chol is not None and np.all(np.isfinite(xk)):
            inside[k], z[k], lam[k] = _solve_one(xk, chol)
    return inside.reshape(batch), z.reshape(batch + (d,)), lam.reshape(batch + (n,))


def hemisphere(x: Float[Array, "*batch n d"], W: Float[Array, "d d"] | None = None) -> Hemisphere:
    """Decide whether all tokens lie in one open hemisphere `{y : ⟨z, y⟩_W > 0}`.

    The widest hemisphere is found from the point `p` of the convex hull of the
    tokens nearest the origin (in the `W` geometry): if `p ≠ 0`, `z = p / |p|_W`
    is the optimal certificate and `margin = |p|_W = max_z min_i ⟨z, x_i⟩_W / |z|_W`
    (the duality of the max–min and the hull distance); if `p = 0` (relative
    tolerance `1e-10`), no open hemisphere contains the tokens. The hull distance
    is a quadratic program, solved exactly as a nonnegative least-squares problem
    with SciPy on the host, one sequence at a time: directly for concrete tokens (no
    callback in a program, so JAX's persistent cache keeps them), through
    `jax.pure_callback` under `jit` and `vmap`. Gradients of `margin` (envelope theorem: the optimal
    `z` and hull weights held fixed) flow into `x` and `W`; `z` has none.

    **Arguments:**

    - `x`: tokens `(..., n, d)` (any nonzero rows; on `E_W` the margin is a `W`-cosine).
      NaN or inf entries are refused (`ValueError`) when `x` is concrete; inside
      `jit` such a sequence gets `inside = False` and NaN `z` and `margin`.
    - `W`: the metric `(d, d)`; `None` is the identity (the sphere).

    **Returns:**

    A `Hemisphere(inside, z, margin)` with the leading axes of `x`.
    """
    x = as_float_array(x, "x")
    if x.ndim < 2 or x.shape[-2] < 1 or known_nonfinite(x):
        raise ValueError("hemisphere: the tokens `x` contain NaN or inf; pass finite tokens."
                         if x.ndim >= 2 and x.shape[-2] else
                         f"`x` must be tokens of shape (..., n, d), got {x.shape}.")
    d = x.shape[-1]
    Wm = np.eye(d, dtype=x.dtype) if W is None else check_metric(W, d).astype(x.dtype)
    batch, n = x.shape[:-2], x.shape[-2]
    if is_concrete(x) and is_concrete(Wm):  # on the host: no callback in a program
        inside, z, lam = _host_hemisphere(x, Wm)
        return _margin(inside, z.astype(x.dtype), lam.astype(x.dtype), x,
                       None if W is None else Wm)
    shapes = (
        jax.ShapeDtypeStruct(batch, jnp.bool_),
        jax.ShapeDtypeStruct(batch + (d,), x.dtype),
        jax.ShapeDtypeStruct(batch + (n,), x.dtype),
    )
    inside, z, lam = jax.pure_callback(
        _host_hemisphere, shapes, jax.lax.stop_gradient(x), jax.lax.stop_gradient(Wm),
        vmap_method="sequential",
    )
    return _margin(inside, z, lam, x, None if W is None else Wm)


@kept_jit(static_argnames=())
def _margin(inside, z, lam, x, Wz) -> Hemisphere:
    """The `Hemisphere` of the host's answer `(inside, z, λ)`, differentiable in `x`, `W`."""
    # Value |p|_W, gradient by the envelope theorem: Σ λ_i ⟨z, x_i⟩_W / |z|_W at fixed z, λ.
    scores = w_inner(z[..., None, :], x, Wz)
    norm = jnp.where(inside, w_norm(z, Wz), 1.0)
    margin = jnp.where(inside, jnp.sum(lam * scores, axis=-1) / norm, 0.0)
    # A sequence the host could not decide (NaN/inf tokens, or a traced W that is
    # not SPD) has NaN weights: its margin is NaN, not a silent 0.
    undecided = jnp.any(jnp.isnan(lam), axis=-1)
    z = jnp.where(undecided[..., None], jnp.nan, z)
    return Hemisphere(inside, z, jnp.where(undecided, jnp.nan, margin))


def wendel_probability(n: int, d: int) -> float:
    """The probability that `n` i.i.d. uniform points on `S^{d−1}` lie in one
    open hemisphere (Wendel 1962; paper 001 Remark 4.3):
    `2^{−(n−1)} Σ_{k=0}^{d−1} C(n−1, k)`.

    It is 1 for `n ≤ d`; exact integer arithmetic, then rounded to a float.

    **Arguments:**

    - `n`: the number of points, `≥ 1`.
    - `d`: the ambient dimension, `≥ 1`.

    **Returns:**

    The probability, a Python float.
    """
    n, d = check_count(n, "n", 1), check_count(d, "d", 1)
    total = sum(comb(n - 1, k) for k in range(min(d, n)))
    return total / 2 ** (n - 1)
