"""`AbstractExponentialKernel`: `w_ij = exp(s_ij + offset) / n` (exp and usa)."""

import jax.numpy as jnp

from .pointwise import AbstractPointwiseKernel


class AbstractExponentialKernel(AbstractPointwiseKernel):
    """`exp(s + offset) / n`, `n` the number of tokens (not of those attended to):
    the unnormalised self-attention of Geshkovski et al.; members set the offset."""

    def pointwise(self, s):
        return jnp.exp(s)

    def derivative(self, s, w):
        return w

    def rescale(self, mixed, n):
        return mixed / n
