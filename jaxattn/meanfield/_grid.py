"""The grids of the mean-field equation: a family (`AbstractGrid`; `Circle`, `Sphere`).

A density on `S^{d−1}` is an array of its values at the grid's points (`grid.points`,
`grid.weights`: `∫ f dS ≈ Σ weights · f`), with respect to the surface measure, so the
uniform density is `1/|S^{d−1}|`. The solver works on its band-limited coefficients
(`analysis`, `synthesis`), where the Laplacian and rotation-invariant convolutions are
diagonal; `div(μ X)` is formed on the grid with the 3/2 rule (no aliasing)."""

import abc
from collections.abc import Callable

import equinox as eqx
from jaxtyping import Array, Float


class AbstractGrid(eqx.Module):
    """A quadrature grid and a spectral basis on `S^{d−1}`.

    Coefficients are real arrays of `coefficient_shape` (the real and imaginary parts of
    the complex coefficients stacked on a leading axis of 2)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """`d`: the sphere is `S^{d−1} ⊂ R^d`."""

    @property
    @abc.abstractmethod
    def points(self) -> Float[Array, "*grid d"]:
        """The grid's points, unit vectors of `R^d`."""

    @property
    @abc.abstractmethod
    def weights(self) -> Float[Array, "*grid"]:
        """Quadrature weights: `∫ f dS = Σ weights · f` for band-limited products."""

    @property
    @abc.abstractmethod
    def laplacian(self) -> Float[Array, "2 ..."]:
        """The Laplace–Beltrami eigenvalue `−ℓ(ℓ + d − 2)` of every coefficient."""

    @abc.abstractmethod
    def analysis(self, values: Float[Array, "*grid"]) -> Float[Array, "2 ..."]:
        """Grid values → coefficients (the projection onto the grid's band)."""

    @abc.abstractmethod
    def synthesis(self, coefficients: Float[Array, "2 ..."]) -> Float[Array, "*grid"]:
        """Coefficients → grid values."""

    @abc.abstractmethod
    def gradient(self, coefficients: Float[Array, "2 ..."]
                 ) -> tuple[Float[Array, "*grid"], ...]:
        """The surface gradient of a field, on the grid, in the grid's tangent frame."""

    @abc.abstractmethod
    def divergence(self, field: tuple[Float[Array, "*grid"], ...]) -> Float[Array, "2 ..."]:
        """The coefficients of the surface divergence of a tangent field (weak form:
        `∫ Ȳ div F = −∫ ∇Ȳ · F`, so its mean is exactly 0)."""

    @abc.abstractmethod
    def multipliers(self, profile: Callable[[Array], Array]) -> Float[Array, "2 ..."]:
        """Funk–Hecke: the eigenvalue of `f ↦ ∫ G(⟨·, y⟩) f(y) dS(y)` on every
        coefficient, for the profile `G(t)`, `t ∈ [−1, 1]` (traceable in `G`'s
        parameters)."""

    @abc.abstractmethod
    def empirical(self, x: Float[Array, "n d"]) -> Float[Array, "2 ..."]:
        """The coefficients of the empirical measure `(1/n) Σ δ_{x_i}`."""

    @abc.abstractmethod
    def degrees(self) -> Float[Array, "2 ..."]:
        """The degree `ℓ` (`|k|` on the circle) of every coefficient; −1 where a
        slot holds no coefficient."""
