"""The uniform density's linear stability: `growth_rate` of a spherical-harmonic mode and
the coupling `linear_threshold` where the first mode turns unstable, per kernel. The
Funk–Hecke formulas for `γ_ℓ`, `λ_ℓ` and the thresholds in both units:
docs/meanfield_equation.md, "Linear stability and the thresholds of every kernel"."""

import math

import numpy as np

from .._kernel import AbstractKernel
from .._validate import check_count, check_scalar, check_sphere
from ..theory._noisy import log_bessel
from ._kernels import check_kernel, coupling_of


def log_multiplier(beta: float, d: int, mode: int, kernel: AbstractKernel) -> float:
    """`log λ_ℓ` of docs/meanfield_equation.md (the force's Funk–Hecke eigenvalue on
    degree `ℓ`, with the uniform density's factor; softmax's divided by `E[e^{βt}]`),
    finite for every `β > 0`, `d`, `ℓ`: `λ_ℓ` itself over- or underflows float64 past
    `β ≈ 700` (`"usa"`) or at high degrees."""
    beta, mode = check_sphere(beta, d)[0], check_count(mode, "mode", 1)
    nu = d / 2 - 1
    log = log_bessel(mode + nu, beta) - math.log(beta)
    if kernel.normalised:  # over E[e^{βt}] = Γ(d/2) (2/β)^ν I_ν(β): that factor cancels
        return log - log_bessel(nu, beta)
    return log + math.lgamma(d / 2) + nu * math.log(2 / beta)


#: `log` of float64's largest number: `e^x` overflows past it.
_LOG_MAX = math.log(np.finfo(np.float64).max)


def growth_rate(beta, coupling, d: int, mode: int = 1, kernel: str | AbstractKernel = "usa", *,
                sigma: float = 1.0) -> float:
    """The linear growth rate `γ_ℓ = ℓ(ℓ + d − 2)(K λ_ℓ − σ²/2)` of a degree-`ℓ`
    harmonic perturbation of the uniform density (docs/meanfield_equation.md): negative below
    `linear_threshold`, positive above.

    **Arguments:**

    - `beta`: `β > 0` (any; past `β ≈ 700` `"usa"`'s `K λ_ℓ` overflows unless `K`
      is small, and is refused).
    - `coupling`: `K`, finite.
    - `d`: the dimension (`S^{d−1}`).
    - `mode`: the degree `ℓ ≥ 1`.
    - `kernel`: `"usa"`, `"exp"` (the same) or `"softmax"`, or its member.
    - `sigma`: the noise (`1`: the papers' normalisation).

    **Returns:**

    `γ_ℓ` as a float (per unit time).
    """
    log = log_multiplier(beta, d, mode, check_kernel(kernel))
    coupling = check_scalar(coupling, "coupling")
    sigma = check_scalar(sigma, "sigma", nonnegative=True)
    force = 0.0 if coupling == 0 else math.log(abs(coupling)) + log
    if force > _LOG_MAX - math.log(mode * (mode + d - 2)):
        raise ValueError(f"growth_rate: K λ_ℓ = e^{force:.4g} overflows float64 (β = {beta:g}; "
                         "the force grows as e^β/β): use a smaller β or kernel='softmax'.")
    lam = math.exp(log)  # 0 where it underflows: K λ_ℓ is then far below σ²/2
    return mode * (mode + d - 2) * (coupling * lam - sigma**2 / 2)


def linear_threshold(beta, d: int, kernel: str | AbstractKernel = "usa", *,
                     sigma: float | None = None) -> float:
    """The coupling where the uniform density turns linearly unstable (its first
    harmonic's `γ₁ = 0`; docs/meanfield_equation.md).

    **Arguments:**

    - `beta`: `β > 0`.
    - `d`: the dimension (`S^{d−1}`).
    - `kernel`: `"usa"`, `"exp"` or `"softmax"`, or its member.
    - `sigma`: `None` for the papers' coupling `K_#`; a noise `σ > 0` for jaxattn's
      `κ_#` (`U = κ I` with `TokenNoise(σ)`), the `κ` whose `coupling_of` is `K_#`.

    **Returns:**

    `K_#(β) = β^{d/2} / (2^{d/2} Γ(d/2) I_{d/2}(β))` for `"usa"`/`"exp"`,
    `β I_{d/2−1}(β) / (2 I_{d/2}(β))` for `"softmax"`; with `sigma`, that over
    `coupling_of(1, β, kernel, σ)`.
    """
    kernel = check_kernel(kernel)
    log = log_multiplier(beta, d, 1, kernel)
    per_kappa = 1.0 if sigma is None else coupling_of(1.0, beta, kernel, sigma)
    # e^{−β} of "usa" underflows past β ≈ 745: the range check below refuses it
    threshold = -math.log(2) - log - (math.log(per_kappa) if per_kappa > 0 else -math.inf)
    if not -_LOG_MAX < threshold < _LOG_MAX or not -_LOG_MAX < log < _LOG_MAX:
        raise ValueError(f"linear_threshold: the threshold is e^{threshold:.4g}, past "
                         f"float64's range at β = {beta:g}, d = {d}; use a smaller β or "
                         "kernel='softmax'.")
    return 1 / (2 * math.exp(log) * per_kappa)
