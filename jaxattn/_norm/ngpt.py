"""`NGPT`: the normalised transformer's step (Loshchilov et al. 2024)."""

from .._manifold import project, tangent, unit_rows
from .base import AbstractNorm


class NGPT(AbstractNorm):
    """`x_i ← N(x_i + τ (N(v_i(x)) − x_i))`; the flow `N(v_i) − ⟨x_i, N(v_i)⟩_W x_i`:
    a different flow on `E_W` (the update normalised)."""

    name = "ngpt"
    description = "a different flow on E_W (the update normalised: N(v) − ⟨x, N(v)⟩_W x)"
    stays_on_manifold = True
    papers_default = False

    def reads(self, x, W):
        return x

    def velocity(self, update, x, W):
        return tangent(x, unit_rows(update(x), W), W)

    def equiangular(self, s, m, r):
        return 1 / m, 0.0

    def step(self, update, x, tau, W, kick=None):
        y = x + tau * (unit_rows(update(x), W) - x)
        return project(y if kick is None else y + kick, W)
