"""The uniform density's linear stability: `growth_rate` of a mode and the coupling
`linear_threshold` where the first mode turns unstable (`docs/meanfield_equation.md`).

Linearised at `μ = 1/|S^{d−1}|`, the equation `∂_t μ = (σ²/2) Δμ − K div(μ X[μ])` is
diagonal in spherical harmonics (Funk–Hecke): a harmonic of degree `ℓ` grows at

    γ_ℓ = ℓ(ℓ + d − 2) (K λ_ℓ − σ²/2),    λ_ℓ = E[W_β(t) P_ℓ(t)]
                                         = Γ(d/2) (2/β)^{d/2−1} I_{ℓ+d/2−1}(β) / β

(`t = ⟨x, y⟩` with `y` uniform, `P_ℓ` the Gegenbauer polynomial with `P_ℓ(1) = 1`,
`I_ν` the modified Bessel function). For softmax the force is
divided by `E[e^{βt}] = Γ(d/2) (2/β)^{d/2−1} I_{d/2−1}(β)` at the uniform state. So the
first mode turns unstable at

- `"usa"`, `"exp"`: `K = 1/(2λ₁) = β^{d/2} / (2^{d/2} Γ(d/2) I_{d/2}(β)) = K_#(β)`
  (`ja.theory.noisy_threshold`);
- `"softmax"`: `K = β I_{d/2−1}(β) / (2 I_{d/2}(β))`, `d/2` at `β → 0`, `≈ β/2` at
  large `β`;

times `σ²` for other noise. In jaxattn's units (`U = κ I`, `TokenNoise(σ)`) the
thresholds are `κ = σ² e^{β} K_#` (`"usa"`), `σ² K_#` (`"exp"`) and
`σ² β I_{d/2−1}/(2 I_{d/2})` (`"softmax"`).
"""

import math

from .._kernel import AbstractKernel
from ._kernels import check_kernel


def _check(beta, d, mode=1):
    value = float(beta)
    for bad, message in (
        (isinstance(d, bool) or not isinstance(d, int) or d < 2,
         f"`d` must be an int ≥ 2 (the sphere S^(d-1)), got {d!r}."),
        (isinstance(mode, bool) or not isinstance(mode, int) or mode < 1,
         f"`mode` must be an int ≥ 1 (the degree of a harmonic), got {mode!r}."),
        (not (math.isfinite(value) and value > 0), f"`beta` must be finite and > 0, got {beta!r}."),
    ):
        if bad:
            raise ValueError(message)
    return value


def _log_bessel(nu: float, beta: float) -> float:
    """`log I_ν(β)`, from scipy's scaled `ive` (finite for every `β > 0`)."""
    from scipy.special import ive

    return math.log(ive(nu, beta)) + beta


def multiplier(beta: float, d: int, mode: int, kernel: AbstractKernel) -> float:
    """`λ_ℓ` of the module docstring (the force's Funk–Hecke eigenvalue on degree `ℓ`,
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
    harmonic perturbation of the uniform density (module docstring): negative below
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
    (2 I_{d/2}(β))` for `"softmax"` (module docstring)."""
    return float(sigma) ** 2 / (2 * multiplier(beta, d, 1, check_kernel(kernel)))
