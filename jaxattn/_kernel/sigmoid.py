"""`Sigmoid`: `σ(s + b)` (Ramapuram et al. 2024)."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._validate import check_scalar
from .pointwise import AbstractPointwiseKernel


class Sigmoid(AbstractPointwiseKernel):
    """`w_ij = σ(s_ij + b)`, not normalised over `j` (Ramapuram et al. 2024).

    At large `β` the weights tend to 0 or 1: attention to every token whose logit
    passes `−b`.

    **Arguments:**

    - `bias`: the bias `b`, a finite real; `None` (default) is `−log n` for `n`
      tokens, so that the weights of equal logits `s = 0` sum to about one.
    """

    bias: Float[Array, ""] | None = None
    name = "sigmoid"
    description = "σ(s + b), not normalised over j"
    exponent_shift = None

    def __init__(self, bias: float | None = None):
        if bias is None or isinstance(bias, jax.core.Tracer):
            self.bias = bias
        else:
            dtype = jnp.result_type(float)
            self.bias = jnp.asarray(check_scalar(bias, "bias", dtype=dtype), dtype=dtype)

    def offset(self, beta, n, dtype):
        b = -np.log(n) if self.bias is None else self.bias
        return jnp.asarray(b, dtype)

    def pointwise(self, s):
        return jax.nn.sigmoid(s)

    def derivative(self, s, w):
        return w * (1 - w)

    def rescale(self, mixed, n):
        return mixed
