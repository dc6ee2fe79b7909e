"""The continuous flow (eq. 6) and the discrete layers (eq. 4) against closed
forms, scipy, and the theorems' qualitative predictions."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
from _helpers import (
    ULPS_APART_SOURCE,
    random_dynamics,
    random_spd,
    random_tokens,
    run_on_forced_devices,
)

import jaxattn as ja


def test_single_token_skew_symmetric_is_matrix_exponential(key):
    d = 4
    A = jax.random.normal(key, (d, d))
    U = (A - A.T)[None]
    P = jax.random.normal(jax.random.fold_in(key, 1), (1, d, d))
    dyn = ja.SelfAttentionDynamics(P, U)
    x0 = ja.sample_ellipsoid(jax.random.fold_in(key, 2), 1, d)
    ts = jnp.linspace(0.0, 3.0, 7)
    ys = ja.solve_flow(dyn, x0, ts, rtol=1e-10, atol=1e-12)
    U0, x00 = np.asarray(U[0]), np.asarray(x0[0])
    exact = np.stack([scipy.linalg.expm(float(t) * U0) @ x00 for t in ts])
    np.testing.assert_allclose(ys[:, 0], exact, atol=1e-8)


def _scipy_flow(dyn, x0, ts):
    n, d = x0.shape
    f = jax.jit(lambda t, y: dyn.velocity(t, y.reshape(n, d)).ravel())
    sol = scipy.integrate.solve_ivp(
        lambda t, y: np.asarray(f(t, y)), (float(ts[0]), float(ts[-1])), np.asarray(x0).ravel(),
        method="DOP853", t_eval=np.asarray(ts), rtol=1e-13, atol=1e-13,
    )
    assert sol.success
    return sol.y.T.reshape(len(ts), n, d)


def _oscillating(t, P0):
    return P0 * jnp.cos(3.0 * t)


def _time_varying_dynamics(key, h, d, *, causal, W=None):
    kP, kU = jax.random.split(key)
    P0 = jax.random.normal(kP, (h, d, d))
    U = 0.7 * jax.random.normal(kU, (h, d, d))
    P = ja.Schedule(_oscillating, P0)
    return ja.SelfAttentionDynamics(P, U, W=W, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_flow_matches_scipy_dop853(key, causal):
    n, d = 5, 3
    W = random_spd(jax.random.fold_in(key, 9), d)
    dyn = _time_varying_dynamics(key, 2, d, causal=causal, W=W)
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d, W)
    ts = jnp.linspace(0.0, 4.0, 9)
    ys = ja.solve_flow(dyn, x0, ts, rtol=1e-8, atol=1e-10)
    ref = _scipy_flow(dyn, x0, ts)
    err = np.abs(np.asarray(ys) - ref).max()
    print(f"max |jaxattn − scipy DOP853| = {err:.2e}")
    assert err < 1e-6


def test_drift_float32_long_horizon(key):
    """10 tokens on S², random weights, T = 50, float32: drift below 1e-5."""
    with jax.enable_x64(False):
        kd, kx = jax.random.split(key)
        kP, kU = jax.random.split(kd)
        P = jax.random.uniform(kP, (2, 3, 3), minval=-0.5, maxval=0.5)
        U = jax.random.uniform(kU, (2, 3, 3), minval=-0.5, maxval=0.5)
        dyn = ja.SelfAttentionDynamics(P, U)
        x0 = ja.sample_ellipsoid(kx, 10, 3)
        ts = jnp.linspace(0.0, 50.0, 501)
        ys = ja.solve_flow(dyn, x0, ts)
        assert ys.dtype == jnp.float32
        drift = float(ja.manifold_drift(ys))
        raw = float(ja.manifold_drift(ja.solve_flow(dyn, x0, ts, on_manifold=False)))
    print(f"drift with retraction {drift:.2e}, without {raw:.2e}")
    assert drift < 1e-5


def test_discrete_layers_converge_to_flow_first_order(key):
    n, d, T = 6, 3, 1.0
    dyn = _time_varying_dynamics(key, 2, d, causal=False)
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d)
    exact = ja.solve_flow(dyn, x0, jnp.array([0.0, T]), rtol=1e-11, atol=1e-12)[-1]
    taus = np.array([0.04, 0.02, 0.01, 0.005])
    errs = [float(jnp.abs(ja.run_layers(dyn, x0, round(T / tau), tau)[-1] - exact).max())
            for tau in taus]
    order = np.polyfit(np.log(taus), np.log(errs), 1)[0]
    print(f"errors {errs}, fitted order {order:.3f}")
    assert abs(order - 1) < 0.2


def test_full_attention_identity_values_reach_consensus(key):
    h, n, d = 2, 8, 3
    P = jax.random.uniform(key, (h, d, d), minval=-0.5, maxval=0.5)
    dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(d), (h, d, d)))
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d)
    x0 = x0 * jnp.sign(x0[:, :1])  # all in the open hemisphere {x₁ > 0}
    E = ja.misalignment(ja.solve_flow(dyn, x0, jnp.linspace(0.0, 30.0, 31)))
    assert E[0] > 0.1 and E[-1] < 1e-8
    E_disc = ja.misalignment(ja.run_layers(dyn, x0, 300, 0.1))
    assert E_disc[-1] < 1e-8


def test_causal_first_token_fixed_others_converge_to_it(key):
    h, n, d = 2, 7, 4
    P = jax.random.normal(key, (h, d, d))
    dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(d), (h, d, d)), causal=True)
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d)
    x0 = x0 * jnp.sign(x0 @ x0[0])[:, None]
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, 40.0, 41))
    np.testing.assert_allclose(ys[:, 0], jnp.broadcast_to(x0[0], ys[:, 0].shape), atol=1e-12)
    assert jnp.abs(ys[-1] - x0[:1]).max() < 1e-5
    xs = ja.run_layers(dyn, x0, 50, 0.5)
    np.testing.assert_allclose(xs[:, 0], jnp.broadcast_to(x0[0], xs[:, 0].shape), atol=1e-12)


def test_gradient_flow_potential_nondecreasing(key):
    """Theorem 3.2: one head, P SPD and constant, U = W⁻¹P ⇒ E_P nondecreasing."""
    n, d, beta = 6, 4, 0.8
    kA, kW, kx = jax.random.split(key, 3)
    A = jax.random.normal(kA, (d, d))
    P = A @ A.T / d + 0.1 * jnp.eye(d)
    W = random_spd(kW, d)
    dyn = ja.SelfAttentionDynamics(P[None], jnp.linalg.solve(W, P)[None], W=W, beta=beta)
    x0 = random_tokens(kx, n, d, W)
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, 10.0, 201), rtol=1e-10, atol=1e-12)
    EP = 0.5 * jnp.exp(beta * jnp.einsum("tid,de,tje->tij", ys, P, ys)).sum((-1, -2))
    assert jnp.all(jnp.diff(EP) >= -1e-9 * EP[:-1])
    assert EP[-1] > EP[0]


def test_fixed_step_solver_needs_dt0(key):
    dyn = random_dynamics(key, 1, 3)
    x0 = random_tokens(key, 4, 3)
    with pytest.raises(ValueError, match="dt0"):
        ja.solve_flow(dyn, x0, jnp.linspace(0, 1, 3), solver=dfx.Euler())
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0, 1, 3), solver=dfx.Euler(), dt0=0.01)
    assert float(ja.manifold_drift(ys)) < 1e-12


_SHARDED_FLOAT32 = ULPS_APART_SOURCE + """
import json, jax, jax.numpy as jnp, numpy as np
import jaxattn as ja
kP, kx = jax.random.split(jax.random.PRNGKey(0))
dyn = ja.SelfAttentionDynamics(jax.random.normal(kP, (2, 3, 3)),
                               jnp.broadcast_to(jnp.eye(3), (2, 3, 3)))
