"""`PeriNorm`: normalised input and normalised update."""

from .._manifold import project, unit_rows
from .euler import AbstractEulerNorm


class PeriNorm(AbstractEulerNorm):
    """`x_i ← x_i + τ N(v_i(N(x)))`; the flow `dx_i/dt = N(v_i(N(x)))`: tokens leave
    `E_W`."""

    name = "peri"
    description = "tokens leave E_W (dx/dt = N(v(N(x))))"

    def reads(self, x, W):
        return project(x, W)

    def velocity(self, update, x, W):
        return unit_rows(update(self.reads(x, W)), W)

    def equiangular(self, s, m, r):
        return 1 / (m * r), s / m
