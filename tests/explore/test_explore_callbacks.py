"""The searches' programs hold no host callback (JAX's persistent cache keeps no program
that holds one): `slow_consensus`'s starts, steps and evaluations, `consensus_objective` and
`compare_adjoints` of concrete tokens, checked on the host with the messages the
in-program checks of traced tokens give."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_dynamics, random_tokens

import jaxattn as ja
from jaxattn._flow import solve_flow_unchecked
from jaxattn.explore import _objectives, _search

E = ja.explore
#: The custom calls of JAX's host callbacks (pure_callback, io_callback, debug).
CALLBACK_TARGETS = ("xla_python_cpu_callback", "xla_ffi_python_cpu_callback",
                    "xla_python_gpu_callback", "xla_ffi_python_gpu_callback")
SEARCH = dict(steps=2, restarts=2, horizon=0.5, saves=4, baseline_samples=2)


def callbacks(text: str) -> int:
    return sum(text.count(target) for target in CALLBACK_TARGETS)


@pytest.fixture
def lowered(monkeypatch):
    """`{name: [callbacks in each lowered program]}` of the search's jitted functions,
    recorded while the test calls them."""
    found = {}
    for module, name in ((_search, "_start_tokens"), (_search, "_starts"),
                         (_search, "_run_chunk"), (_search, "_evaluate"),
                         (_objectives, "_objective_jit")):
        def recording(*args, jitted=getattr(module, name), name=name, **kwargs):
            found.setdefault(name, []).append(callbacks(jitted.lower(*args, **kwargs).as_text()))
            return jitted(*args, **kwargs)

        monkeypatch.setattr(module, name, recording)
    return found


@pytest.fixture
def system(key):
    return random_dynamics(key, h=2, d=3), random_tokens(jax.random.fold_in(key, 1), 4, 3)


@pytest.mark.parametrize("model, target", [  # flow-both: over ~4 s warm (slow tier)
    pytest.param("flow", "both", marks=pytest.mark.slow), ("layers", "tokens")])
def test_search_programs_hold_no_callback(lowered, key, system, model, target):
    dyn, _ = system
    res = E.slow_consensus(dyn, init=key, n=4, model=model, target=target, **SEARCH)
    assert np.isfinite(res.value)
    assert set(lowered) == {"_start_tokens", "_starts", "_run_chunk", "_evaluate"}
    assert lowered == {name: [0] * len(counts) for name, counts in lowered.items()}


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_objective_and_adjoints_of_concrete_tokens_hold_no_callback(lowered, system):
    dyn, x0 = system
    kw = dict(horizon=0.5, saves=4)
    value = E.consensus_objective(dyn, x0, **kw)
    out = E.compare_adjoints(dyn, x0, **kw)
    assert lowered["_objective_jit"] == [0, 0, 0]  # the value, two gradients
    # the same value and gradient as a traced run (checks inside, a callback each)
    traced = jax.jit(jax.value_and_grad(lambda x: E.consensus_objective(dyn, x, **kw)))(x0)
    assert lowered["_objective_jit"][3] > 0
    np.testing.assert_allclose(value, traced[0], rtol=1e-12)
    np.testing.assert_allclose(out["checkpoint"], traced[1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
@pytest.mark.parametrize("bad, message", [
    (np.nan, "initial tokens contain NaN or inf"),
    (0.0, "an initial token is zero"),
])
def test_bad_tokens_keep_their_message(system, traced, bad, message):
    dyn, x0 = system
    x0 = x0.at[1].set(bad)
    kw = dict(horizon=0.5, saves=4)
    run = (lambda: jax.jit(lambda x: E.consensus_objective(dyn, x, **kw))(x0)) if traced \
        else (lambda: E.consensus_objective(dyn, x0, **kw))
    # inside a user's jit the in-program check raises equinox's error, with the message
    with pytest.raises(Exception if traced else ja.SimulationError, match=message):
        run()
    if not traced:
        with pytest.raises(ja.SimulationError, match=message):
            E.compare_adjoints(dyn, x0, **kw)


def test_unchecked_flow_saves_where_the_checked_flow_does(system):
    """`CheckedTimes` hands diffeqsolve's loop the times it was given: the same steps
    and saves as `solve_flow`'s checked program (diffrax's solve inside a `jit`)."""
    dyn, x0 = system
    ts = jnp.array([0.0, 0.1, 0.1, 0.7, 1.5])  # a repeated time too
    out = solve_flow_unchecked(dyn, x0, ts)
    checked = jax.jit(lambda x: ja.solve_flow(dyn, x, ts, throw=False))(x0)
    np.testing.assert_array_equal(out.num_steps, checked.num_steps)
    np.testing.assert_allclose(out.ys, checked.ys, rtol=0, atol=1e-12)