x0 = jax.vmap(lambda k: ja.sample_ellipsoid(k, 10, 3))(jax.random.split(kx, 8))
ts = jnp.linspace(0.0, 4.0, 9)
layers = lambda x, **kw: ja.run_layers(dyn, x, 40, 0.1, **kw)
flow = lambda x, **kw: ja.solve_flow(dyn, x, ts, **kw)
res = {"devices": len(jax.devices())}
for name, run in (("layers", layers), ("flow", flow)):
    sharded = np.asarray(run(x0, devices=4))
    shares = np.concatenate([run(x0[i:i + 2]) for i in range(0, 8, 2)])
    res[name] = [sharded.dtype.name, ulps_apart(sharded, shares),
                 float(np.abs(sharded - run(x0)).max())]
print(json.dumps(res))
"""


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_sharded_float32_runs_equal_the_unsharded_runs_of_each_share():
    """`devices=`: each device's share agrees with the unsharded run of that share to
    a few ulps (two compiled programs agree to rounding, not to the bit, on every
    chip); against one program over the whole batch to float32 rounding."""
    res = run_on_forced_devices(_SHARDED_FLOAT32, timeout=300)
    print(res)
    for name in ("layers", "flow"):
        dtype, ulps, err = res[name]
        assert dtype == "float32" and ulps <= 4, res
        assert err < 1e-5, res



def test_the_default_retracts_only_placements_that_stay_on_the_manifold(key):
    """`on_manifold` defaulted to True for every placement: a pre/peri/none flow was
    retracted onto the sphere at each step, another flow (norms held at 1 where the
    layers reach 5.4 and 190; E up to 90× off). Its default is now the placement's
    `stays_on_manifold`, and the flow follows the layers at a small step."""
    kP, kx = jax.random.split(key)
    P = jax.random.normal(kP, (2, 3, 3))
    U = 1.5 * jnp.broadcast_to(jnp.eye(3), (2, 3, 3))
    x0 = ja.sample_ellipsoid(kx, 6, 3)
    ts = jnp.linspace(0.0, 2.0, 3)
    for norm in ("pre", "post"):
        dyn = ja.SelfAttentionDynamics(P, U, norm=norm)
        flow = ja.solve_flow(dyn, x0, ts)
        np.testing.assert_array_equal(
            flow, ja.solve_flow(dyn, x0, ts, on_manifold=dyn.stays_on_manifold))
        layers = ja.run_layers(dyn, x0, 2000, 0.001)[-1]
        np.testing.assert_allclose(jnp.linalg.norm(flow[-1], axis=-1),
                                   jnp.linalg.norm(layers, axis=-1), rtol=2e-3)
        np.testing.assert_allclose(ja.misalignment(flow[-1]), ja.misalignment(layers),
                                   rtol=0.05)


def test_a_factor_beside_p_is_refused_and_numpy_float64_is_read_silently(key):
    """`SelfAttentionDynamics(P, U, Q=Q)` ran the P model, Q ignored; NumPy float64
    tokens (the commonest input) raised JAX's truncation warning in float32 mode."""
    import warnings

    P = U = jnp.ones((1, 3, 3))
    for factor in ({"Q": jnp.ones((1, 2, 3))}, {"K": jnp.ones((1, 2, 3))}):
        with pytest.raises(ValueError, match="needs either `P` .* or both factors"):
            ja.SelfAttentionDynamics(P, U, **factor)
    dyn = ja.random_dynamics(key, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xs = ja.run_layers(dyn, np.random.default_rng(0).normal(size=(5, 3)), 2, 0.1)
        assert xs.dtype == jnp.result_type(float)
        ja.misalignment(np.random.default_rng(1).normal(size=(6, 3)))


def test_outputs_past_the_memory_are_refused_in_one_line(key, monkeypatch):
    """10¹² points aborted the interpreter when read (XLA's check failed: a core dump);
    10⁹ layers' tokens and 200,000 tokens' dense weights ended in XLA's
    RESOURCE_EXHAUSTED traceback. Each is one line before any work (on 8 GB here; in
    float32 or float64)."""
    from jaxattn import _validate

    monkeypatch.setattr(_validate, "machine_memory", lambda: 8 * 10**9)
    with pytest.raises(ValueError, match=r"^1000000000000 points in R\^3 need (12|24) TB, more "
                                         r"than this machine's memory \(8 GB\)"):
        ja.sample_ellipsoid(key, 10**12, 3)
    dyn, x0 = ja.random_dynamics(key, 2, 3), jnp.ones((5, 3))
    with pytest.raises(ValueError, match=r"^the tokens after each of 1000000000 layers .* "
                                         r"need (60|120) GB.*`observe=` a measure of them"):
        ja.run_layers(dyn, x0, 10**9, 0.1)
    with pytest.raises(ValueError, match=r"^the tokens at 1000000000 times .* need (60|120) GB"):
        ja.solve_flow(dyn, x0, np.broadcast_to(np.float32(0.0), (10**9,)))
    dense = ja.random_dynamics(key, 2, 3, block_size=0)
    with pytest.raises(ValueError, match=r"^the dense attention weights of 200000 tokens "
                                         r"\(block_size=0\) need (320|640) GB.*take key blocks"):
        ja.run_layers(dense, jnp.ones((200_000, 3)), 1, 0.1)
