"""jit, vmap and grad compose; batches equal per-sample loops; no recompilation;
dtypes follow the x64 setting."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_dynamics, random_tokens

import jaxattn as ja


def test_batched_equals_loop(key):
    dyn = random_dynamics(key, 2, 3, W=True, causal=True)
    xb = random_tokens(jax.random.fold_in(key, 1), 5, 3, dyn.W, batch=(2, 3))
    ts = jnp.linspace(0.0, 2.0, 4)
    layers = ja.run_layers(dyn, xb, 6, 0.2)
    flows = ja.solve_flow(dyn, xb, ts)
    assert layers.shape == (2, 3, 7, 5, 3) and flows.shape == (2, 3, 4, 5, 3)
    for i in range(2):
        for j in range(3):
            one = ja.run_layers(dyn, xb[i, j], 6, 0.2)
            np.testing.assert_allclose(layers[i, j], one, rtol=1e-12)
            np.testing.assert_allclose(flows[i, j], ja.solve_flow(dyn, xb[i, j], ts), rtol=1e-9)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_vmap_over_stacked_weights(key):
    h, d, n, B = 2, 3, 4, 5
    Ps = jax.random.normal(key, (B, h, d, d))
    U = jnp.broadcast_to(jnp.eye(d), (h, d, d))
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d)
    stacked = eqx.filter_vmap(lambda P: ja.SelfAttentionDynamics(P, U))(Ps)
    out = eqx.filter_vmap(lambda dyn: ja.run_layers(dyn, x0, 4, 0.5))(stacked)
    flow = eqx.filter_vmap(lambda dyn: ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0])))(stacked)
    for b in range(B):
        dyn = ja.SelfAttentionDynamics(Ps[b], U)
        np.testing.assert_allclose(out[b], ja.run_layers(dyn, x0, 4, 0.5), rtol=1e-12)
        one = ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]))
        np.testing.assert_allclose(flow[b], one, rtol=1e-9)


@pytest.mark.slow  # compiles every transform of both simulators
def test_jit_vmap_grad_compose(key):
    dyn = random_dynamics(key, 2, 3)
    xb = random_tokens(jax.random.fold_in(key, 1), 4, 3, batch=(3,))

    def loss(P, x):
        d = ja.SelfAttentionDynamics(P, dyn.U.value)
        return ja.misalignment(ja.solve_flow(d, x, jnp.array([0.0, 0.5]))[-1])

    P = dyn.query_key(0.0)
    g = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))(P, xb)
    assert g.shape == (3,) + P.shape
    for b in range(3):
        np.testing.assert_allclose(g[b], jax.grad(loss)(P, xb[b]), rtol=1e-9)


def test_no_recompilation_on_second_call(key):
    traces = []

    def P_of_t(t, P):
        traces.append(1)  # runs only when JAX traces the schedule
        return P

    dyn = ja.SelfAttentionDynamics(ja.Schedule(P_of_t, jax.random.normal(key, (2, 3, 3))),
                                   jnp.broadcast_to(jnp.eye(3), (2, 3, 3)))
    x1 = random_tokens(key, 5, 3, batch=(2,))
    x2 = random_tokens(jax.random.fold_in(key, 1), 5, 3, batch=(2,))
    ts = jnp.linspace(0.0, 1.0, 3)
    for run in (lambda x, tau: ja.run_layers(dyn, x, 4, tau),
                lambda x, tau: ja.solve_flow(dyn, x, ts * tau)):
        run(x1, 0.1)
        before = len(traces)
        run(x2, 0.2)  # new values, same shapes: no new trace
        assert len(traces) == before


def test_dtypes(key):
    with jax.enable_x64(False):
        dyn = random_dynamics(key, 1, 3)
        x0 = ja.sample_ellipsoid(key, 4, 3)
        assert ja.run_layers(dyn, x0, 2, 0.1).dtype == jnp.float32
        assert ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0])).dtype == jnp.float32
    dyn = random_dynamics(key, 1, 3)
    x0 = ja.sample_ellipsoid(key, 4, 3)
    assert x0.dtype == jnp.float64
    assert ja.run_layers(dyn, x0, 2, 0.1).dtype == jnp.float64
    ints = ja.run_layers(dyn, jnp.ones((4, 3), dtype=jnp.int32), 1, 0.1)
    assert jnp.issubdtype(ints.dtype, jnp.floating)


def test_off_manifold_input_is_normalised(key):
    dyn = random_dynamics(key, 1, 3, W=True)
    x0 = random_tokens(key, 4, 3, dyn.W)
    np.testing.assert_allclose(ja.run_layers(dyn, 5.0 * x0, 3, 0.1),
                               ja.run_layers(dyn, x0, 3, 0.1), rtol=1e-12)
