"""The ellipsoid `E_W = {y : yᵀ W y = 1}` and the maps onto it (paper 001 §2.2)."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._precision import einsum
from ._programs import kept_jit
from ._validate import check_count, check_metric, check_rows_now, refuse_first, too_big


def w_inner(
    a: Float[Array, "... d"], b: Float[Array, "... d"], W: Float[Array, "d d"] | None
) -> Float[Array, "..."]:
    """The inner product `⟨a, b⟩_W = aᵀ W b` over the last axis (`W = None`: `aᵀb`).

    The metric product is always true float32 (or float64), whatever precision the
    attention runs at: the manifold, its projection and every consensus measure
    rest on it.
    """
    if W is None:
        return jnp.sum(a * b, axis=-1)
    return jnp.sum(a * einsum("...j,ij->...i", b, W, precision="float32"), axis=-1)


def w_norm(y: Float[Array, "... d"], W: Float[Array, "d d"] | None = None):
    """The norm `|y|_W = sqrt(yᵀ W y)` over the last axis (`W` as in `normalize`)."""
    y = jnp.asarray(y)
    return jnp.sqrt(w_inner(y, y, None if W is None else check_metric(W, y.shape[-1])))


def normalize(
    x: Float[Array, "... d"], W: Float[Array, "d d"] | None = None
) -> Float[Array, "... d"]:
    """Project each token onto the ellipsoid: `N_W(y) = y / |y|_W`.

    **Arguments:**

    - `x`: tokens, one per row; any leading axes.
    - `W`: symmetric positive-definite metric, `(d, d)`; `None` is the identity
      (the unit sphere).

    **Returns:**

    `x` with every row rescaled to `|x_i|_W = 1`. A zero row has no direction: a
    concrete `x` with one (or with NaN/inf) is a `ValueError`; under `jit` or `vmap`
    such a row gives NaN.
    """
    x = jnp.asarray(x)
    check_rows_now(x, "x", "normalize")
    if W is not None:
        W = check_metric(W, x.shape[-1])
    return project(x, W)


@kept_jit(static_argnames=())  # one program per shape on concrete tokens; inlined under jit
def project(x: Float[Array, "... d"], W: Float[Array, "d d"] | None) -> Float[Array, "... d"]:
    """`N_W` without input checks, for use inside the simulators.

    Rows are first brought to unit scale by `scale_rows` (a constant for autodiff:
    `N_W` is scale-invariant), so `|y|²_W` neither overflows for large tokens
    (`1e38` in float32) nor underflows for tiny ones (`1e-25`).
    """
    y = scale_rows(x)
    return y / w_norm(y, W)[..., None]


def _power_of_two(k: Array, dtype) -> Array:
    """`2**k` for integers `k` in the normal range of `dtype`, built from its bits
    (exact on every backend, unlike `pow`)."""
    info = jnp.finfo(dtype)
    uint = jnp.dtype(f"uint{info.bits}")
    bits = (k + (info.maxexp - 1)).astype(uint) << info.nmant
    return jax.lax.bitcast_convert_type(bits, dtype)


def scale_rows(x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    """Each row multiplied by the power of two that brings its largest `|entry|` into
    `[1/2, 1)`: exact (no rounding), and safe to square and sum.

    A plain division by the largest entry is not enough: XLA turns it into a
    multiplication by the reciprocal, and `1/1e38` is subnormal in float32, which
    CPUs flush to zero. The power of two is applied as two factors, each in the
    normal range. Rows whose largest entry is zero, subnormal, inf or NaN are left
    as they are; the scale is a constant for autodiff (use only in scale-invariant
    expressions).
    """
    top = jax.lax.stop_gradient(jnp.max(jnp.abs(x), axis=-1, keepdims=True))
    _, e = jnp.frexp(top)
    e = jnp.where((top >= jnp.finfo(x.dtype).tiny) & jnp.isfinite(top), e, 0)
    half = e // 2
    return x * _power_of_two(-half, x.dtype) * _power_of_two(half - e, x.dtype)


def manifold_drift(
    x: Float[Array, "... n d"], W: Float[Array, "d d"] | None = None
) -> Float[Array, ""]:
    """The largest distance from the ellipsoid, `max_i | |x_i|_W − 1 |`."""
    return jnp.max(jnp.abs(w_norm(jnp.asarray(x), W) - 1))


def sample_ellipsoid(
    key: PRNGKeyArray,
    n: int,
    d: int,
    W: Float[Array, "d d"] | None = None,
    *,
    dtype=None,
) -> Float[Array, "n d"]:
    """Random tokens on `E_W`: standard normal vectors mapped by `N_W`.

    With `W = None` this is the uniform distribution on the sphere `S^{d−1}`;
    for another metric it is the push-forward of that law by `y ↦ N_W(y)`.

    **Arguments:**

    - `key`: a JAX PRNG key.
    - `n`, `d`: number of tokens and their dimension.
    - `W`: the metric, `(d, d)`, or `None` for the unit sphere.
    - `dtype`: floating dtype (default: float32, or float64 with `jax_enable_x64`).

    **Returns:**

    An `(n, d)` array whose rows lie on `E_W`.
    """
    shape = (check_count(n, "n", 1), check_count(d, "d", 1))
    dtype = jnp.result_type(float) if dtype is None else dtype
    # past the memory XLA aborts the interpreter when the array is read (a core dump)
    refuse_first([too_big(float(n) * d * jnp.dtype(dtype).itemsize,
                          f"{n} points in R^{d} need", "pass a smaller `n`")])
    W = None if W is None else check_metric(W, d)  # inside the program it is traced
    return _sample(key, W, shape=shape, dtype=dtype)


@kept_jit(static_argnames=("shape", "dtype"))  # one program, not three per call
def _sample(key, W, *, shape, dtype):
    return normalize(jax.random.normal(key, shape, dtype=dtype), W)


def tangent(
    x: Float[Array, "n d"], v: Float[Array, "n d"], W: Float[Array, "d d"] | None
) -> Float[Array, "n d"]:
    """The differential of `N_W` at a point of `E_W` applied to `v`:
    `v_i − ⟨x_i, v_i⟩_W x_i` (paper 001 eq. 6)."""
    return v - w_inner(x, v, W)[:, None] * x


def unit_rows(v: Float[Array, "n d"], W: Float[Array, "d d"] | None) -> Float[Array, "n d"]:
    """`N_W(v_i)` for every row, with `N_W(0) = 0` (and a zero gradient there): the
    normalisation of an update, which may vanish."""
    nonzero = jnp.any(v != 0, axis=-1, keepdims=True)
    return jnp.where(nonzero, project(jnp.where(nonzero, v, 1), W), 0)
