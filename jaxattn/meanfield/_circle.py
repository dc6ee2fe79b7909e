"""`Circle(modes)`: Fourier series on `S¹`, pseudo-spectral (`docs/meanfield_equation.md`).

A density is its values at `N ≥ 3M + 1` equispaced angles `θ_j = 2πj/N`; its
coefficients are `c_k = (1/2π) ∫ f e^{−ikθ} dθ` for `0 ≤ k ≤ M` (`c_{−k} = c̄_k`), so
`f = Σ_{|k| ≤ M} c_k e^{ikθ}`. With `N ≥ 3M + 1` a product of two fields of band `M`
is integrated exactly against a third (the 3/2 rule): no aliasing in `div(μ X)`.
"""

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._validate import check_count
from ._grid import AbstractGrid

#: Points of the fine periodic grid on which a kernel's Funk–Hecke multipliers are
#: read (trapezoid rule: exact to the size of `I_Q(β)`, far below rounding for β ≤ 100).
PROFILE_POINTS = 512
#: The largest band: it represents the kernel of β up to about 10⁸ (`_checks.KERNEL_TAIL`),
#: far past the β any kernel takes in float64; a larger one only costs memory and time.
MAX_MODES = 2**16


class Circle(AbstractGrid):
    """Fourier modes `|k| ≤ modes` on the circle `S¹ ⊂ R²`.

    **Arguments:**

    - `modes`: the highest Fourier mode, `2 ≤ M ≤ 2**16`; the grid has `N = 3M + 1` points
      (rounded up to even).
    """

    modes: int = eqx.field(static=True)
    size: int = eqx.field(static=True)

    def __init__(self, modes: int):
        self.modes = check_count(modes, "modes", 2, MAX_MODES)
        self.size = 2 * math.ceil((3 * self.modes + 1) / 2)

    @property
    def dim(self) -> int:
        return 2

    @property
    def angles(self) -> Float[Array, " N"]:
        return 2 * jnp.pi * jnp.arange(self.size) / self.size

    @property
    def points(self) -> Float[Array, "N 2"]:
        return jnp.stack([jnp.cos(self.angles), jnp.sin(self.angles)], -1)

    @property
    def weights(self) -> Float[Array, " N"]:
        return jnp.full(self.size, 2 * jnp.pi / self.size)

    def degrees(self) -> Float[Array, "2 M1"]:
        return jnp.broadcast_to(jnp.arange(self.modes + 1.0), (2, self.modes + 1))

    @property
    def laplacian(self) -> Float[Array, "2 M1"]:
        return -self.degrees() ** 2

    def _complex(self, c):
        return c[0] + 1j * c[1]

    def _real(self, z):
        return jnp.stack([z.real, z.imag])

    def analysis(self, values: Float[Array, " N"]) -> Float[Array, "2 M1"]:
        return self._real(jnp.fft.rfft(values)[: self.modes + 1] / self.size)

    def synthesis(self, coefficients: Float[Array, "2 M1"]) -> Float[Array, " N"]:
        z = self._complex(coefficients) * self.size
        z = jnp.pad(z, (0, self.size // 2 + 1 - (self.modes + 1)))
        return jnp.fft.irfft(z, n=self.size)

    def gradient(self, coefficients):
        k = jnp.arange(self.modes + 1.0)
        return (self.synthesis(self._real(1j * k * self._complex(coefficients))),)

    def divergence(self, field):
        (f,) = field
        k = jnp.arange(self.modes + 1.0)
        return self._real(1j * k * self._complex(self.analysis(f)))

    def multipliers(self, profile):
        # ∫ G(cos(θ − φ)) e^{ikφ} dφ = e^{ikθ} ∫ G(cos u) e^{−iku} du, a real number.
        q = max(PROFILE_POINTS, 4 * self.modes + 8)
        u = 2 * jnp.pi * jnp.arange(q) / q
        lam = jnp.fft.rfft(profile(jnp.cos(u))).real[: self.modes + 1] * (2 * jnp.pi / q)
        return jnp.broadcast_to(lam, (2, self.modes + 1))

    def empirical(self, x: Float[Array, "n 2"]) -> Float[Array, "2 M1"]:
        theta = jnp.arctan2(x[:, 1], x[:, 0])
        k = jnp.arange(self.modes + 1.0)
        z = jnp.mean(jnp.exp(-1j * k[:, None] * theta[None, :]), axis=1) / (2 * jnp.pi)
        return self._real(z)
