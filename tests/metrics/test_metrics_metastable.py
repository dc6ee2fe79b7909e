"""The metastable staircase in `ja.metrics`: the interaction energy against its
closed form, the saddle index against the circulant spectrum of equally spaced
points, plateau and jump detection on a synthetic staircase."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

M = ja.metrics


def _circle(angles):
    return jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)


def test_plateaus_of_a_synthetic_staircase():
    ts = np.geomspace(1e-3, 1e9, 241)
    jumps = (1e1, 1e4, 1e8)
    levels = np.array([0.2, 0.35, 0.6, 1.0])
    values = levels[np.searchsorted(jumps, ts)] + 1e-6 * np.sin(np.arange(241))
    stair = M.plateaus(np.concatenate([ts, [np.inf] * 3]), np.concatenate([values, [1.0] * 3]),
                     jump=0.05)
    np.testing.assert_allclose(stair.levels, levels, atol=1e-5)
    assert len(stair.jumps) == 3
    for found, true in zip(stair.jumps, jumps):
        assert abs(math.log10(found / true)) < 0.06  # within one save of the log grid
    assert stair.starts[0] == ts[0] and stair.ends[-1] == ts[-1]


@pytest.mark.parametrize("n, beta", [(5, 2.0), pytest.param(6, 0.3, marks=pytest.mark.slow),
                                     pytest.param(7, 9.0, marks=pytest.mark.slow)])
def test_tangent_hessian_of_equally_spaced_points(n, beta):
    """At `n` equally spaced points on the circle the Hessian of
    `E = (1/n²) Σ_ij e^{β(cos(θ_i − θ_j) − 1)}` in the angles is a circulant
    Laplacian: eigenvalues `(2/n²) Σ_m g''(2πm/n)(1 − cos(2πkm/n))`,
    `g(φ) = e^{β(cos φ − 1)}`."""
    x = _circle(2 * jnp.pi * jnp.arange(n) / n)
    lam = np.sort(np.linalg.eigvalsh(np.asarray(M.tangent_hessian(x, beta))))
    phi = 2 * np.pi * np.arange(1, n) / n
    g2 = beta * (beta * np.sin(phi) ** 2 - np.cos(phi)) * np.exp(beta * (np.cos(phi) - 1))
    k = np.arange(n)[:, None]
    expected = np.sort(2 / n**2 * np.sum(g2 * (1 - np.cos(k * phi)), axis=1))
    np.testing.assert_allclose(lam, expected, atol=1e-12 * max(1.0, np.abs(expected).max()))
    assert M.saddle_index(x, beta) == int(np.sum(expected > 1e-8 * np.abs(expected).max()))


@pytest.mark.slow  # 20 s: float64 Hessians of two configurations
def test_saddle_index_of_clusters_and_of_a_sphere_config():
    """k separated point clusters on the circle: every relative motion of the
    clusters climbs E (index k − 1; the rotation is the zero mode); consensus is the
    maximum (index 0)."""
    x = _circle(jnp.array([0.0, 2.0, 4.0]))
    assert M.saddle_index(x, 10.0, jnp.array([3.0, 2.0, 4.0])) == 2
    assert M.saddle_index(_circle(jnp.array([0.0, 1e-9])), 10.0) == 0
    # a regular tetrahedron on S²: 8 tangent directions, 3 rotations
    tet = jnp.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / math.sqrt(3)
    lam = np.linalg.eigvalsh(np.asarray(M.tangent_hessian(tet, 4.0)))
    assert np.sum(np.abs(lam) < 1e-10) == 3 and M.saddle_index(tet, 4.0) == 5


def test_interaction_energy_closed_form():
    """Three tokens on the circle: `E = (3 + 2g(δ₁) + 2g(δ₂) + 2g(δ₁ − δ₂))/9`,
    `g(φ) = e^{3(cos φ − 1)}`; masses count a token as many; batched by leading axes."""
    x = _circle(jnp.array([0.0, 1e-4, 1.0]))
    E = float(M.interaction_energy(x, 3.0))

    def g(phi):
        return math.exp(3.0 * (math.cos(phi) - 1))

    assert abs(E - (3 + 2 * g(1e-4) + 2 * g(1.0) + 2 * g(1.0 - 1e-4)) / 9) < 1e-12
    doubled = M.interaction_energy(x[jnp.array([0, 0, 1, 2])], 3.0)
    weighted = M.interaction_energy(x, 3.0, jnp.array([2.0, 1.0, 1.0]))
    assert float(doubled) == pytest.approx(float(weighted), rel=1e-14)
    batch = M.interaction_energy(jnp.stack([x, x[::-1]]), 3.0)
    np.testing.assert_allclose(batch, [E, E], rtol=1e-14)
    with pytest.raises(ValueError, match="one mass per token"):
        M.interaction_energy(x, 3.0, jnp.ones(2))


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="one shape"):
        M.plateaus(np.ones(3), np.ones(4), 0.1)
    with pytest.raises(ValueError, match="`jump` must be > 0"):
        M.plateaus(np.ones(3), np.ones(3), 0.0)
    with pytest.raises(ValueError, match="increasing save times"):  # was a silent staircase
        M.plateaus(np.array([0.0, 2.0, 1.0]), np.array([1.0, 0.0, 1.0]), 0.1)
    with pytest.raises(ValueError, match="one configuration"):
        M.tangent_hessian(jnp.ones((2, 3, 2)), 1.0)
    with pytest.raises(ValueError, match="tokens of shape"):
        M.interaction_energy(jnp.ones(3), 1.0)
    x = jnp.eye(3)[:2]
    with pytest.raises(ValueError, match="masses: each ≥ 0, and not all 0"):  # was a number
        M.interaction_energy(x, 1.0, jnp.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="masses: each ≥ 0, and not all 0"):  # was NaN
        M.interaction_energy(x, 1.0, jnp.zeros(2))
    with pytest.raises(ValueError, match="`rtol` must be > 0"):
        M.saddle_index(x, 1.0, rtol=-1.0)
    with pytest.raises(ValueError, match="target cluster count `target` ≥ 1, got 0"):
        M.rescaled_flow(x, 1.0, np.array([0.0, 1.0]), eps=1e-3, target=0)
