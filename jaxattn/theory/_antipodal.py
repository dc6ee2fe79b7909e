"""Two tokens under the common value noise (Fedorov, Sander, Elie, Marion, Laurière,
"Clustering in Deep Stochastic Transformers", arXiv 2601.21942): the cosine
`ρ = ⟨x_1, x_2⟩` is a one-dimensional Itô diffusion, whose ends decide the clusters
(`docs/noise.md`, "Antipodal clusters").

The model: tokens on `S^{d−1}` under `ja.SelfAttentionDynamics(P = I, U = I, β)` with
`noise=ja.ValueNoise(σ)` (`dx_i = v_i dt + σ P_{x_i} dB_t m_i`, `m_i = Σ_j α_ij x_j`).
Consensus `ρ = 1` always attracts; the antipodal end `ρ = −1` attracts with positive
probability exactly when `antipodal_rate(β, d, σ) < 0`, i.e. past
`antipodal_threshold(d, σ)` in `β`. These are host functions of floats (numpy arrays
of `ρ` or `β` are taken where said).
"""

import math

import numpy as np

from .._validate import check_scalar, refuse_first
from ._noisy import check_sphere_args

#: The `u = atanh ρ` grid of the scale function: `[−U_MAX, U_MAX]` in `U_POINTS`.
U_MAX, U_POINTS = 30.0, 6001


def _cosine(rho):
    """`rho` as a float array, refused unless every entry is a cosine in `[−1, 1]`."""
    rho = np.asarray(rho, float)
    bad = next(iter(rho[~((rho >= -1) & (rho <= 1))].flat), None)
    refuse_first([(bad is not None, f"`rho` is the cosine of two tokens: it must lie in "
                                    f"[−1, 1], got {bad}.")])
    return rho


def _weights(beta, rho):
    """`(a, q)`: the attention `a = α_12 = 1/(1 + e^{β(1 − ρ)})` of two tokens at
    cosine `ρ`, and `q = 2a(1 − a)`."""
    a = 1.0 / (1.0 + np.exp(beta * (1.0 - rho)))
    return a, 2.0 * a * (1.0 - a)


def antipodal_drift(rho, beta, d: int, sigma):
    """The Itô drift of the cosine `ρ` of two tokens under the common value noise:
    `b(ρ) = (1 − ρ²)[2a + σ²(q(d − 2) − (1 − q)ρ)]`, with `a = 1/(1 + e^{β(1 − ρ)})`
    the attention one token gives the other and `q = 2a(1 − a)`.

    **Arguments:**

    - `rho`: the cosine `ρ ∈ [−1, 1]` (a float or a numpy array).
    - `beta`: the inverse temperature `β`.
    - `d`: the dimension, an int `≥ 2` (tokens on `S^{d−1}`).
    - `sigma`: the noise's strength `σ > 0`.

    **Returns:**

    `b(ρ)`, shaped as `rho`.
    """
    sigma, d = check_sphere_args(sigma, d, name="sigma")
    rho = _cosine(rho)
    a, q = _weights(beta, rho)
    return (1.0 - rho**2) * (2.0 * a + sigma**2 * (q * (d - 2) - (1.0 - q) * rho))


def antipodal_diffusion(rho, beta, sigma):
    """The squared diffusion of the cosine `ρ` of two tokens under the common value
    noise: `s²(ρ) = 2σ²(1 − q)(1 − ρ²)²` (`q` as in `antipodal_drift`).

    **Arguments:**

    - `rho`, `beta`, `sigma`: as `antipodal_drift`.

    **Returns:**

    `s²(ρ)`, shaped as `rho`.
    """
    sigma, _ = check_sphere_args(sigma, 2, name="sigma")
    rho = _cosine(rho)
    _, q = _weights(beta, rho)
    return 2.0 * sigma**2 * (1.0 - q) * (1.0 - rho**2) ** 2


