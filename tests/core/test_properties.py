"""Property-based tests of the core API: every input either works, giving finite
tokens on the ellipsoid, or raises the documented error. No NaN escapes."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxattn as ja

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
# Errors the API documents: shapes/values rejected up front, value errors inside jit.
DOCUMENTED = (ValueError, TypeError, eqx.EquinoxRuntimeError)

sizes = st.tuples(st.sampled_from([1, 2, 5]), st.sampled_from([1, 3, 4]),
                  st.sampled_from([1, 2]))
scales = st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e3, 1e30])
specials = st.sampled_from(["none", "zero_token", "nan", "inf", "huge_token"])


def _weights(seed, h, d, scale_P, scale_U):
    rng = np.random.default_rng(seed)
    return (scale_P * rng.standard_normal((h, d, d)), scale_U * rng.standard_normal((h, d, d)))


def _tokens(seed, n, d, special):
    x = np.random.default_rng(seed + 1).standard_normal((2, n, d))
    if special == "zero_token":
        x[1, 0] = 0.0
    elif special in ("nan", "inf"):
        x[0, -1, 0] = np.nan if special == "nan" else np.inf
    elif special == "huge_token":
        x[0, 0] *= 1e300
    return x


def _on_manifold(out, W):
    out = np.asarray(out)
    assert np.all(np.isfinite(out))
    norms = np.asarray(ja.w_norm(jnp.asarray(out), W))
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@SETTINGS
@given(sizes=sizes, sP=scales, sU=scales, beta=st.sampled_from([0.0, -2.0, 1.0, 1e6, 1e30]),
       tau=st.sampled_from([1e-30, 0.1, 1.0, 1e30]), special=specials, causal=st.booleans(),
       seed=st.integers(0, 2**16), x64=st.booleans())
def test_run_layers_works_or_raises(sizes, sP, sU, beta, tau, special, causal, seed, x64):
    n, d, h = sizes
    P, U = _weights(seed, h, d, sP, sU)
    x0 = _tokens(seed, n, d, special)
    try:
        with jax.enable_x64(x64):  # float32 is where large weights overflow
            dyn = ja.SelfAttentionDynamics(P, U, beta=beta, causal=causal)
            out = jax.block_until_ready(ja.run_layers(dyn, x0, 3, tau))
    except DOCUMENTED as e:
        msg = str(e)
        assert special in ("zero_token", "nan", "inf") or "NaN or inf" in msg, msg
        return
    assert special not in ("zero_token", "nan", "inf"), "bad tokens were accepted"
    _on_manifold(out, None)


@SETTINGS
@given(sizes=sizes, sP=scales, sU=st.sampled_from([0.0, 1e-3, 1.0, 10.0]), special=specials,
       causal=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.slow  # hypothesis over adaptive solves
def test_solve_flow_works_or_raises(sizes, sP, sU, special, causal, seed):
    n, d, h = sizes
    P, U = _weights(seed, h, d, sP, sU)
    dyn = ja.SelfAttentionDynamics(P, U, causal=causal)
    x0 = _tokens(seed, n, d, special)
    ts = jnp.array([0.0, 0.5, 1.0])
    try:
        res = ja.solve_flow(dyn, x0, ts, throw=False, max_steps=2000)
        jax.block_until_ready(res.ys)
    except DOCUMENTED:
        assert special in ("zero_token", "nan", "inf")
        return
    assert special not in ("zero_token", "nan", "inf"), "bad tokens were accepted"
    ys = np.asarray(res.ys)[np.asarray(res.success)]
    if ys.size:
        _on_manifold(ys, None)
    # A failed sample is reported, never returned as a success with NaN in it.
    assert np.all(np.isfinite(ys))


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@SETTINGS
@given(d=st.sampled_from([1, 2, 3, 5]), kind=st.sampled_from(
    ["spd", "singular", "indefinite", "nonsymmetric", "huge", "tiny", "nan"]),
    seed=st.integers(0, 2**16))
def test_metrics_W(d, kind, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, d))
    W = {"spd": A @ A.T + d * np.eye(d), "singular": np.zeros((d, d)),
         "indefinite": -np.eye(d), "nonsymmetric": np.triu(A, 1) + 5 * np.eye(d),
         "huge": 1e200 * np.eye(d), "tiny": 1e-200 * np.eye(d),
         "nan": np.full((d, d), np.nan)}[kind]
    if kind == "nonsymmetric" and d == 1:
        W = np.eye(1)
        kind = "spd"
    U = np.broadcast_to(np.eye(d), (1, d, d))
    try:
        dyn = ja.SelfAttentionDynamics(np.zeros((1, d, d)), U, W=W)
    except ValueError as e:
        assert kind in ("singular", "indefinite", "nonsymmetric", "nan"), str(e)
        return
    assert kind in ("spd", "huge", "tiny")
    out = ja.run_layers(dyn, rng.standard_normal((4, d)), 2, 0.3)
    _on_manifold(out, jnp.asarray(W))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.int32, jnp.bool_])
def test_other_dtypes_are_promoted(dtype):
    dyn = ja.SelfAttentionDynamics(np.zeros((1, 3, 3)), np.eye(3)[None])
    x0 = jnp.ones((4, 3), dtype=dtype)
    out = ja.run_layers(dyn, x0, 2, 0.1)
    assert jnp.issubdtype(out.dtype, jnp.floating) and jnp.finfo(out.dtype).bits >= 32
    with pytest.raises(TypeError, match="real"):
        ja.run_layers(dyn, jnp.ones((4, 3), dtype=jnp.complex64), 2, 0.1)
    with pytest.raises(TypeError, match="solver"):
        ja.solve_flow(dyn, jnp.ones((4, 3)), jnp.array([0.0, 1.0]), solver=dfx.ODETerm)


@pytest.mark.slow
@SETTINGS
@given(sizes=sizes, exponent=st.integers(-37, 38), seed=st.integers(0, 2**16),
       spread=st.sampled_from([1.0, 1e-3, 1e-6, 0.0]))
def test_token_scale_is_irrelevant_in_float32(sizes, exponent, seed, spread):
    """Tokens of any normal float32 size are accepted, run as the unit tokens do, and
    every consensus metric of them is ≥ 0 and scale-invariant (no overflow in |x|²,
    no underflow, no cancellation below zero)."""
    n, d, h = sizes
    P, U = _weights(seed, h, d, 1.0, 1.0)
    rng = np.random.default_rng(seed + 2)
    x = rng.standard_normal(d) + spread * rng.standard_normal((2, n, d))
    scale = 10.0**exponent
    with jax.enable_x64(False):
        dyn = ja.SelfAttentionDynamics(P.astype(np.float32), U.astype(np.float32))
        x32 = jnp.asarray(x, jnp.float32)
        xs = jnp.asarray(x * scale, jnp.float32)
        np.testing.assert_allclose(ja.run_layers(dyn, xs, 2, 0.1), ja.run_layers(dyn, x32, 2, 0.1),
                                   atol=2e-6)
        M = ja.metrics
        for f in (M.misalignment, M.pairwise_lyapunov, M.rank_collapse_residual):
            small, big = np.asarray(f(x32)), np.asarray(f(xs))
            assert np.all(small >= 0) and np.all(big >= 0)
            np.testing.assert_allclose(big, small, rtol=1e-4, atol=1e-6)
