"""`PreNorm`: the attention reads normalised tokens."""

from .._manifold import project
from .euler import AbstractEulerNorm


class PreNorm(AbstractEulerNorm):
    """`x_i ← x_i + τ v_i(N(x))`; the flow `dx_i/dt = v_i(N(x))`: tokens leave `E_W`."""

    name = "pre"
    description = "tokens leave E_W (dx/dt = v(N(x)))"

    def reads(self, x, W):
        return project(x, W)

    def velocity(self, update, x, W):
        return update(self.reads(x, W))

    def equiangular(self, s, m, r):
        return 1 / r, s
