"""The uniform density's linear stability: `growth_rate` of a spherical-harmonic mode and
the coupling `linear_threshold` where the first mode turns unstable, per kernel. The
Funk–Hecke formulas for `γ_ℓ`, `λ_ℓ` and the thresholds in both units:
docs/meanfield_equation.md, "Linear stability and the thresholds of every kernel"."""

import math

from .._kernel import AbstractKernel
from .._validate import check_sphere
from ._kernels import check_kernel


def _check(beta, d, mode=1):
    if isinstance(mode, bool) or not isinstance(mode, int) or mode < 1:
        raise ValueError(f"`mode` must be an int ≥ 1 (the degree of a harmonic), got {mode!r}.")
    return check_sphere(beta, d)[0]


def _log_bessel(nu: float, beta: float) -> float:
    """`log I_ν(β)`, from scipy's scaled `ive` (finite for every `β > 0`)."""
    from scipy.special import ive

    return math.log(ive(nu, beta)) + beta


def multiplier(beta: float, d: int, mode: int, kernel: AbstractKernel) -> float:
    """`λ_ℓ` of docs/meanfield_equation.md (the force's Funk–Hecke eigenvalue on degree `ℓ`,
    with the uniform density's factor; softmax's divided by `E[e^{βt}]`)."""
    beta = _check(beta, d, mode)
    nu = d / 2 - 1
    log = math.lgamma(d / 2) + nu * math.log(2 / beta) + _log_bessel(mode + nu, beta)
    log -= math.log(beta)
    if kernel.normalised:
        log -= math.lgamma(d / 2) + nu * math.log(2 / beta) + _log_bessel(nu, beta)
    return math.exp(log)


def growth_rate(beta, coupling, d: int, mode: int = 1, kernel: str | AbstractKernel = "usa", *,
                sigma: float = 1.0) -> float:
    """The linear growth rate `γ_ℓ = ℓ(ℓ + d − 2)(K λ_ℓ − σ²/2)` of a degree-`ℓ`
    harmonic perturbation of the uniform density (docs/meanfield_equation.md): negative below
    `linear_threshold`, positive above.

    **Arguments:**

    - `beta`: `β > 0`.
    - `coupling`: `K`.
    - `d`: the dimension (`S^{d−1}`).
    - `mode`: the degree `ℓ ≥ 1`.
    - `kernel`: `"usa"`, `"exp"` (the same) or `"softmax"`, or its member.
    - `sigma`: the noise (`1`: the papers' normalisation).

    **Returns:**

    `γ_ℓ` as a float (per unit time).
    """
    lam = multiplier(beta, d, mode, check_kernel(kernel))
    return mode * (mode + d - 2) * (float(coupling) * lam - float(sigma) ** 2 / 2)


def linear_threshold(beta, d: int, kernel: str | AbstractKernel = "usa", *,
                     sigma: float = 1.0) -> float:
    """The coupling where the uniform density turns linearly unstable (its first
    harmonic's `γ₁ = 0`): `σ² K_#(β)` for `"usa"`/`"exp"`, `σ² β I_{d/2−1}(β) /
    (2 I_{d/2}(β))` for `"softmax"` (docs/meanfield_equation.md)."""
    return float(sigma) ** 2 / (2 * multiplier(beta, d, 1, check_kernel(kernel)))
