"""Core measures of consensus."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validate import as_float_array


def misalignment(x: Float[Array, "*batch n d"]) -> Float[Array, "*batch"]:
    """The misalignment `E(x) = 1 − (1/n) Σ_i cos(x_1, x_i)` (paper 001 eq. 25).

    Zero exactly when every token points along the first one (consensus); at most 2.
    Computed over the last two axes; leading axes (batch, time) are kept.

    **Arguments:**

    - `x`: tokens `(..., n, d)`, any nonzero rows (not necessarily normalised).

    **Returns:**

    `E` with the shape of the leading axes.
    """
    x = as_float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"misalignment needs tokens of shape (..., n, d), got {x.shape}.")
    unit = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    cos = jnp.sum(unit[..., :1, :] * unit, axis=-1)
    return 1 - jnp.mean(cos, axis=-1)
