"""The interaction of the mean-field equation (kernels `"usa"`, `"exp"`, `"softmax"`), in
the papers' normalisation (`σ = 1`), and its map onto jaxattn's models (`coupling_of`):
`K = κ` for `"exp"` and `"softmax"`, `K = κ e^{−β}` for `"usa"`, for
`SelfAttentionDynamics(P = I, U = κ I, β)` with `TokenNoise(σ)`. The equation, the
kernels' forces and the map's derivation: docs/meanfield_equation.md."""

import math

import jax.numpy as jnp

from .._kernel import BUILTIN, AbstractKernel, as_kernel
from .._validate import check_scalar

#: The built-in kernels the equation covers: those exponential in the logit (an
#: `exponent_shift`).
KERNELS = tuple(name for name, cls in BUILTIN.items() if cls.exponent_shift is not None)


def check_kernel(kernel: str | AbstractKernel) -> AbstractKernel:
    """The member of `ja.AbstractKernel` that `kernel` names (a name or a member), or
    an error naming the kernels the equation covers: it is turned into its member
    here, once, at each public entry."""
    try:
        member = as_kernel(kernel)
    except ValueError:
        member = None
    if member is None or member.exponent_shift is None:
        members = ", ".join(f"ja.{BUILTIN[name].__name__}()" for name in KERNELS)
        raise ValueError(f"`kernel` must be one of {', '.join(map(repr, KERNELS))} (or "
                         f"{members}), got {kernel!r}.")
    return member


def interaction(beta):
    """`W_β(t) = (e^{βt} − 1)/β`, the interaction potential (`W_β' = e^{βt}`)."""
    return lambda t: jnp.expm1(beta * t) / beta


def profiles(beta, kernel: AbstractKernel):
    """`(G, Z)`: `X = ∇(G * μ)` for `"usa"`/`"exp"` (`Z = None`), `X = ∇(G * μ) /
    (Z * μ)` for the `normalised` `"softmax"` (scaled by `e^{−β}`, which the ratio does
    not see, so that large `β` does not overflow)."""
    if kernel.normalised:
        return (lambda t: jnp.exp(beta * (t - 1)) / beta), (lambda t: jnp.exp(beta * (t - 1)))
    return interaction(beta), None


def coupling_of(kappa: float, beta: float, kernel: str | AbstractKernel = "usa",
                sigma: float = 1.0) -> float:
    """The papers' coupling `K` (`σ = 1`) of jaxattn's model `U = κ I` with
    `TokenNoise(σ)`: `κ e^{−β}/σ²` (`"usa"`), `κ/σ²` (`"exp"`, `"softmax"`); its
    time is `σ² t` (docs/meanfield_equation.md).

    **Arguments:**

    - `kappa`: the value matrix's scale, `U = κ I`.
    - `beta`: the inverse temperature.
    - `kernel`: jaxattn's kernel, a member (`ja.USA()`) or its name.
    - `sigma`: the noise's strength, `TokenNoise(σ)`, `> 0`.

    **Returns:**

    `K` as a float.
    """
    kernel = check_kernel(kernel)
    kappa, beta = check_scalar(kappa, "kappa"), check_scalar(beta, "beta", nonnegative=True)
    sigma = check_scalar(sigma, "sigma", positive=True)  # σ = 0 has no papers' normalisation
    scale = math.exp(-beta * kernel.exponent_shift)  # weights e^{β(⟨x, y⟩ − c)}/n
    return kappa * scale / sigma**2
