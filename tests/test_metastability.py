"""The long-horizon helpers of `metastability` (`jaxattn.experiments.long_time`):
plateau and jump detection, the saddle index against a closed form, the event stop,
the paper's rescaled scheme."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments.long_time import (
    clusters,
    interaction_energy,
    log_grid,
    merged,
    plateaus,
    rescaled_euler,
    saddle_index,
    tangent_hessian,
    two_cluster_time,
)


def test_plateaus_of_a_synthetic_staircase():
    ts = np.geomspace(1e-3, 1e9, 241)
    jumps = (1e1, 1e4, 1e8)
    levels = np.array([0.2, 0.35, 0.6, 1.0])
    values = levels[np.searchsorted(jumps, ts)] + 1e-6 * np.sin(np.arange(241))
    stair = plateaus(np.concatenate([ts, [np.inf] * 3]), np.concatenate([values, [1.0] * 3]),
                     jump=0.05)
    np.testing.assert_allclose(stair.levels, levels, atol=1e-5)
    assert len(stair.jumps) == 3
    for found, true in zip(stair.jumps, jumps):
        assert abs(math.log10(found / true)) < 0.06  # within one save of the log grid
    assert stair.starts[0] == ts[0] and stair.ends[-1] == ts[-1]


def _circle(angles):
    return jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)


@pytest.mark.parametrize("n, beta", [(5, 2.0), pytest.param(6, 0.3, marks=pytest.mark.slow),
                                     pytest.param(7, 9.0, marks=pytest.mark.slow)])
def test_tangent_hessian_of_equally_spaced_points(n, beta):
    """At `n` equally spaced points on the circle the Hessian of
    `E = (1/n²) Σ_ij e^{β(cos(θ_i − θ_j) − 1)}` in the angles is a circulant
    Laplacian: eigenvalues `(2/n²) Σ_m g''(2πm/n)(1 − cos(2πkm/n))`,
    `g(φ) = e^{β(cos φ − 1)}`."""
    x = _circle(2 * jnp.pi * jnp.arange(n) / n)
    lam = np.sort(np.linalg.eigvalsh(np.asarray(tangent_hessian(x, beta))))
    phi = 2 * np.pi * np.arange(1, n) / n
    g2 = beta * (beta * np.sin(phi) ** 2 - np.cos(phi)) * np.exp(beta * (np.cos(phi) - 1))
    k = np.arange(n)[:, None]
    expected = np.sort(2 / n**2 * np.sum(g2 * (1 - np.cos(k * phi)), axis=1))
    np.testing.assert_allclose(lam, expected, atol=1e-12 * max(1.0, np.abs(expected).max()))
    assert saddle_index(x, beta) == int(np.sum(expected > 1e-8 * np.abs(expected).max()))


@pytest.mark.slow  # 20 s: float64 Hessians of two configurations
def test_saddle_index_of_clusters_and_of_a_sphere_config():
    """k separated point clusters on the circle: every relative motion of the
    clusters climbs E (index k − 1; the rotation is the zero mode); consensus is the
    maximum (index 0)."""
    x = _circle(jnp.array([0.0, 2.0, 4.0]))
    assert saddle_index(x, 10.0, jnp.array([3.0, 2.0, 4.0])) == 2
    assert saddle_index(_circle(jnp.array([0.0, 1e-9])), 10.0) == 0
    # a regular tetrahedron on S²: 8 tangent directions, 3 rotations
    tet = jnp.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) / math.sqrt(3)
    lam = np.linalg.eigvalsh(np.asarray(tangent_hessian(tet, 4.0)))
    assert np.sum(np.abs(lam) < 1e-10) == 3 and saddle_index(tet, 4.0) == 5


def test_the_event_stops_at_the_merger():
    x0 = _circle(jnp.array([0.0, 0.3, 2.5]))
    eye = jnp.eye(2)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa")
    ts = jnp.asarray(log_grid(1e-2, 1e3, 40))
    sol = ja.solve_flow(dyn, x0, ts, solution=True, event=merged(1e-2, 2))
    assert bool(sol.event)
    assert ja.metrics.cluster_count(sol.y1, 1e-2) == 2
    after = ts > sol.t1
    assert after.any() and np.all(np.isinf(np.asarray(sol.ts)[np.asarray(after)]))
    kept = np.asarray(sol.ys)[np.asarray(~after)]
    assert np.all(np.asarray(ja.metrics.cluster_count(jnp.asarray(kept), 1e-2)) == 3)


def test_the_horizon_reaches_1e8():
    """Two far clusters on the circle at β = 6 merge near t = n e^{β(1 − cos δ)} /
    (2 β sin² δ) (about 80 here): the saves to 10⁸ log-spaced, the run goes on
    past the merger until the event and the merger's time is the predicted one."""
    x0 = _circle(jnp.array([0.0, 1e-3, 1.6, 1.6 + 1e-3]))
    eye = jnp.eye(2)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=6.0, kernel="usa")
    ts = jnp.asarray(log_grid(1e-3, 1e8, 60))
    sol = ja.solve_flow(dyn, x0, ts, solution=True, event=merged(1e-2, 1), max_steps=10**6)
    assert bool(sol.event) and float(sol.t1) > 10
    log_pred, _ = two_cluster_time(np.asarray(x0), 6.0, 1e-2)
    assert abs(math.log(float(sol.t1)) - log_pred) < 1.0
    # one cluster already: nothing moves, the adaptive steps grow to the horizon
    no_event = ja.solve_flow(dyn, jnp.stack([x0[0], x0[0]]), ts, solution=True)
    assert float(no_event.t1) == 1e8 and np.all(np.isfinite(np.asarray(no_event.ts)))


def test_clusters_and_energy():
    x = _circle(jnp.array([0.0, 1e-4, 1.0]))
    means, masses = clusters(np.asarray(x), 1e-2)
    assert sorted(masses.tolist()) == [1, 2]
    E = float(interaction_energy(x, 3.0))
    def g(phi):
        return math.exp(3.0 * (math.cos(phi) - 1))

    assert abs(E - (3 + 2 * g(1e-4) + 2 * g(1.0) + 2 * g(1.0 - 1e-4)) / 9) < 1e-12


def test_rescaled_euler_matches_the_angle_update():
    """A few steps of the paper's scheme, against the update written out in numpy."""
    beta, lr = 50.0, 1e-3
    theta = np.array([0.0, 0.05, 0.3, 1.0])
    E = np.asarray(rescaled_euler(jnp.asarray(theta), beta, lr, 5))
    for k in range(5):
        d = theta[:, None] - theta[None, :]
        g = np.sum(-np.sin(d) * np.exp(beta * (np.cos(d) - 1)), axis=1) / 16
        theta = theta + lr * np.log(beta) * g / np.linalg.norm(g)
        d = theta[:, None] - theta[None, :]
        assert abs(E[k] - np.sum(np.exp(beta * (np.cos(d) - 1))) / 16) < 1e-13


def test_bad_helper_arguments():
    with pytest.raises(ValueError, match="0 < t_min < t_max"):
        log_grid(1.0, 0.5, 10)
    with pytest.raises(ValueError, match="eps must be > 0"):
        merged(0.0)
