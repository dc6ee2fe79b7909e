"""Model set-ups of paper 001 §6.1, shared by the demo and the experiments."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._dynamics import SelfAttentionDynamics
from ._manifold import sample_ellipsoid
from ._schedule import Schedule

# Frequencies (in units of π) of D_η(t) = 2 diag(cos ω₁πt, sin ω₂πt, cos ω₃πt) for
# the two heads of the sphere experiment (paper 001 §6.1.1).
_SPHERE_OMEGAS = ((10.0, 10.0, 6.0), (6.0, 6.0, 4.0))


def sphere_diagonals(t, omegas=_SPHERE_OMEGAS) -> Float[Array, "h 3"]:
    """The diagonals of `D_η(t)`: `2 (cos ω₁πt, sin ω₂πt, cos ω₃πt)` per head."""
    w = jnp.pi * jnp.asarray(omegas)
    return 2 * jnp.stack([jnp.cos(w[:, 0] * t), jnp.sin(w[:, 1] * t), jnp.cos(w[:, 2] * t)], -1)


def _sphere_P(t, params):
    Q, K, omegas = params
    D = sphere_diagonals(t, omegas).astype(Q.dtype)
    return jnp.einsum("hkd,hk,hke->hde", Q, D, K)


def sphere_dynamics(key: PRNGKeyArray, num_heads: int = 2) -> SelfAttentionDynamics:
    """The time-varying two-head model on S² (paper 001 §6.1.1, Theorem 4.1).

    `U_η = I`, `P_η(t) = Q_ηᵀ D_η(t) K_η` with `Q_η, K_η` uniform in
    `[−0.5, 0.5]` and `D₁(t) = 2 diag(cos 10πt, sin 10πt, cos 6πt)`,
    `D₂(t) = 2 diag(cos 6πt, sin 6πt, cos 4πt)`. More than two heads reuse these
    frequencies cyclically.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be ≥ 1, got {num_heads}.")
    d = 3
    kq, kk = jax.random.split(key)
    dtype = jnp.result_type(float)
    Q = jax.random.uniform(kq, (num_heads, d, d), dtype, -0.5, 0.5)
    K = jax.random.uniform(kk, (num_heads, d, d), dtype, -0.5, 0.5)
    omegas = jnp.asarray([_SPHERE_OMEGAS[i % 2] for i in range(num_heads)], dtype)
    U = jnp.broadcast_to(jnp.eye(d, dtype=dtype), (num_heads, d, d))
    return SelfAttentionDynamics(Schedule(_sphere_P, (Q, K, omegas)), U)


def hemisphere_tokens(key: PRNGKeyArray, n: int, d: int) -> Float[Array, "n d"]:
    """`n` random unit tokens, all in the open hemisphere of a random direction."""
    kz, kx = jax.random.split(key)
    z = sample_ellipsoid(kz, 1, d)[0]
    x = sample_ellipsoid(kx, n, d)
    return x * jnp.sign(x @ z)[:, None]
