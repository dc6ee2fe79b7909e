"""Gradients through `run_layers` and `solve_flow` against central finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_tokens

import jaxattn as ja


def _directional_fd(f, x, v, h):
    return (f(x + h * v) - f(x - h * v)) / (2 * h)


def _check(f, args, h, rtol, key):
    """Directional derivatives of `f` along random directions of each argument."""
    grads = jax.grad(f, argnums=tuple(range(len(args))))(*args)
    for i, (a, g) in enumerate(zip(args, grads)):
        for j in range(2):
            v = jax.random.normal(jax.random.fold_in(key, 10 * i + j), a.shape)
            def fi(ai):
                return f(*args[:i], ai, *args[i + 1 :])
            fd = _directional_fd(fi, a, v, h)
            ad = jnp.vdot(g, v)
            print(f"arg {i}: autodiff {float(ad):.10e}, finite difference {float(fd):.10e}")
            assert abs(ad - fd) <= rtol * abs(fd)


def _problem(key, n=5, d=3, h=2):
    kP, kU, kx, kq = jax.random.split(key, 4)
    P = jax.random.normal(kP, (h, d, d))
    U = 0.8 * jax.random.normal(kU, (h, d, d))
    x0 = random_tokens(kx, n, d)
    omega = jnp.array(2.0)
    return P, U, x0, omega


def _oscillating(t, params):
    P, omega = params
    return P * jnp.cos(omega * t)


def _schedule_dyn(P, U, omega, causal):
    # One function object for every call: a new lambda each time would recompile.
    sched = ja.Schedule(_oscillating, (P, omega))
    return ja.SelfAttentionDynamics(sched, U, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_grad_run_layers_matches_finite_differences(key, causal):
    P, U, x0, omega = _problem(key)

    def loss(x0, P, U, omega):
        dyn = _schedule_dyn(P, U, omega, causal)
        return ja.misalignment(ja.run_layers(dyn, x0, 10, 0.1)[-1])

    _check(loss, (x0, P, U, omega), 1e-6, 1e-5, key)


@pytest.mark.slow  # warm: over ~5 s (adaptive solves at rtol 1e-12; make test stays the fast loop)
@pytest.mark.parametrize("causal", [False, True])
def test_grad_solve_flow_matches_finite_differences(key, causal):
    P, U, x0, omega = _problem(key)
    ts = jnp.array([0.0, 1.0])

    def loss(x0, P, U, omega):
        dyn = _schedule_dyn(P, U, omega, causal)
        return ja.misalignment(ja.solve_flow(dyn, x0, ts, rtol=1e-12, atol=1e-13)[-1])

    _check(loss, (x0, P, U, omega), 1e-4, 1e-5, key)


def test_grad_through_batched_and_jitted(key):
    P, U, _, _ = _problem(key)
    xb = random_tokens(key, 5, 3, batch=(4,))
    dyn = ja.SelfAttentionDynamics(P, U)

    @jax.jit
    def loss(xb):
        return ja.misalignment(ja.run_layers(dyn, xb, 10, 0.2)[:, -1]).sum()

    g = jax.grad(loss)(xb)
    g_loop = jnp.stack([jax.grad(lambda x: ja.misalignment(ja.run_layers(dyn, x, 10, 0.2)[-1]))(x)
                        for x in xb])
    np.testing.assert_allclose(g, g_loop, rtol=1e-10, atol=1e-14)


def test_layer_gradient_memory_is_checkpointed(key):
    """Reverse mode keeps each layer's tokens, not its (h, n, n) attention matrices."""
    h, n, d = 4, 64, 4
    P, U, _, _ = _problem(key, n, d, h)
    x0 = random_tokens(key, n, d)
    dyn = ja.SelfAttentionDynamics(P, U)

    def temp_bytes(L):
        f = jax.jit(jax.grad(lambda x: ja.misalignment(ja.run_layers(dyn, x, L, 0.1)[-1])))
        return f.lower(x0).compile().memory_analysis().temp_size_in_bytes

    per_layer = (temp_bytes(400) - temp_bytes(100)) / 300
    attention_bytes = h * n * n * x0.dtype.itemsize
    print(f"gradient memory per layer: {per_layer:.0f} B; attention: {attention_bytes} B")
    assert per_layer < 0.25 * attention_bytes
