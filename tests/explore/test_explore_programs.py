"""The searches run as few programs as they can: `stabilize_bipartite` is one program
whatever its step and bounds, and its start is the projection of `w0`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxattn as ja
from jaxattn.explore import BipartiteWeights
from jaxattn.explore._bipartite import bipartite_log_radius, project_bipartite


def test_stabilize_bipartite_is_one_program(key, compiles):
    k1, k2 = jax.random.split(key)
    w0 = BipartiteWeights(jax.random.normal(k1, (4, 2, 3, 3)), jax.random.normal(k2, (4, 2, 3, 3)))
    v = np.array([0.0, 1.0, 0.0])
    adam = optax.adam(0.02)
    ja.explore.stabilize_bipartite(w0, v, n=5, m=2, steps=3, optimizer=adam)
    assert compiles[0] > 0  # the counter sees programs
    first = compiles[0]
    w, trace, viol = ja.explore.stabilize_bipartite(w0, v, n=5, m=2, steps=3, tau=0.7,
                                                    p_bound=4.0, u_bound=2.0, optimizer=adam)
    assert compiles[0] == first  # a new step and new bounds: the same program
    assert trace.shape == viol.shape == (4, 4)
    # row 0: the radius at the projected start
    start = jax.vmap(lambda w: project_bipartite(w, jnp.asarray(v), 4.0, 2.0))(w0)
    expected = jax.vmap(lambda w: bipartite_log_radius(w, jnp.asarray(v), 5, 2, 0.7))(start)
    np.testing.assert_allclose(trace[0], expected, rtol=1e-12)
