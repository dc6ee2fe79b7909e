"""The searches run as few programs as they can: `stabilize_bipartite` is one program
whatever its step and bounds, and its start is the projection of `w0`; `slow_consensus`
with a `NamedOptimizer` is loaded whole by a new process."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import random_dynamics

import jaxattn as ja
from jaxattn import _programs
from jaxattn.explore import BipartiteWeights
from jaxattn.explore._bipartite import bipartite_log_radius, project_bipartite


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
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


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_a_search_with_a_named_optimizer_is_loaded_whole_by_a_new_process(
        key, folder, monkeypatch):
    """Built-in objectives and `NamedOptimizer` name the search's programs: a new
    process loads them (no `-traced` marker) and gets the bits of the optax optimizer
    object's traced run."""
    dyn = random_dynamics(key, h=2, d=3)
    kw = dict(init=jax.random.fold_in(key, 1), n=4, target="both", steps=2, restarts=2,
              horizon=0.5, saves=4, objective="consensus_time")
    named = ja.explore.NamedOptimizer(optax.adam, learning_rate=0.05)
    first = ja.explore.slow_consensus(dyn, optimizer=named, **kw)
    names = {p.name.rsplit("-", 1)[1] for p in folder.glob("jaxattn_program-*")}
    assert names == {"atime", "cache"}  # every program kept, none traced
    loads = []

    def listen(event, seconds, fun_name=None, **_):
        if event == _programs.LOAD_EVENT:
            loads.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    monkeypatch.setattr(_programs, "_LOADED", {})  # a new process: only the folder
    try:
        again = ja.explore.slow_consensus(dyn, optimizer=named, **kw)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert {"_start_tokens", "_starts", "_run_chunk", "_finish"} <= set(loads)
    np.testing.assert_array_equal(again.trace, first.trace)
    monkeypatch.setattr(_programs, "ENABLED", False)  # the traced programs
    closure = ja.explore.slow_consensus(dyn, optimizer=optax.adam(0.05), **kw)
    np.testing.assert_allclose(closure.trace, first.trace, rtol=1e-12)
    np.testing.assert_allclose(closure.x0, first.x0, rtol=1e-12)
