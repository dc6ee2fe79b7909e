"""σ, β and τ batch: `jax.vmap` over a vector of each runs one compiled program (traced
once) whose results equal the per-value loop to rounding."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_tokens

import jaxattn as ja

N, D, LAYERS = 5, 3, 4


def _counting_model(key, traces, beta=1.0):
    """A model whose `P` schedule records each trace of the program that reads it."""
    P = jax.random.normal(key, (2, D, D)) / np.sqrt(D)
    U = jax.random.normal(jax.random.fold_in(key, 1), (2, D, D)) / np.sqrt(D)

    def P_of_t(t, P):
        traces.append(1)  # Python runs only while JAX traces
        return P

    return ja.SelfAttentionDynamics(ja.Schedule(P_of_t, P), U, beta=beta)


def _check_batched(run, values, traces, grow=True):
    """`jax.vmap(run)(values)` equals `[run(v) for v in values]` to rounding, and is one
    program: not traced again for new values of the same shape, and (`grow`) traced
    no more for 6 values than for 3 (never once per value)."""
    traces.clear()
    batched = jax.vmap(run)(values)
    once = len(traces)
    assert once >= 1
    traces.clear()
    jax.vmap(run)(values[::-1] * 0.9)
    assert not traces, "new values of the same shape traced the program again"
    if grow:  # another batch size: another compilation, the same traces
        jax.vmap(run)(jnp.concatenate([values, values * 1.1]))
    assert len(traces) <= once, f"6 values traced {len(traces)} times, 3 values {once}"
    for i, v in enumerate(values):
        np.testing.assert_allclose(batched[i], run(v), rtol=1e-12, atol=1e-13)


@pytest.fixture
def x0(key):
    return random_tokens(jax.random.fold_in(key, 7), N, D)


def test_vmap_over_tau_in_run_layers(key, x0):
    traces = []
    dyn = _counting_model(key, traces)
    _check_batched(lambda tau: ja.run_layers(dyn, x0, LAYERS, tau),
                   jnp.array([0.05, 0.2, 0.7]), traces)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_vmap_over_beta_in_run_layers_and_solve_flow(key, x0):
    betas = jnp.array([0.3, 1.0, 4.0])
    traces = []
    base = _counting_model(key, traces)

    def model(beta):  # the leaf swapped: building a model traces its schedules' shapes
        return eqx.tree_at(lambda m: m.beta, base, jnp.asarray(beta, base.beta.dtype))

    _check_batched(lambda b: ja.run_layers(model(b), x0, LAYERS, 0.2), betas, traces)
    traces.clear()
    ts = jnp.array([0.0, 0.5])
    _check_batched(lambda b: ja.solve_flow(model(b), x0, ts, rtol=1e-9, atol=1e-11), betas,
                   traces, grow=False)
    # The model built from a traced β is the same batch; β changes the run (the batch
    # is not one result repeated).
    out = jax.vmap(lambda b: ja.run_layers(model(b), x0, LAYERS, 0.2))(betas)
    built = jax.vmap(lambda b: ja.run_layers(
        ja.SelfAttentionDynamics(base.P, base.U, beta=b), x0, LAYERS, 0.2))(betas)
    np.testing.assert_array_equal(built, out)
    assert float(jnp.max(jnp.abs(out[0, -1] - out[-1, -1]))) > 1e-3


@pytest.mark.parametrize("noise", [ja.TokenNoise, ja.ValueNoise])
def test_vmap_over_sigma_in_noisy_layers(key, x0, noise):
    traces = []
    dyn = _counting_model(key, traces)
    noise_key = jax.random.fold_in(key, 3)
    sigmas = jnp.array([0.0, 0.1, 0.5])
    _check_batched(lambda s: ja.run_layers(dyn, x0, LAYERS, 0.1, noise=noise(s), key=noise_key),
                   sigmas, traces)
    # σ = 0 is the deterministic run, to rounding.
    np.testing.assert_allclose(
        jax.vmap(lambda s: ja.run_layers(dyn, x0, LAYERS, 0.1, noise=noise(s),
                                         key=noise_key))(sigmas)[0],
        ja.run_layers(dyn, x0, LAYERS, 0.1), rtol=1e-12, atol=1e-13)


@pytest.mark.slow  # compiles diffrax's SDE solve batched and unbatched (~20 s)
def test_vmap_over_sigma_in_noisy_flow(key, x0):
    traces = []
    dyn = _counting_model(key, traces)
    ts = jnp.array([0.0, 0.5])
    _check_batched(lambda s: ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(s), dt0=0.1,
                                           key=jax.random.fold_in(key, 3)),
                   jnp.array([0.0, 0.2, 0.6]), traces, grow=False)


def test_traced_values_are_still_checked(key, x0):
    dyn = ja.random_dynamics(key, 2, D)
    with pytest.raises(ValueError, match="`tau` must be finite and > 0"):
        jax.vmap(lambda t: ja.run_layers(dyn, x0, 2, t))(jnp.array([0.1, -0.1]))
    # Built op by op under `vmap` (outside any entry point): equinox's runtime error.
    with pytest.raises(eqx.EquinoxRuntimeError, match="`sigma` must be ≥ 0"):
        jax.vmap(lambda s: ja.run_layers(dyn, x0, 2, 0.1, noise=ja.TokenNoise(s),
                                         key=jax.random.key(0)))(jnp.array([0.1, -0.1]))
