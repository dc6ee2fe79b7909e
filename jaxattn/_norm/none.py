"""`NoNorm`: no normalisation at all."""

from .euler import AbstractEulerNorm


class NoNorm(AbstractEulerNorm):
    """`x_i ← x_i + τ v_i(x)`; the flow `dx_i/dt = v_i(x)`: tokens leave `E_W`."""

    name = "none"
    description = "no normalisation: tokens leave E_W (dx/dt = v(x))"

    def reads(self, x, W):
        return x

    def velocity(self, update, x, W):
        return update(x)

    def equiangular(self, s, m, r):
        return 1.0, r * s
