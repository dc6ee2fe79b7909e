"""`PostNorm`: the papers' model (paper 001 eq. 4, 6)."""

from .._manifold import project, tangent
from .base import AbstractNorm


class PostNorm(AbstractNorm):
    """`x_i ← N(x_i + τ v_i(x))`; the flow `dx_i/dt = v_i − ⟨x_i, v_i⟩_W x_i` (paper 001
    eq. 4, 6), tangent to `E_W`."""

    name = "post"
    description = "x ← N_W(x + τ v), the flow on E_W"
    stays_on_manifold = True
    papers_default = True

    def reads(self, x, W):
        return x

    def velocity(self, update, x, W):
        return tangent(x, update(x), W)

    def equiangular(self, s, m, r):
        return 1.0, 0.0

    def step(self, update, x, tau, W, kick=None):
        y = x + tau * update(x)
        return project(y if kick is None else y + kick, W)
