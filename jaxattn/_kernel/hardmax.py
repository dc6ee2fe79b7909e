"""`Hardmax`: the `β → ∞` limit of softmax."""

import jax.numpy as jnp

from .base import AbstractKernel


class Hardmax(AbstractKernel):
    """`w_ij = 1/|C_i|` on the tokens `C_i` with the largest logit, 0 elsewhere: the
    `β → ∞` limit of softmax (Alcalde, Geshkovski, Ruiz-Balet 2025), the same for
    every `β > 0`. Ties (exactly equal logits) split equally. The weights are
    piecewise constant, so gradients flow through the values only.

    In key blocks each row keeps its top logit and tie count, and starts over when a
    block holds a larger logit.
    """

    name = "hardmax"
    description = "1/|C_i| on the largest logits (β → ∞)"
    normalised = True
    flash = False
    exponent_shift = None

    def offset(self, beta, n, dtype):
        return None

    def weights(self, s, n):
        hit = s == jnp.max(s, axis=-1, keepdims=True)
        return hit / jnp.sum(hit, axis=-1, keepdims=True).astype(s.dtype)

    def rescale(self, mixed, n):
        return mixed

    def block_update(self, state, s, ok, mix):
        top, norm, acc = state
        s = jnp.where(ok, s, -jnp.inf)
        new_top = jnp.maximum(top, s.max(-1))
        keep = (top == new_top).astype(acc.dtype)  # a larger logit: start over
        hit = jnp.where(ok, s == new_top[..., None], False).astype(acc.dtype)
        return new_top, norm * keep + hit.sum(-1), acc * keep[..., None] + mix(hit)

    def block_finish(self, state):
        top, norm, acc = state
        norm = jnp.where(norm > 0, norm, 1)
        return acc / norm[..., None], (top, norm)

    def block_grad(self, s, ok, a, b, delta, dp):
        w = jnp.where(ok, jnp.where(s == a[..., None], 1 / b[..., None], 0), 0)
        return w, jnp.zeros_like(w)