def antipodal_rate(beta, d: int, sigma):
    """The exponent of `log(1 + ρ)` at the antipodal end `ρ = −1`:
    `λ = 4a + 2σ²((d − 1)q − 1)`, with `a, q` at `ρ = −1`. The antipodal end attracts
    with positive probability iff `λ < 0`. (At the consensus end the exponent of
    `log(1 − ρ)` is `−2 − σ²(d − 1) < 0`: consensus always attracts.)

    **Arguments:**

    - `beta`: the inverse temperature (a float or a numpy array).
    - `d`, `sigma`: as `antipodal_drift`.

    **Returns:**

    `λ`, shaped as `beta`.
    """
    sigma, d = check_sphere_args(sigma, d, name="sigma")
    a, q = _weights(beta, -1.0)
    return 4.0 * a + 2.0 * sigma**2 * ((d - 1) * q - 1.0)


#: Below this σ, `antipodal_threshold` takes its limit `log(√2/σ)`: the terms it drops
#: are `O(σ²)`, below float64's rounding, and `(1/σ²)²` overflows further down.
SMALL_SIGMA = 1e-50


def antipodal_threshold(d: int, sigma) -> float:
    """The `β` past which the antipodal end attracts: `β_c = ½ log E`, `E` the larger
    root of `E² − 2cE + 1 − 2/σ² = 0`, `c = d − 2 + 1/σ²` (`antipodal_rate = 0` with
    `E = e^{2β}`).

    **Arguments:**

    - `d`: the dimension, an int `≥ 2`.
    - `sigma`: the noise's strength `σ > 0`.

    **Returns:**

    `β_c` as a float; `0.0` when `antipodal_rate < 0` at every `β > 0`.
    """
    sigma, d = check_sphere_args(sigma, d, name="sigma")
    if sigma < SMALL_SIGMA:  # (1/σ²)² overflows below ~1e-77; β_c = log(√2/σ) + O(σ²)
        return 0.5 * math.log(2.0) - math.log(sigma)
    inv = (1 / sigma) ** 2  # 0 past σ ≈ 1e154, where σ² overflowed (OverflowError)
    c = d - 2 + inv
    disc = c**2 - 1 + 2 * inv
    if disc < 0:
        return 0.0
    return max(0.0, 0.5 * math.log(c + math.sqrt(disc)))


def antipodal_probability(beta, d: int, sigma) -> float:
    """`P(ρ_t → −1)` for two independent uniform tokens on `S^{d−1}`, by the scale
    function of the diffusion of `ρ`.

    `P(ρ_0) = ∫_{ρ_0}^1 S' / ∫_{−1}^1 S'`, `S'(ρ) = exp(−∫_0^ρ 2b/s²)`, averaged over
    `ρ_0` (density `∝ (1 − ρ²)^{(d−3)/2}`). In `u = atanh ρ`, `2b/s² dρ = g(tanh u)
    du`, integrated by the trapezoid rule on `U_POINTS` points of `[−U_MAX, U_MAX]`;
    the tails past `±U_MAX` are summed exactly as exponentials.

    **Arguments:**

    - `beta`: the inverse temperature, a float.
    - `d`, `sigma`: as `antipodal_drift`.

    **Returns:**

    The probability as a float; `0.0` when `antipodal_rate ≥ 0`.
    """
    sigma, d = check_sphere_args(sigma, d, name="sigma")
    beta = check_scalar(beta, "beta")
    if antipodal_rate(beta, d, sigma) >= 0:
        return 0.0
    u = np.linspace(-U_MAX, U_MAX, U_POINTS)
    du = u[1] - u[0]
    rho = np.tanh(u)
    a, q = _weights(beta, rho)
    g = (2 * a + sigma**2 * (q * (d - 2) - (1 - q) * rho)) / (sigma**2 * (1 - q))
    G = np.concatenate([[0.0], np.cumsum((g[1:] + g[:-1]) * du / 2)])
    G -= G[U_POINTS // 2]
    log_sech2 = -2 * (np.abs(u) + np.log1p(np.exp(-2 * np.abs(u))) - math.log(2))
    h = -G + log_sech2
    w = np.exp(h - h.max())
    cells = (w[1:] + w[:-1]) * du / 2
    tail_hi = w[-1] / (g[-1] + 2)
    tail_lo = w[0] / (2 - g[0])
    above = np.concatenate([np.cumsum(cells[::-1])[::-1], [0.0]]) + tail_hi
    p = above / (above[0] + tail_lo)
    start = np.exp((d - 1) / 2 * log_sech2)
    return float(np.sum(p * start) / np.sum(start))

