"""`AbstractEulerNorm`: placements whose layer is an Euler step of their flow."""

from .base import AbstractNorm


class AbstractEulerNorm(AbstractNorm):
    """`x ← x + τ velocity(x)`: the pre-, peri- and no-normalisation layers, which move
    tokens off `E_W`. Members give `reads` and `velocity`."""

    stays_on_manifold = False
    papers_default = False

    def step(self, update, x, tau, W, kick=None):
        y = x + tau * self.velocity(update, x, W)
        return y if kick is None else y + kick
