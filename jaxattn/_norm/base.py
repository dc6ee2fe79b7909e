"""`AbstractNorm`: where the normalisation sits in a layer, and the flow it gives.

A placement owns the layer step and the velocity (its `τ → 0` limit) built from the
attention's raw update `v(y) = Σ_η Σ_j α^η_ij U_η y_j`, passed in as a function of
the tokens it reads: the dynamics never ask which placement they hold. Adding one is
a subclass (`docs/extending.md`). `N = N_W` (`ja.normalize`), `N(0) = 0`.
"""

import abc
from collections.abc import Callable

import equinox as eqx
from jaxtyping import Array, Float

from .._validate import check_final

#: The raw update `v` as a function of the tokens it reads, `(n, d) → (n, d)`.
Update = Callable[[Float[Array, "n d"]], Float[Array, "n d"]]


class AbstractNorm(eqx.Module):
    """A normalisation placement: a layer `x ← step(x)` and a flow `dx/dt = velocity(x)`.

    Subclasses declare `name` (the string spelling, `norm="post"`), `description`
    (one line, for reports), `stays_on_manifold` (whether the layer and the flow
    keep tokens on `E_W`; `ja.solve_flow` retracts onto `E_W` only those that do) and
    `papers_default` (whether it is the
    papers' placement, for which paper 001's theorems are proved:
    `ja.theory.classify`), and implement every abstract method.
    """

    name: eqx.AbstractClassVar[str]
    description: eqx.AbstractClassVar[str]
    stays_on_manifold: eqx.AbstractClassVar[bool]
    papers_default: eqx.AbstractClassVar[bool]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        check_final(cls, AbstractNorm)  # members implement abstract methods only

    @abc.abstractmethod
    def reads(self, x: Float[Array, "n d"], W: Float[Array, "d d"] | None
              ) -> Float[Array, "n d"]:
        """The tokens the attention reads at `x` (`x`, or `N(x)` for pre-norms)."""

    @abc.abstractmethod
    def velocity(self, update: Update, x: Float[Array, "n d"], W: Float[Array, "d d"] | None
                 ) -> Float[Array, "n d"]:
        """The continuous-time field `dx/dt` at `x`."""

    @abc.abstractmethod
    def step(self, update: Update, x: Float[Array, "n d"], tau, W: Float[Array, "d d"] | None,
             kick: Float[Array, "n d"] | None = None) -> Float[Array, "n d"]:
        """One layer of step `tau` from `x`; `kick`, a noise increment, is added where
        the update enters (before the normalisation, if any)."""

    @abc.abstractmethod
    def equiangular(self, s, m, r) -> tuple:
        """The flow of equiangular tokens (`ja.theory.equiangular_field`): for tokens
        of norm `r` whose raw update at the unit tokens has radial part `s` and norm
        `m`, `(ρ̇ / 2g, ṙ)` (`g` its tangential part along another token). Plain
        arithmetic on floats or arrays."""
