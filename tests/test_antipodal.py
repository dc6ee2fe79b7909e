"""The `antipodal` experiment's theory (the two-token reduction under the common value
noise, its threshold and its scale function) and its estimators."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments import antipodal as A


@pytest.mark.parametrize("d", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.3])
def test_threshold_is_where_the_antipodal_rate_changes_sign(d, sigma):
    beta_c = A.antipodal_threshold(d, sigma)
    assert beta_c > 0
    assert abs(A.antipodal_rate(beta_c, d, sigma)) < 1e-10
    assert A.antipodal_rate(0.9 * beta_c, d, sigma) > 0 > A.antipodal_rate(1.1 * beta_c, d, sigma)


def test_no_threshold_when_the_noise_alone_holds_antipodes():
    """d = 2, σ = 1.7: the rate is negative at every β > 0, so β_c = 0."""
    sigma = 1.7
    assert A.antipodal_threshold(2, sigma) == 0.0
    assert all(A.antipodal_rate(b, 2, sigma) < 0 for b in (1e-6, 0.5, 3.0))


@pytest.mark.parametrize("d, beta", [(2, 0.3), (4, 1.2), (7, 2.5)])
def test_rates_are_the_log_drifts_of_the_reduced_sde(d, beta):
    """`λ = b'(end) − s²''(end)/2` read off `drift` and `diffusion` by finite
    differences, at both ends."""
    sigma, e = 0.8, 1e-6
    at_minus = A.drift(-1 + e, beta, d, sigma) / e - A.diffusion(-1 + e, beta, sigma) / e**2 / 2
    at_plus = -A.drift(1 - e, beta, d, sigma) / e - A.diffusion(1 - e, beta, sigma) / e**2 / 2
    assert at_minus == pytest.approx(A.antipodal_rate(beta, d, sigma), rel=1e-4, abs=1e-5)
    assert at_plus == pytest.approx(A.consensus_rate(d, sigma), rel=1e-4)


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
    s2 = A.diffusion(rho, beta, sigma)
    assert abs(mean - A.drift(rho, beta, d, sigma) * tau) < 4 * math.sqrt(s2 * tau / runs)
    assert abs(var - s2 * tau) < 4 * s2 * tau * math.sqrt(2 / runs)


def test_probability_is_zero_below_the_threshold_and_grows_past_it():
    d, sigma = 4, 1.0
    beta_c = A.antipodal_threshold(d, sigma)
    assert A.antipodal_probability(0.95 * beta_c, d, sigma) == 0.0
    p = [A.antipodal_probability(b, d, sigma) for b in beta_c * np.array([1.05, 1.5, 2, 3])]
    assert 0 < p[0] < p[1] < p[2] < p[3] < 0.5


@pytest.mark.parametrize("beta", [1.2, 2.5])
def test_probability_matches_a_direct_quadrature_in_d3(beta):
    """d = 3: `ρ_0` is uniform on [−1, 1], so the mean of `P(ρ_0)` is
    `∫ S'(ρ)(1 + ρ)/2 dρ / ∫ S'(ρ) dρ`, here by scipy's `quad` in `ρ` itself."""
    from scipy.integrate import quad

    d, sigma = 3, 1.0

    def ratio(r):  # 2b/s² = g(ρ)/(1 − ρ²)
        return 2 * A.drift(r, beta, d, sigma) / A.diffusion(r, beta, sigma)

    def scale(r):
        return math.exp(-quad(ratio, 0.0, r, limit=200)[0])

    total = quad(scale, -1, 1, limit=200)[0]
    mean = quad(lambda r: scale(r) * (1 + r) / 2, -1, 1, limit=200)[0]
    assert A.antipodal_probability(beta, d, sigma) == pytest.approx(mean / total, abs=2e-4)


def test_pair_start_has_the_asked_gap_on_the_sphere(key):
    x = A.pair_start(key, 7, 5, 1e-4)
    plus, minus = A.gaps(x)
    np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(plus, 1e-4, rtol=1e-8)
    np.testing.assert_allclose(minus, 2 - 1e-4, rtol=1e-12)


def test_formation_reads_clusters_and_antipodal_groups():
    e = np.eye(3)
    small = 1e-3 * e[2]
    ends = np.stack([
        [e[0], e[0] + small, e[0], e[0]],  # one cluster
        [e[0], -e[0], e[0], e[0] - small],  # 1 : 3
        [e[0], -e[0], -e[0] + small, e[0]],  # 2 : 2
        [e[0], e[1], -e[0], e[0]],  # a third direction
        [e[0], -e[0], -e[0], -e[0]],  # 1 : 3, token 0 alone
    ])
    ends /= np.linalg.norm(ends, axis=-1, keepdims=True)
    np.testing.assert_array_equal(A.formation(ends), [0, 1, 2, -1, 1])


def test_zero_crossing_and_standard_error():
    betas = np.array([0.5, 1.0, 1.5, 2.0])
    assert A.zero_crossing(betas, 1.2 - betas) == pytest.approx(1.2)
    assert math.isnan(A.zero_crossing(betas, betas))
    assert A.zero_crossing(betas, -betas) == 0.5
    np.testing.assert_allclose(A.binomial_se([0.5, 0.0, 0.1], 100), [0.05, 0.0, 0.03])


def test_advance_gives_each_run_its_own_noise(key):
    """Two identical starts end apart (their own keys), and the same key repeats."""
    x0 = jnp.broadcast_to(A.pair_start(jax.random.fold_in(key, 1), 1, 3, 0.5), (2, 2, 3))
    first = A.advance(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    again = A.advance(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    np.testing.assert_array_equal(first, again)
    assert float(jnp.max(jnp.abs(first[0] - first[1]))) > 1e-3
    assert first.shape == x0.shape


def test_defaults_run_past_the_thresholds():
    """The default grid starts below and ends above every default dimension's β_c."""
    config = A.Antipodal().defaults()
    betas = A.betas_of(config)
    for d in A.dims_of(config):
        beta_c = A.antipodal_threshold(d, config["sigma"])
        assert betas[0] < beta_c < betas[-1]
