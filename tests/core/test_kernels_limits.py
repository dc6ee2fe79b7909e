"""The kernels at the edges of β: no overflow up to β = 10⁴ (softmax, `usa`,
hardmax, every path), `usa` as the `exp` dynamics in time rescaled by e^β, the
hardmax limit and its ties, and the one-line refusal of an overflowing `exp`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

BETAS = (1e-3, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4)


def _tokens(key, shape, dtype):
    x = jax.random.normal(jax.random.PRNGKey(key), shape, dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _weights(d, dtype):
    P = jnp.eye(d, dtype=dtype)[None]
    U = (jnp.eye(d, dtype=dtype) + 0.3 * jax.random.normal(jax.random.PRNGKey(7), (d, d),
                                                           dtype))[None]
    return P, U


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.float64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kernel", ["softmax", "usa", "hardmax"])
def test_no_nan_or_inf_for_beta_up_to_ten_thousand_on_every_path(kernel, dtype):
    P, U = _weights(3, dtype)
    x = _tokens(1, (8, 12, 3), dtype)  # a batch of small systems: the fused path
    ts = jnp.asarray([0.0, 0.5], dtype)
    for beta in BETAS:
        dense = ja.SelfAttentionDynamics(P, U, beta=beta, kernel=kernel)
        blocked = ja.SelfAttentionDynamics(P, U, beta=beta, kernel=kernel, block_size=5)
        runs = {
            "fused": ja.run_layers(dense, x, 3, 0.2, strategy="fused"),
            "general": ja.run_layers(dense, x, 3, 0.2, strategy="general"),
            "blocked": ja.run_layers(blocked, x, 3, 0.2),
            "flow": ja.solve_flow(dense, x[:2], ts, rtol=1e-4, atol=1e-6),
            "blocked flow": ja.solve_flow(blocked, x[0], ts, rtol=1e-4, atol=1e-6),
        }
        for path, ys in runs.items():
            assert bool(jnp.all(jnp.isfinite(ys))), (beta, path)


def test_usa_is_exp_in_time_rescaled_by_e_to_the_beta():
    P, U = _weights(3, jnp.float64)
    x = _tokens(2, (9, 3), jnp.float64)
    for beta in (0.5, 3.0, 20.0):
        exp = ja.SelfAttentionDynamics(P, U, beta=beta, kernel="exp", causal=True)
        usa = ja.SelfAttentionDynamics(P, U, beta=beta, kernel="usa", causal=True)
        v_exp, v_usa = exp.velocity(0.0, x), usa.velocity(0.0, x)
        # A velocity is a sum of O(|v|) terms: its rounding scales with the largest entry.
        np.testing.assert_allclose(np.exp(beta) * v_usa, v_exp, rtol=1e-13,
                                   atol=1e-13 * np.abs(v_exp).max())
        blocked = ja.SelfAttentionDynamics(P, U, beta=beta, kernel="usa", causal=True,
                                           block_size=4)
        np.testing.assert_allclose(blocked.velocity(0.0, x), v_usa, rtol=1e-12, atol=1e-300)


def test_an_overflowing_exp_kernel_names_usa():
    P, U = _weights(3, jnp.float32)
    dyn = ja.SelfAttentionDynamics(P, U, beta=1e3, kernel="exp")
    with pytest.raises(ValueError, match="kernel='usa'"):
        ja.run_layers(dyn, _tokens(3, (6, 3), jnp.float32), 2, 0.1)


def test_hardmax_splits_ties_equally():
    # P = −I: each token attends to the tokens farthest from it. Token 0 has two at
    # exactly the same distance (x₁ and x₂ are mirror images), so each gets 1/2.
    a, b = 0.6, 0.8
    x = jnp.asarray([[1.0, 0.0], [-a, b], [-a, -b]], jnp.float64)
    P = -jnp.eye(2, dtype=jnp.float64)[None]
    for block_size in (None, 1, 2):
        dyn = ja.SelfAttentionDynamics(P, jnp.eye(2, dtype=jnp.float64)[None],
                                       kernel="hardmax", block_size=block_size)
        np.testing.assert_allclose(dyn.raw_update(0.0, x)[0], [-a, 0.0], atol=1e-15)
    A = ja.SelfAttentionDynamics(P, jnp.eye(2)[None], kernel="hardmax").attention(0.0, x)
    np.testing.assert_array_equal(A[0, 0], [0.0, 0.5, 0.5])


def test_softmax_approaches_hardmax_as_beta_grows():
    d = 4
    P = jax.random.normal(jax.random.PRNGKey(5), (1, d, d), jnp.float64) / 2
    U = jnp.eye(d, dtype=jnp.float64)[None]
    x = _tokens(1, (23, d), jnp.float64)
    hard = ja.SelfAttentionDynamics(P, U, kernel="hardmax").raw_update(0.0, x)
    errors = [float(jnp.max(jnp.abs(ja.SelfAttentionDynamics(P, U, beta=b).raw_update(0.0, x)
                                    - hard))) for b in (1e1, 1e2, 1e3, 1e4)]
    assert all(e2 < e1 for e1, e2 in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-3, errors


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_an_implicit_solver_reaches_metastable_horizons():
    """`solve_flow` with an implicit solver (the retraction wraps it): the usa flow of 8
    tokens at β = 20 reaches t = 10¹⁰ on the circle (~10⁴ steps), where the
    stiff modes inside the clusters hold an explicit solver to steps of ~1."""
    import diffrax

    x = _tokens(0, (8, 2), jnp.float64)
    eye = jnp.eye(2, dtype=jnp.float64)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=20.0, kernel="usa")
    ts = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-2, 1e10, 25)])
    sol = ja.solve_flow(dyn, x, ts, solver=diffrax.Kvaerno3(), rtol=1e-6, atol=1e-9,
                        max_steps=100_000, solution=True)
    assert bool(jnp.all(jnp.isfinite(sol.ys)))
    np.testing.assert_allclose(jnp.linalg.norm(sol.ys, axis=-1), 1.0, atol=1e-12)
    counts = np.asarray(ja.metrics.cluster_count(sol.ys, 1e-3))
    assert counts[0] == 8 and counts[-1] < 8 and np.all(np.diff(counts) <= 0)
