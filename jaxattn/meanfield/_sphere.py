"""`Sphere(degree)`: spherical harmonics on `S² ⊂ R³`, by our own quadrature on a
Gauss–Legendre × equispaced grid (docs/meanfield_equation.md, "Grids and the solver",
also compares it with `s2fft`).

Coefficients are `a_ℓm = ∫ f Ȳ_ℓm dS` for `0 ≤ m ≤ ℓ ≤ L` (`a_ℓ,−m = (−1)^m ā_ℓm`), with
the orthonormal `Y_ℓm = P̃_ℓ^m(cos θ) e^{imφ}` (Condon–Shortley phase; scipy's
`sph_legendre_p_all`). The nodes are interior: `m P̃ / sin θ` is never evaluated at a
pole."""

import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import scipy.special
from jaxtyping import Array, Float

from .._precision import einsum
from .._validate import check_count
from ._grid import AbstractGrid

#: Gauss–Legendre nodes in `t = ⟨x, y⟩` for a kernel's Funk–Hecke multipliers, beyond
#: the degree: exact to rounding for the entire profiles `e^{βt}` up to β ≈ 100.
PROFILE_EXTRA = 160


class Sphere(AbstractGrid):
    """Spherical harmonics of degree `ℓ ≤ degree` on `S² ⊂ R³`.

    **Arguments:**

    - `degree`: the band limit `L ≥ 2`.
    """

    degree: int = eqx.field(static=True)
    legendre: Float[Array, "M1 ntheta L1"]  # P̃_ℓ^m(cos θ_j), indexed [m, j, ℓ]
    dtheta: Float[Array, "M1 ntheta L1"]  # ∂_θ P̃_ℓ^m
    over_sin: Float[Array, "M1 ntheta L1"]  # P̃_ℓ^m / sin θ_j
    cos_theta: Float[Array, " ntheta"]
    gauss_weights: Float[Array, " ntheta"]
    profile_nodes: Float[Array, " Q"]
    profile_weights: Float[Array, " Q"]
    profile_legendre: Float[Array, "Q L1"]  # P_ℓ(t_q)

    def __init__(self, degree: int):
        self.degree = L = check_count(degree, "degree", 2, 512)
        x, w = np.polynomial.legendre.leggauss(math.ceil((3 * L + 2) / 2))
        theta = np.arccos(x)
        p, dp = scipy.special.sph_legendre_p_all(L, L, theta, diff_n=1)  # [ℓ, m, j]
        self.legendre = jnp.asarray(np.transpose(p[:, : L + 1], (1, 2, 0)))
        self.dtheta = jnp.asarray(np.transpose(dp[:, : L + 1], (1, 2, 0)))
        self.over_sin = self.legendre / jnp.asarray(np.sin(theta))[None, :, None]
        self.cos_theta, self.gauss_weights = jnp.asarray(x), jnp.asarray(w)
        t, v = np.polynomial.legendre.leggauss(L + PROFILE_EXTRA)
        self.profile_nodes, self.profile_weights = jnp.asarray(t), jnp.asarray(v)
        self.profile_legendre = jnp.asarray(np.stack(
            [scipy.special.eval_legendre(ell, t) for ell in range(L + 1)], -1))

    @property
    def dim(self) -> int:
        return 3

    @property
    def longitudes(self) -> int:
        return 2 * math.ceil((3 * self.degree + 1) / 2)

    @property
    def shape(self) -> tuple[int, int]:
        """The grid's `(nθ, nφ)`."""
        return (self.cos_theta.shape[0], self.longitudes)

    @property
    def points(self) -> Float[Array, "ntheta nphi 3"]:
        phi = (2 * jnp.pi * jnp.arange(self.longitudes) / self.longitudes)[None, :]
        sin = jnp.sqrt(1 - self.cos_theta**2)[:, None]
        return jnp.stack([sin * jnp.cos(phi), sin * jnp.sin(phi),
                          jnp.broadcast_to(self.cos_theta[:, None], self.shape)], -1)

    @property
    def weights(self) -> Float[Array, "ntheta nphi"]:
        return jnp.broadcast_to(self.gauss_weights[:, None] * (2 * jnp.pi / self.longitudes),
                                self.shape)

    def degrees(self) -> Float[Array, "2 M1 L1"]:
        ell = jnp.arange(self.degree + 1.0)
        valid = ell[None, :] >= ell[:, None]  # [m, ℓ]: ℓ ≥ m
        return jnp.broadcast_to(jnp.where(valid, ell[None, :], -1.0), (2,) + valid.shape)

    @property
    def laplacian(self) -> Float[Array, "2 M1 L1"]:
        ell = jnp.maximum(self.degrees(), 0.0)
        return -ell * (ell + 1)

    def _orders(self) -> Float[Array, "M1 1"]:
        return jnp.arange(self.degree + 1.0)[:, None]

    def _synthesis(self, matrix, c) -> Float[Array, "ntheta nphi"]:
        g = einsum("mjl,rml->rjm", matrix, c)  # r: real and imaginary parts
        z = (g[0] + 1j * g[1]) * self.longitudes
        z = jnp.pad(z, ((0, 0), (0, self.longitudes // 2 + 1 - (self.degree + 1))))
        return jnp.fft.irfft(z, n=self.longitudes, axis=1)

    def _analysis(self, matrix, values) -> Float[Array, "2 M1 L1"]:
        z = jnp.fft.rfft(values, axis=1)[:, : self.degree + 1] / self.longitudes
        wz = jnp.stack([z.real, z.imag]) * (2 * jnp.pi * self.gauss_weights)[None, :, None]
        return einsum("mjl,rjm->rml", matrix, wz)

    def analysis(self, values):
        return self._analysis(self.legendre, values)

    def synthesis(self, coefficients):
        return self._synthesis(self.legendre, coefficients)

    def gradient(self, coefficients):
        m = self._orders()
        # (1/sin θ) ∂_φ: the coefficients times i m
        i_m = jnp.stack([-m * coefficients[1], m * coefficients[0]])
        return (self._synthesis(self.dtheta, coefficients), self._synthesis(self.over_sin, i_m))

    def divergence(self, field):
        f_theta, f_phi = field
        a = self._analysis(self.dtheta, f_theta)
        b = self._analysis(self.over_sin, f_phi)
        m = self._orders()
        # a_ℓm = −(A − i m B): the weak form with ∇Ȳ = (∂_θ P̃, −i m P̃/sin θ) e^{−imφ}
        return -(a + jnp.stack([m * b[1], -m * b[0]]))

    def multipliers(self, profile):
        g = profile(self.profile_nodes) * self.profile_weights
        lam = 2 * jnp.pi * einsum("q,ql->l", g, self.profile_legendre)
        return jnp.broadcast_to(lam, (2, self.degree + 1, self.degree + 1))

    def empirical(self, x: Float[Array, "n 3"]) -> Float[Array, "2 M1 L1"]:
        x = np.asarray(x, dtype=np.float64)
        total = np.zeros((self.degree + 1, self.degree + 1), complex)
        for chunk in np.array_split(x, max(1, len(x) // 2000)):
            theta = np.arccos(np.clip(chunk[:, 2], -1, 1))
            phi = np.arctan2(chunk[:, 1], chunk[:, 0])
            p = scipy.special.sph_legendre_p_all(self.degree, self.degree, theta, diff_n=0)
            p = p[0, :, : self.degree + 1]
            m = np.arange(self.degree + 1)
            total += np.einsum("lmi,mi->ml", p, np.exp(-1j * m[:, None] * phi[None, :]))
        total /= len(x)
        return jnp.asarray(np.stack([total.real, total.imag]))
