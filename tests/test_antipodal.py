"""The `antipodal` experiment's set-up and estimators (its theory, the two-token
reduction, is `ja.theory`'s: tests/test_theory_noise.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments import antipodal as A


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


def test_noisy_layers_give_each_run_its_own_noise(key):
    """Two identical starts end apart (their own keys), and the same key repeats."""
    x0 = jnp.broadcast_to(A.pair_start(jax.random.fold_in(key, 1), 1, 3, 0.5), (2, 2, 3))
    first = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    again = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    np.testing.assert_array_equal(first, again)
    # in pieces as in one call: each piece's key is fold_in(key, piece)
    one = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=30)
    eye = jnp.eye(3)[None]
    direct = ja.run_layers(ja.SelfAttentionDynamics(eye, eye, beta=2.0), x0, 30, 0.05,
                           noise=ja.ValueNoise(1.0), key=jax.random.fold_in(key, 0))[:, -1]
    np.testing.assert_array_equal(one, direct)
    assert float(jnp.max(jnp.abs(first[0] - first[1]))) > 1e-3
    assert first.shape == x0.shape


def test_defaults_run_past_the_thresholds():
    """The default grid starts below and ends above every default dimension's β_c."""
    config = A.Antipodal().defaults()
    betas = A.betas_of(config)
    for d in A.dims_of(config):
        beta_c = ja.theory.antipodal_threshold(d, config["sigma"])
        assert betas[0] < beta_c < betas[-1]
