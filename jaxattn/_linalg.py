"""Linear algebra shared by the theory, the spectral analysis and the experiments."""

import jax.numpy as jnp
from jaxtyping import Array, Float


def top_eigenvector(M: Float[Array, "d d"]) -> Float[Array, " d"]:
    """The unit eigenvector of the largest eigenvalue of a symmetric matrix.

    `M` is read through its symmetric part `(M + Mᵀ)/2` (`jnp.linalg.eigh`'s
    `symmetrize_input`): a matrix that is symmetric only to rounding needs no
    symmetrising first, and symmetrising an exactly symmetric one changes no bit.
    Traceable and differentiable (where the top eigenvalue is simple).

    **Arguments:**

    - `M`: a real symmetric matrix `(d, d)`, e.g. `U` of paper 001 (Theorems 5.2,
      5.3) or a layer matrix `Ω = Σ_η U_η` of paper 004.

    **Returns:**

    The eigenvector `(d,)` of unit Euclidean norm; its sign is arbitrary.
    """
    return jnp.linalg.eigh(M, symmetrize_input=True)[1][:, -1]
