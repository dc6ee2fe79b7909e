"""The long-horizon helpers of `metastability` (`jaxattn.experiments.long_time`): the
event stop, the horizon to 10⁸, the clusters as point masses, the paper's rescaled
scheme (the energy, its saddles and the staircase are `ja.metrics`'s:
tests/test_metrics_metastable.py)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments.long_time import (
    clusters,
    log_grid,
    merged,
    rescaled_euler,
    two_cluster_time,
)


def _circle(angles):
    return jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-1)


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


def test_clusters_as_point_masses():
    """Three tokens, two within `eps`: two clusters of 1 and 2 tokens, each mean
    direction a unit vector (the pair's bisector), the same clusters as
    `ja.metrics.cluster_labels`."""
    x = _circle(jnp.array([0.0, 1e-4, 1.0]))
    means, masses = clusters(np.asarray(x), 1e-2)
    assert masses.tolist() == [2, 1]
    np.testing.assert_allclose(means, np.asarray(_circle(jnp.array([5e-5, 1.0]))),
                               rtol=0, atol=1e-15)
    assert ja.metrics.cluster_labels(x, 1e-2).tolist() == [0, 0, 2]


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
