"""The noisy dynamics' theory in `ja.theory`: the two-token reduction under the common
value noise (its drift and diffusion against one noisy layer of the core, its
exponent, threshold and scale function against independent quadratures), and the
noisy USA transition's finite-step diffusion and threshold fit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

T = ja.theory


@pytest.mark.parametrize("d", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.3])
def test_threshold_is_where_the_antipodal_rate_changes_sign(d, sigma):
    beta_c = T.antipodal_threshold(d, sigma)
    assert beta_c > 0
    assert abs(T.antipodal_rate(beta_c, d, sigma)) < 1e-10
    assert T.antipodal_rate(0.9 * beta_c, d, sigma) > 0 > T.antipodal_rate(1.1 * beta_c, d, sigma)


def test_no_threshold_when_the_noise_alone_holds_antipodes():
    """d = 2, σ = 1.7: the rate is negative at every β > 0, so β_c = 0."""
    sigma = 1.7
    assert T.antipodal_threshold(2, sigma) == 0.0
    assert all(T.antipodal_rate(b, 2, sigma) < 0 for b in (1e-6, 0.5, 3.0))


@pytest.mark.parametrize("d, beta", [(2, 0.3), (4, 1.2), (7, 2.5)])
def test_rates_are_the_log_drifts_of_the_reduced_sde(d, beta):
    """`λ = b'(end) − s²''(end)/2` read off the drift and the diffusion by finite
    differences, at both ends (at `ρ = 1`: `−2 − σ²(d − 1)`)."""
    sigma, e = 0.8, 1e-6
    b, s2 = T.antipodal_drift, T.antipodal_diffusion
    at_minus = b(-1 + e, beta, d, sigma) / e - s2(-1 + e, beta, sigma) / e**2 / 2
    at_plus = -b(1 - e, beta, d, sigma) / e - s2(1 - e, beta, sigma) / e**2 / 2
    assert at_minus == pytest.approx(T.antipodal_rate(beta, d, sigma), rel=1e-4, abs=1e-5)
    assert at_plus == pytest.approx(-2 - sigma**2 * (d - 1), rel=1e-4)


def test_drift_and_diffusion_are_one_noisy_layer_of_the_core(key):
    """The moments of `Δρ` over one `ja.run_layers` layer with `ja.ValueNoise(σ)`
    (τ small) are `b(ρ) τ` and `s²(ρ) τ`, to 4 standard errors."""
    d, beta, sigma, tau, runs, rho = 5, 1.3, 0.9, 1e-3, 100_000, 0.3
    x1 = jnp.eye(d)[0]
    x2 = rho * x1 + math.sqrt(1 - rho**2) * jnp.eye(d)[1]
    x0 = jnp.broadcast_to(jnp.stack([x1, x2]), (runs, 2, d))
    eye = jnp.eye(d)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=beta)
    ys = ja.run_layers(dyn, x0, 1, tau, noise=ja.ValueNoise(sigma), key=key)
    step = np.asarray(jnp.sum(ys[:, 1, 0] * ys[:, 1, 1], -1)) - rho
    mean, var = step.mean(), step.var()
    s2 = T.antipodal_diffusion(rho, beta, sigma)
    assert abs(mean - T.antipodal_drift(rho, beta, d, sigma) * tau) < 4 * math.sqrt(
        s2 * tau / runs)
    assert abs(var - s2 * tau) < 4 * s2 * tau * math.sqrt(2 / runs)


def test_probability_is_zero_below_the_threshold_and_grows_past_it():
    d, sigma = 4, 1.0
    beta_c = T.antipodal_threshold(d, sigma)
    assert T.antipodal_probability(0.95 * beta_c, d, sigma) == 0.0
    p = [T.antipodal_probability(b, d, sigma) for b in beta_c * np.array([1.05, 1.5, 2, 3])]
    assert 0 < p[0] < p[1] < p[2] < p[3] < 0.5


@pytest.mark.parametrize("beta", [1.2, 2.5])
def test_probability_matches_a_direct_quadrature_in_d3(beta):
    """d = 3: `ρ_0` is uniform on [−1, 1], so the mean of `P(ρ_0)` is
    `∫ S'(ρ)(1 + ρ)/2 dρ / ∫ S'(ρ) dρ`, here by scipy's `quad` in `ρ` itself."""
    from scipy.integrate import quad

    d, sigma = 3, 1.0

    def ratio(r):  # 2b/s² = g(ρ)/(1 − ρ²)
        return 2 * T.antipodal_drift(r, beta, d, sigma) / T.antipodal_diffusion(r, beta, sigma)

    def scale(r):
        return math.exp(-quad(ratio, 0.0, r, limit=200)[0])

    total = quad(scale, -1, 1, limit=200)[0]
    mean = quad(lambda r: scale(r) * (1 + r) / 2, -1, 1, limit=200)[0]
    assert T.antipodal_probability(beta, d, sigma) == pytest.approx(mean / total, abs=2e-4)


