"""The noisy transformer's phase transition on the sphere (Mun & Rosenzweig 2026):
the uniform density's linear-stability threshold `K_#(β)` and the temperature `β*`
that separates continuous from discontinuous transitions (`docs/noise.md`)."""

import math


def noisy_threshold(beta: float, d: int) -> float:
    """The linear-stability threshold of the uniform density on `S^{d−1}`,
    `K_#(β) = β^{d/2} / (2^{d/2} Γ(d/2) I_{d/2}(β))` (`I_ν` the modified Bessel
    function of the first kind), for the unnormalised self-attention (USA) model with
    noise; the couplings `K` above it make the uniform density unstable.

    Computed as `exp(d/2 log(β/2) − log Γ(d/2) − log ive(d/2, β) − β)` (scipy's
    exponentially scaled `ive`), finite for every `β > 0`; `K_#(0⁺) = d/2`.

    **Arguments:**

    - `beta`: the inverse temperature `β > 0`.
    - `d`: the ambient dimension `d ≥ 2` (tokens on `S^{d−1}`).

    **Returns:**

    `K_#(β)` as a float.
    """
    from scipy.special import ive

    beta, d = _check(beta, d)
    nu = d / 2
    return math.exp(nu * math.log(beta / 2) - math.lgamma(nu) - math.log(ive(nu, beta)) - beta)


def noisy_beta_star(d: int) -> float:
    """The `β*` of dimension `d`: the unique root of `I_{d/2+1}(β) / I_{d/2}(β) = 1/d`.
    For `β ≤ β*` the uniform density stays the global minimiser up to `K_#(β)` (a
    continuous transition); above, the transition is discontinuous.

    **Arguments:**

    - `d`: the ambient dimension `d ≥ 2`.

    **Returns:**

    `β*` as a float (Brent's method on the ratio of scaled Bessel functions, to
    `1e-14` relative).
    """
    from scipy.optimize import brentq
    from scipy.special import ive

    _, d = _check(1.0, d)
    nu = d / 2

    def gap(beta):
        return ive(nu + 1, beta) / ive(nu, beta) - 1 / d

    # The ratio grows from 0 at β = 0 to 1 as β → ∞; at 10(d + 1) it is above 1/d.
    return float(brentq(gap, 1e-12, 10.0 * (d + 1), xtol=1e-300, rtol=1e-14))


def _check(beta, d) -> tuple[float, int]:
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"`d` must be an int ≥ 2 (tokens on the sphere S^(d-1)), got {d!r}.")
    try:
        beta = float(beta)
    except (TypeError, ValueError) as e:
        raise TypeError(f"`beta` must be a real number, got {beta!r}.") from e
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"`beta` must be finite and > 0, got {beta}.")
    return beta, d
