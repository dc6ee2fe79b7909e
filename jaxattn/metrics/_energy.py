"""The interaction energy of the unnormalised attention flow and its saddles
(Geshkovski, Koubbi, Polyanskiy, Rigollet, "Dynamic metastability in the
self-attention model", 2024): the energy the `usa` flow climbs, its Riemannian
Hessian on the product of spheres, and the index of a configuration (its number of
unstable directions)."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._precision import einsum
from .._programs import kept_jit
from .._validate import as_float_array, check_scalar, is_concrete, refuse_first
from ._consensus import _tokens


def interaction_energy(x: Float[Array, "*batch n d"], beta, weights=None) -> Float[Array, "*batch"]:
    """The interaction energy `E = (1/n²) Σ_ij m_i m_j exp(β(⟨x_i, x_j⟩ − 1))` of unit
    tokens.

    It grows along the `usa` flow (`kernel="usa"`) to its maximum 1 at consensus
    (the paper's energy; `⟨x_i, x_j⟩ − 1 = −‖x_i − x_j‖²/2`, so no cancellation).
    `weights` `m_i` (default all 1, `n = Σ m_i`) let a cluster count for its tokens.
    It forms the `n × n` pairs: for the few tokens of a metastability study, not the
    mean-field sizes (`ja.metrics.potential` works in blocks).

    **Arguments:**

    - `x`: unit tokens `(..., n, d)`.
    - `beta`: the inverse temperature `β`.
    - `weights`: the tokens' masses `(n,)` (default: ones).

    **Returns:**

    `E` with the shape of the leading axes.
    """
    x = _tokens(x, "interaction_energy", directions=False)
    if is_concrete(x):  # its closed form holds on the sphere only (it gave 0.218 for 2x)
        off = np.sum(np.square(np.asarray(x, np.float64)), axis=-1).ravel() - 1
        worst = off[np.argmax(np.abs(off))] if off.size else 0.0
        tol = max(1e-6, 1000 * float(jnp.finfo(x.dtype).eps))
        refuse_first([(abs(worst) > tol, "interaction_energy takes unit tokens (|x_i| = 1), "
                                         f"got a squared norm of {1 + worst:.6g}; normalise "
                                         "them (x / |x|) first.")])
    if is_concrete(beta):  # a traced β (in a caller's program) stays unchecked: no callback
        beta = check_scalar(beta, "beta")
    diff = x[..., :, None, :] - x[..., None, :, :]
    gap = -0.5 * jnp.sum(diff * diff, axis=-1)
    m = jnp.ones(x.shape[-2], x.dtype) if weights is None else jnp.asarray(weights, x.dtype)
    host = np.asarray(m) if is_concrete(m) else None  # checked on the host: no program
    refuse_first([
        (m.shape != x.shape[-2:-1], f"`weights` must be one mass per token, shape "
                                    f"{x.shape[-2:-1]}, got {m.shape}."),
        (host is not None and not (np.all(host >= 0) and np.any(host > 0)),
         "`weights` are the tokens' masses: each ≥ 0, and not all 0."),
    ])
    mm = (m[:, None] * m[None, :]).reshape((1,) * (x.ndim - 2) + (m.size, m.size))
    pair = mm * jnp.exp(beta * gap)
    return jnp.sum(pair, axis=(-2, -1)) / jnp.sum(m) ** 2


def tangent_basis(x: Float[Array, "n d"]) -> Float[Array, "n d-1 d"]:
    """An orthonormal basis of each unit token's tangent space `x_iᗮ`, `(n, d − 1, d)`:
    the last `d − 1` columns of the Householder reflection that swaps `x_i` and `±e₁`."""
    d = x.shape[-1]
    e1 = jnp.zeros((1, d), x.dtype).at[0, 0].set(1.0)
    sign = jnp.where(x[:, :1] >= 0, 1.0, -1.0)
    v = x + sign * e1  # never small: |v|² = 2(1 + |x_i1|) ≥ 2
    H = jnp.eye(d, dtype=x.dtype)[None] - 2 * v[:, :, None] * v[:, None, :] / jnp.sum(
        v * v, axis=-1)[:, None, None]
    return jnp.swapaxes(H[:, :, 1:], 1, 2)


def tangent_hessian(x: Float[Array, "n d"], beta, weights=None) -> Float[Array, "m m"]:
    """The Riemannian Hessian of `interaction_energy` on the product of spheres, in
    an orthonormal basis of the tangent spaces (`m = n (d − 1)`).

    `Hess E[u, u] = uᵀ ∇²E u − Σ_i ⟨x_i, ∇_i E⟩ ‖u_i‖²` for tangent `u` (the
    Euclidean Hessian by `jax.hessian`, plus the sphere's curvature term).

    **Arguments:**

    - `x`: unit tokens `(n, d)` of one configuration; take float64.
    - `beta`: the inverse temperature.
    - `weights`: the tokens' masses `(n,)` (default: ones).

    **Returns:**

    The symmetric `(n (d − 1), n (d − 1))` matrix.
    """
    x = as_float_array(x, "x")
    if x.ndim != 2:
        raise ValueError(f"`x` must be one configuration of tokens (n, d), got {x.shape}.")
    return _tangent_hessian(x, beta, weights)


@kept_jit(static_argnames=())  # one program per shape (op by op: ~50 programs)
def _tangent_hessian(x: Float[Array, "n d"], beta, weights) -> Float[Array, "m m"]:
    n, d = x.shape

    def energy(flat):
        return interaction_energy(flat.reshape(n, d), beta, weights)

    flat = x.reshape(-1)
    hess = jax.hessian(energy)(flat).reshape(n, d, n, d)
    normal = jnp.sum(x * jax.grad(energy)(flat).reshape(n, d), axis=-1)
    B = tangent_basis(x)  # (n, d-1, d)
    H = einsum("iad,idje,jbe->iajb", B, hess, B, precision="float32")
    H = H - einsum("i,ab,ij->iajb", normal, jnp.eye(d - 1, dtype=x.dtype),
                   jnp.eye(n, dtype=x.dtype), precision="float32")
    m = n * (d - 1)
    H = H.reshape(m, m)
    return (H + H.T) / 2


def saddle_index(x: Float[Array, "n d"], beta, weights=None, rtol: float = 1e-8) -> int:
    """The number of unstable directions of the `usa` flow at `x`: the positive
    eigenvalues of the energy's tangent Hessian (the flow climbs `E`; equivalently
    the negative eigenvalues of `−E`'s), those below `rtol · max |λ|` counted as
    zero (the rotations are zero modes). Runs on the host (numpy's `eigvalsh`).

    **Arguments:**

    - `x`, `beta`, `weights`: as `tangent_hessian`.
    - `rtol`: the relative size under which an eigenvalue is a zero (a symmetry).

    **Returns:**

    The index, an int.
    """
    rtol = check_scalar(rtol, "rtol", positive=True)
    lam = np.linalg.eigvalsh(np.asarray(tangent_hessian(x, beta, weights)))
    return int(np.sum(lam > rtol * np.max(np.abs(lam))))