@pytest.mark.parametrize("call, message", [
    (lambda: T.antipodal_threshold(1, 1.0), "`d` must be an int ≥ 2"),
    (lambda: T.antipodal_threshold(3.0, 1.0), "`d` must be an int ≥ 2"),
    (lambda: T.antipodal_rate(1.0, 3, 0.0), "`sigma` must be finite and > 0"),
    (lambda: T.antipodal_probability(1.0, 3, -1.0), "`sigma` must be finite and > 0"),
    (lambda: T.antipodal_probability(math.nan, 3, 1.0), "`beta` must be finite"),  # was NaN
    (lambda: T.antipodal_diffusion(0.5, 1.0, math.nan), "`sigma` must be finite and > 0"),
    (lambda: T.layer_diffusion(3, 0.0, 1.0), "`tau` must be finite and > 0"),
    (lambda: T.layer_diffusion(3, 0.1, -1.0), "`sigma` must be finite and > 0"),
    (lambda: T.fit_threshold(np.ones(3), np.ones(4)), "couplings \\(k,\\)"),
    # a NaN coupling was refused in the words of `fit_slope`, which the user did not call
    (lambda: T.fit_threshold([1.0, 2.0, np.nan, 4.0], [1.0, 0.5, 0.0, -1.0]),
     "fit_threshold needs finite couplings"),
    # a cosine outside [−1, 1] gave a drift (−1.93 at ρ = 2)
    (lambda: T.antipodal_drift(2.0, 1.0, 3, 1.0), "must lie in \\[−1, 1\\], got 2.0"),
    (lambda: T.antipodal_diffusion(np.array([0.0, np.nan]), 1.0, 1.0), "got nan"),
])
def test_bad_arguments_are_refused_in_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fit_threshold_finds_where_the_rate_vanishes(seed):
    """Rates drawn around `γ = A(1 − K/K_c)` give `K_c` within three of the fit's
    standard errors, and `A` back; a rising line is no threshold."""
    rng = np.random.default_rng(seed)
    Kc, A, spread = 0.83, 1.7, 0.05
    K = np.linspace(0.7, 1.3, 9) * Kc
    rates = A * (1 - K / Kc)[:, None] + spread * rng.standard_normal((9, 3))
    est, se, a = T.fit_threshold(K, rates)
    assert 0 < se < 0.03 * Kc
    assert abs(est - Kc) < 3 * se
    assert a == pytest.approx(A, rel=0.2)
    assert all(math.isnan(v) for v in T.fit_threshold(K, -rates))
    assert all(math.isnan(v) for v in T.fit_threshold(K[:2], rates[:2]))


