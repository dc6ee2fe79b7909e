"""`Softmax`: the papers' attention, rows summing to one."""

import jax
import jax.numpy as jnp

from .base import AbstractKernel


class Softmax(AbstractKernel):
    """`w_ij = softmax_j(s_ij)` over the tokens `i` may see (max-shifted, stable for
    large `β|P|`): the papers' model.

    In key blocks it is the online softmax: each row keeps its running maximum and
    normaliser and rescales its partial sum when the maximum grows; the backward pass
    recomputes each block's weights from the row's log-normaliser. As `β → ∞` it tends
    to `Hardmax()`.
    """

    name = "softmax"
    description = "softmax over j (rows summing to one)"
    normalised = True
    flash = True
    exponent_shift = 0.0

    def offset(self, beta, n, dtype):
        return None

    def weights(self, s, n):
        return jax.nn.softmax(s, axis=-1)

    def rescale(self, mixed, n):
        return mixed

    def block_update(self, state, s, ok, mix):
        top, norm, acc = state
        s = jnp.where(ok, s, -jnp.inf)
        new_top = jnp.maximum(top, s.max(-1))
        shift = jnp.where(jnp.isfinite(new_top), new_top, 0)
        p = jnp.exp(s - shift[..., None])
        keep = jnp.exp(top - shift)
        return new_top, norm * keep + p.sum(-1), acc * keep[..., None] + mix(p)

    def block_finish(self, state):
        top, norm, acc = state
        norm = jnp.where(norm > 0, norm, 1)  # a row that sees no key (padding): 0, not 0/0
        return acc / norm[..., None], (top + jnp.log(norm), norm)

    def block_grad(self, s, ok, a, b, delta, dp):
        w = jnp.where(ok, jnp.exp(s - a[..., None]), 0)
        return w, w * (dp - delta[..., None])
