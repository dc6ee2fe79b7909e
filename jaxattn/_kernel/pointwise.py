"""`AbstractPointwiseKernel`: weights that are a function of each logit alone."""

import abc

import jax.numpy as jnp
from jaxtyping import Array, Float

from .base import AbstractKernel


class AbstractPointwiseKernel(AbstractKernel):
    """`w_ij = f(s_ij)`, not normalised over `j` (then `rescale`, e.g. `1/n`).

    The key-block sweep only accumulates `Σ_j f(s_ij) v_j`; the backward term is
    `f'(s) · ∂L/∂w`. Members give `f` (`pointwise`), `f'` from `f` (`derivative`),
    `offset` and `rescale` (and `exponent_shift`); the flash kernel runs them all.
    """

    normalised = False
    flash = True

    @abc.abstractmethod
    def pointwise(self, s: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """`f(s)`, with `f(−∞) = 0`."""

    @abc.abstractmethod
    def derivative(self, s: Float[Array, "*shape"], w: Float[Array, "*shape"]
                   ) -> Float[Array, "*shape"]:
        """`f'(s)`, given `w = f(s)`."""

    def weights(self, s, n):
        return self.rescale(self.pointwise(s), n)

    def block_update(self, state, s, ok, mix):
        top, norm, acc = state
        return top, norm, acc + mix(jnp.where(ok, self.pointwise(s), 0))

    def block_finish(self, state):
        _, norm, acc = state
        return acc, (jnp.zeros_like(norm), norm)

    def block_grad(self, s, ok, a, b, delta, dp):
        w = jnp.where(ok, self.pointwise(s), 0)
        return w, self.derivative(s, w) * dp
