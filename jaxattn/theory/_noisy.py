"""The noisy transformer's phase transition on the sphere (Mun & Rosenzweig 2026):
the uniform density's linear-stability threshold `K_#(β)` and the temperature `β*`
that separates continuous from discontinuous transitions (`docs/noise.md`); the
diffusion of noisy layers of a finite step (`layer_diffusion`) and the threshold read
off measured growth rates (`fit_threshold`)."""

import math
import sys

import numpy as np
from scipy.special import ive

from .._validate import check_sphere as check_sphere_args
from .._validate import refuse_first
from ..metrics import fit_crossing, fit_intercept, fit_slope

#: Below this `ive(ν, β)` (near float64's smallest normal number) `log I_ν(β)` is taken
#: from Debye's expansion instead.
_TINY = 1e-280


def log_bessel(nu: float, beta: float) -> float:
    """`log I_ν(β)`, from scipy's scaled `ive` (finite for every `β > 0`), or where that
    underflows (`ν ≫ β`: a high mode, a large `d`) from Debye's uniform expansion with
    three corrections (DLMF 10.41.3; relative error `O(ν⁻⁴)`, below `1e-8` there)."""
    scaled = float(ive(nu, beta))
    if scaled > _TINY:
        return math.log(scaled) + beta
    z = beta / nu
    root = math.sqrt(1 + z * z)
    p = 1 / root
    eta = root + math.log(z / (1 + root))
    u1 = (3 * p - 5 * p**3) / 24
    u2 = (81 * p**2 - 462 * p**4 + 385 * p**6) / 1152
    u3 = (30375 * p**3 - 369603 * p**5 + 765765 * p**7 - 425425 * p**9) / 414720
    series = 1 + u1 / nu + u2 / nu**2 + u3 / nu**3
    return nu * eta - 0.5 * math.log(2 * math.pi * nu * root) + math.log(series)


def noisy_threshold(beta: float, d: int) -> float:
    """The linear-stability threshold of the uniform density on `S^{d−1}`,
    `K_#(β) = β^{d/2} / (2^{d/2} Γ(d/2) I_{d/2}(β))` (`I_ν` the modified Bessel
    function of the first kind), for the unnormalised self-attention (USA) model with
    noise; the couplings `K` above it make the uniform density unstable.

    Computed as `exp(d/2 log(β/2) − log Γ(d/2) − log I_{d/2}(β))` (`log_bessel`),
    finite for every `β > 0` and `d`; `K_#(0⁺) = d/2`.

    **Arguments:**

    - `beta`: the inverse temperature `β > 0`.
    - `d`: the ambient dimension `d ≥ 2` (tokens on `S^{d−1}`).

    **Returns:**

    `K_#(β)` as a float.
    """
    beta, d = check_sphere_args(beta, d)
    nu = d / 2
    log_k = nu * math.log(beta / 2) - math.lgamma(nu) - log_bessel(nu, beta)
    if log_k < math.log(sys.float_info.min):
        raise ValueError(f"K_#(β = {beta:g}, d = {d}) = e^{log_k:.4g} is below float64's "
                         "smallest normal number (it would read as 0): choose a smaller "
                         "`beta`.")
    return math.exp(log_k)


def noisy_beta_star(d: int) -> float:
    """The `β*` of dimension `d`: the unique root of `I_{d/2+1}(β) / I_{d/2}(β) = 1/d`.
    For `β ≤ β*` the uniform density stays the global minimiser up to `K_#(β)` (a
    continuous transition); above, the transition is discontinuous.

    **Arguments:**

    - `d`: the ambient dimension `d ≥ 2`.

    **Returns:**

    `β*` as a float (Brent's method on the ratio of Bessel functions, to `1e-14`
    relative where scipy's `ive` is finite, about `d ≤ 300`; past that the ratio is
    Debye's, `O(d⁻⁴)`).
    """
    from scipy.optimize import brentq

    _, d = check_sphere_args(1.0, d)
    nu = d / 2

    def gap(beta):
        return math.exp(log_bessel(nu + 1, beta) - log_bessel(nu, beta)) - 1 / d

    # The ratio grows from 0 at β = 0 to 1 as β → ∞; at 10(d + 1) it is above 1/d.
    return float(brentq(gap, 1e-12, 10.0 * (d + 1), xtol=1e-300, rtol=1e-14))


def layer_diffusion(d: int, tau: float, sigma: float) -> float:
    """The diffusion of free tokens under noisy layers of step `τ`, over `σ²`: the
    normalisation shortens a Gaussian step `ε` (`σ√τ` per tangent direction), so the
    mean token decays per layer by `E (1 + |ε|²)^{−1/2}` (`|ε|²/σ²τ` a χ² of `d − 1`
    degrees), where Brownian motion of generator `(D/2)Δ` gives `e^{−(d−1)Dτ/2}`.

    It is `1 − σ²τ(d + 2)/2 + O(τ²)`; 0.83 at `σ = √2`, `τ = 0.05`, `d = 3`, and
    1 as `τ → 0` (the SDE).

    **Arguments:**

    - `d`: the dimension, an int `≥ 2` (tokens on `S^{d−1}`).
    - `tau`: the layer step `τ > 0`.
    - `sigma`: the noise's strength `σ > 0` (`ja.TokenNoise(σ)`).

    **Returns:**

    `D` as a float (scipy's `quad` over the χ² density).
    """
    from scipy import integrate, stats

    tau, d = check_sphere_args(tau, d, name="tau")
    sigma, _ = check_sphere_args(sigma, d, name="sigma")
    s2, k = sigma**2, d - 1
    mean, _ = integrate.quad(lambda u: stats.chi2.pdf(u, k) / math.sqrt(1 + s2 * tau * u),
                             0, math.inf)
    return -2 * math.log(mean) / (k * tau * s2)


def fit_threshold(K, rates) -> tuple[float, float, float]:
    """The threshold where the decay rate of the uniform state's first mode vanishes:
    where the least-squares line through `(K, γ)` crosses 0, its standard error (the
    delta method: `ja.metrics.fit_crossing`) and the line's value at `K = 0`
    (`ja.metrics.fit_intercept`; the linear theory: `γ = (d − 1)(σ²/2) D (1 − K/K_#)`,
    `D` the `layer_diffusion`).

    **Arguments:**

    - `K`: the couplings `(k,)`: three distinct or more, four finite rates or more in
      all.
    - `rates`: the decay rates per coupling, `(k,)` or `(k, seeds)`; NaN rates are
      left out.

    **Returns:**

    `(K_c, its standard error, γ(0))`; NaN for all when there are too few rates or
    the line does not fall.
    """
    K = np.asarray(K, float)
    rates = np.asarray(rates, float)
    refuse_first([
        (K.ndim != 1 or rates.shape[:1] != K.shape or rates.ndim > 2, "fit_threshold needs "
         f"couplings (k,) and rates (k,) or (k, seeds), got {K.shape} and {rates.shape}."),
        (not np.all(np.isfinite(K)), f"fit_threshold needs finite couplings `K`, got {K}."),
    ])
    rates = rates.reshape(len(K), -1)
    x, y = np.repeat(K, rates.shape[1]), rates.ravel()
    keep = np.isfinite(y)
    if keep.sum() < 4 or len(np.unique(x[keep])) < 3:
        return math.nan, math.nan, math.nan
    x, y = x[keep], y[keep]
    if not fit_slope(x, y)[0] < 0:
        return math.nan, math.nan, math.nan
    return *fit_crossing(x, y), fit_intercept(x, y)[0]