@pytest.mark.parametrize("d", [2, 3])
def test_layer_diffusion_is_the_free_layers_decay(seed, d):
    """Tokens started at `e₁` under noisy layers and no interaction (`U = 0`): the
    mean first coordinate after `L` layers is `exp(−(d − 1) σ² D τ L / 2)` with
    `D = layer_diffusion(d, τ, σ)` (0.72 at d = 3, τ = 0.1, σ = √2), not the `τ → 0`
    value nor the first-order `1 − σ²τ(d + 2)/2`."""
    n, systems, tau, L, sigma = 100, 200, 0.1, 8, math.sqrt(2)
    x0 = jnp.zeros((systems, n, d)).at[..., 0].set(1.0)
    eye = jnp.eye(d)[None]
    dyn = ja.SelfAttentionDynamics(eye, 0 * eye, beta=1.0, kernel="usa")
    first = ja.run_layers(dyn, x0, L, tau, observe=lambda x: x[:, 0],
                          noise=ja.TokenNoise(sigma), key=jax.random.PRNGKey(seed))
    first = np.asarray(first)[:, -1].ravel()
    mean, tol = first.mean(), 4 * first.std() / math.sqrt(first.size)
    D = T.layer_diffusion(d, tau, sigma)

    def decay(D):
        return math.exp(-(d - 1) * sigma**2 * D * tau * L / 2)

    assert abs(mean - decay(D)) < tol
    for wrong in (1.0, 1 - sigma**2 * tau * (d + 2) / 2):
        assert abs(mean - decay(wrong)) > tol
    assert T.layer_diffusion(d, 1e-4, sigma) == pytest.approx(
        1 - sigma**2 * 1e-4 * (d + 2) / 2, rel=1e-6)
    # it depends on σ and τ only through σ²τ
    assert T.layer_diffusion(d, tau, 1.0) == pytest.approx(
        T.layer_diffusion(d, tau / 2, sigma), rel=1e-12)


@pytest.mark.parametrize("d", [2, 3, 16])
def test_the_antipodal_threshold_stays_finite_as_the_noise_vanishes(d):
    """β_c = log(√2/σ) + O(σ²) for small σ: the closed form, where (1/σ²)² would
    overflow, meets the exact one to rounding and stays finite down to 5e-324."""
    from jaxattn.theory._antipodal import SMALL_SIGMA

    exact = ja.theory.antipodal_threshold(d, SMALL_SIGMA * 1.01)
    assert math.isclose(exact, math.log(math.sqrt(2) / (SMALL_SIGMA * 1.01)), rel_tol=1e-15)
    for sigma in (1e-80, 2.3e-308, 5e-324):
        beta_c = ja.theory.antipodal_threshold(d, sigma)
        assert math.isclose(beta_c, 0.5 * math.log(2) - math.log(sigma), rel_tol=1e-15), sigma


def test_a_threshold_below_float64s_range_is_refused_not_zero():
    """K_#(β) ~ β^{d/2} e^{−β}: past β ≈ 700 it leaves float64's range; it was returned
    as 0.0 (a coupling threshold of zero), now it is refused in one line."""
    import jaxattn as ja

    assert 0 < ja.theory.noisy_threshold(700.0, 3) < 1e-290
    with pytest.raises(ValueError, match="below float64's smallest normal number"):
        ja.theory.noisy_threshold(1e5, 3)


@pytest.mark.parametrize("beta, d", [(0.5, 384), (5.0, 1000), (1e-12, 50), (3.0, 3), (1.0, 10**5)])
def test_noisy_threshold_at_large_dimensions_against_the_series(beta, d):
    """`K_#(β) = (d/2) / ₀F₁(; d/2 + 1; β²/4)` (the series of `I_{d/2}`), scipy's
    `hyp0f1`: where `ive` underflows (β ≪ d) the threshold was a math domain error."""
    from scipy.special import hyp0f1

    expected = d / 2 / hyp0f1(d / 2 + 1, beta**2 / 4)
    np.testing.assert_allclose(ja.theory.noisy_threshold(beta, d), expected, rtol=1e-9)


@pytest.mark.parametrize("d", [2, 3, 45, 50, 300, 1000, 5000])
def test_noisy_beta_star_solves_its_equation_at_every_dimension(d):
    """`I_{ν+1}(β*)/I_ν(β*) = 1/d` (ν = d/2), the ratio from the series
    `β/(2(ν+1)) ₀F₁(; ν+2; β²/4)/₀F₁(; ν+1; β²/4)`: past d = 45 the root finder
    started from a NaN (0/0 of two underflowed `ive`s)."""
    from scipy.special import hyp0f1

    beta, nu = ja.theory.noisy_beta_star(d), d / 2
    ratio = beta / (2 * (nu + 1)) * hyp0f1(nu + 2, beta**2 / 4) / hyp0f1(nu + 1, beta**2 / 4)
    np.testing.assert_allclose(ratio, 1 / d, rtol=1e-9)
