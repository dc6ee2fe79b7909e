"""The model itself: attention, velocity (eq. 6), layer (eq. 4), schedules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_dynamics, random_spd, random_tokens

import jaxattn as ja


def _reference_velocity(P, U, W, beta, causal, x):
    """Eq. (6) written entry by entry with NumPy, independent of the library."""
    x = np.asarray(x)
    n, d = x.shape
    W = np.eye(d) if W is None else np.asarray(W)
    v = np.zeros_like(x)
    for eta in range(P.shape[0]):
        for i in range(n):
            js = range(i + 1) if causal else range(n)
            logits = np.array([beta * x[i] @ P[eta] @ x[j] for j in js])
            a = np.exp(logits - logits.max())
            a /= a.sum()
            for w, j in zip(a, js):
                v[i] += w * (U[eta] @ x[j])
    return v - np.sum(x * (v @ W.T), axis=1, keepdims=True) * x, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("metric", [False, True])
def test_velocity_and_layer_match_formula(key, causal, metric):
    n, d, h = 5, 4, 3
    dyn = random_dynamics(key, h, d, W=metric, causal=causal, beta=1.7)
    x = random_tokens(jax.random.fold_in(key, 1), n, d, dyn.W)
    P, U = np.asarray(dyn.query_key(0.0)), np.asarray(dyn.U(0.0))
    Wn = None if dyn.W is None else np.asarray(dyn.W)
    vel, raw = _reference_velocity(P, U, Wn, 1.7, causal, x)
    np.testing.assert_allclose(dyn.velocity(0.0, x), vel, rtol=1e-10, atol=1e-12)
    tau = 0.3
    y = np.asarray(x) + tau * raw
    norms = np.sqrt(np.sum(y * (y @ (np.eye(d) if Wn is None else Wn).T), axis=1))
    np.testing.assert_allclose(dyn.layer(0.0, x, tau), y / norms[:, None], rtol=1e-10)


def test_velocity_is_tangent(key):
    dyn = random_dynamics(key, 2, 4, W=True)
    x = random_tokens(jax.random.fold_in(key, 1), 6, 4, dyn.W)
    v = dyn.velocity(0.0, x)
    np.testing.assert_allclose(jnp.sum(x * (v @ dyn.W.T), axis=1), 0.0, atol=1e-12)


def test_factored_equals_product(key):
    kq, kk, ku, kx = jax.random.split(key, 4)
    h, k, d, n = 3, 2, 5, 7
    Q = jax.random.normal(kq, (h, k, d))
    K = jax.random.normal(kk, (h, k, d))
    U = jax.random.normal(ku, (h, d, d))
    fac = ja.SelfAttentionDynamics.from_factors(Q, K, U, causal=True)
    full = ja.SelfAttentionDynamics(jnp.einsum("hkd,hke->hde", Q, K), U, causal=True)
    x = random_tokens(kx, n, d)
    np.testing.assert_allclose(fac.velocity(0.0, x), full.velocity(0.0, x), rtol=1e-10)
    assert fac.P is None and fac.Q is not None  # the product is never stored


def test_attention_stable_for_huge_beta(key):
    dyn = random_dynamics(key, 2, 3, beta=1e6, causal=True)
    x = random_tokens(jax.random.fold_in(key, 1), 6, 3)
    A = dyn.attention(0.0, x)
    assert jnp.all(jnp.isfinite(A))
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(jnp.triu(A, 1), 0.0)  # causal mask
    assert jnp.all(jnp.isfinite(ja.run_layers(dyn, x, 5, 0.5)))


def test_piecewise_constant_schedule_selects_layer(key):
    L, h, d, n, tau = 3, 2, 3, 4, 0.1
    Ps = jax.random.normal(key, (L, h, d, d))
    U = jnp.broadcast_to(jnp.eye(d), (h, d, d))
    dyn = ja.SelfAttentionDynamics(ja.PiecewiseConstant(Ps, dt=tau), U)
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d)
    xs = ja.run_layers(dyn, x0, 7, tau)
    x = x0
    for k in range(7):  # layer k uses stack entry k mod L (looped transformer)
        x = ja.SelfAttentionDynamics(Ps[k % L], U).layer(0.0, x, tau)
        np.testing.assert_allclose(xs[k + 1], x, rtol=1e-12)
    held = ja.PiecewiseConstant(Ps, dt=tau, periodic=False)
    np.testing.assert_array_equal(held(10 * tau), Ps[-1])


def test_callable_schedule_and_user_function(key):
    d, h = 3, 1
    base = jax.random.normal(key, (h, d, d))
    sched = ja.Schedule(lambda t, p: jnp.cos(t) * p, base)
    dyn = ja.SelfAttentionDynamics(sched, jnp.eye(d)[None])
    np.testing.assert_allclose(dyn.query_key(0.5), jnp.cos(0.5) * base)
    plain = ja.SelfAttentionDynamics(lambda t: jnp.sin(t) * base, jnp.eye(d)[None])
    np.testing.assert_allclose(plain.query_key(0.5), jnp.sin(0.5) * base)


def test_normalize_and_sample(key):
    W = random_spd(key, 4)
    x = ja.sample_ellipsoid(key, 9, 4, W)
    assert x.shape == (9, 4)
    np.testing.assert_allclose(ja.w_norm(x, W), 1.0, rtol=1e-12)
    y = ja.normalize(3.0 * x, W)
    np.testing.assert_allclose(y, x, rtol=1e-12)
    with jax.enable_x64(False):
        assert ja.sample_ellipsoid(key, 2, 3).dtype == jnp.float32


def test_misalignment_values():
    e1, e2 = jnp.eye(2)
    assert ja.misalignment(jnp.stack([e1, e1, e1])) == pytest.approx(0.0)
    assert ja.misalignment(jnp.stack([e1, -e1])) == pytest.approx(1.0)  # 1 − (1 − 1)/2
    assert ja.misalignment(jnp.stack([e1, e2])) == pytest.approx(0.5)
    batch = jnp.stack([jnp.stack([e1, e2]), jnp.stack([e1, e1])])
    np.testing.assert_allclose(ja.misalignment(batch), [0.5, 0.0])


def test_replace_and_tree_at_keep_the_model_checked():
    """The dataclass `__init__` stays (validation in `__check_init__`): `dataclasses.replace`
    and `eqx.tree_at` give a new model, and `replace` refuses what the constructor does."""
    import dataclasses

    import equinox as eqx

    eye = jnp.eye(3)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=2.0, norm="pre", kernel="sigmoid", bias=0.5)
    hot = dataclasses.replace(dyn, beta=3.0)
    assert float(hot.beta) == 3.0 and float(hot.bias) == 0.5 and isinstance(hot.norm, ja.PreNorm)
    # `replace` passes the init-only `bias=` back as `dyn.bias`: drop it with the sigmoid
    assert isinstance(dataclasses.replace(dyn, kernel="exp", bias=None).kernel, ja.Exp)
    with pytest.raises(ValueError, match="needs kernel='sigmoid'"):
        dataclasses.replace(dyn, kernel="exp")
    assert isinstance(dataclasses.replace(dyn, norm="post").norm, ja.PostNorm)
    assert dyn.with_forward_mode().forward_mode and not dyn.forward_mode
    swapped = eqx.tree_at(lambda m: m.beta, dyn, jnp.asarray(4.0))
    assert float(swapped.beta) == 4.0 and float(dyn.beta) == 2.0
    with pytest.raises(ValueError, match="`beta` must be finite"):
        dataclasses.replace(dyn, beta=float("inf"))
    with pytest.raises(ValueError, match="must be \\(h, d, d\\)"):
        dataclasses.replace(dyn, U=jnp.eye(4)[None])
    with pytest.raises(ValueError, match="`norm` must be one of"):
        dataclasses.replace(dyn, norm="mid")


def test_with_forward_mode_checks_nothing_again():
    """The fields are checked already: in forward mode inside a program (a traced β) no
    check is added, and a stacked model (β batched) keeps its leaves."""
    import equinox as eqx

    eye = jnp.eye(3)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=2.0)
    at = lambda b: eqx.tree_at(lambda m: m.beta, dyn, b)  # noqa: E731
    text = jax.jit(lambda b: at(b).with_forward_mode().velocity(0.0, jnp.eye(3))).lower(
        1.0).as_text()
    assert "callback" not in text
    stacked = jax.vmap(at)(jnp.arange(1.0, 4.0))
    forward = stacked.with_forward_mode()
    assert forward.forward_mode and not stacked.forward_mode
    assert all(a is b for a, b in zip(jax.tree.leaves(forward), jax.tree.leaves(stacked)))
