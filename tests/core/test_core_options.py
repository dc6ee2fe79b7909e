"""Options of the simulators: observe, recursive checkpointing, RK4, sharding."""

import textwrap

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import (
    ULPS_APART_SOURCE,
    assert_same_values,
    random_dynamics,
    random_tokens,
    run_on_forced_devices,
)

import jaxattn as ja


def test_observe_returns_metric_per_layer(key):
    dyn = random_dynamics(key, 2, 3, causal=True)
    xb = random_tokens(key, 5, 3, batch=(4,))
    E = ja.run_layers(dyn, xb, 12, 0.2, observe=ja.misalignment)
    xs = ja.run_layers(dyn, xb, 12, 0.2)
    assert E.shape == (4, 13)
    np.testing.assert_allclose(E, ja.misalignment(xs), rtol=1e-12, atol=1e-15)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_recursive_checkpointing_same_gradient(key):
    dyn = random_dynamics(key, 2, 4, causal=True)
    x0 = random_tokens(key, 6, 4)

    def loss(x, checkpoints):
        return ja.run_layers(dyn, x, 50, 0.1, observe=ja.misalignment,
                             checkpoints=checkpoints)[-1]

    g_all = jax.grad(loss)(x0, None)
    g_rec = jax.grad(loss)(x0, 5)
    np.testing.assert_allclose(g_rec, g_all, rtol=1e-10, atol=1e-14)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("num_layers", [0, 1, 49, 50])
def test_sqrt_checkpointing_same_values_and_gradient(key, num_layers):
    dyn = random_dynamics(key, 2, 4, causal=True)
    x0 = random_tokens(key, 6, 4)

    def run(x, checkpoints):
        return ja.run_layers(dyn, x, num_layers, 0.1, observe=ja.misalignment,
                             checkpoints=checkpoints)

    assert_same_values(run(x0, "sqrt"), run(x0, None))  # two programs: nested scans
    g_all = jax.grad(lambda x: run(x, None).sum())(x0)
    g_sqrt = jax.grad(lambda x: run(x, "sqrt").sum())(x0)
    np.testing.assert_allclose(g_sqrt, g_all, rtol=1e-10, atol=1e-14)


@pytest.mark.slow  # a memory measurement
def test_sqrt_checkpointing_memory_grows_sublinearly(key):
    dyn = random_dynamics(key, 2, 16)
    x0 = random_tokens(key, 32, 16)

    def grad_memory(num_layers, checkpoints):
        loss = lambda x: ja.run_layers(dyn, x, num_layers, 0.1, observe=ja.misalignment,  # noqa: E731
                                       checkpoints=checkpoints)[-1]
        stats = jax.jit(jax.grad(loss)).lower(x0).compile().memory_analysis()
        return stats.temp_size_in_bytes

    per_layer = grad_memory(400, None) / grad_memory(100, None)
    sqrt = grad_memory(400, "sqrt") / grad_memory(100, "sqrt")
    print(f"gradient memory ×{per_layer:.2f} (every layer), ×{sqrt:.2f} (sqrt) for 4× layers")
    assert per_layer > 3.0  # stores every layer's tokens: linear
    assert sqrt < 2.6  # O(√L): ideally ×2


def test_checkpoints_rejects_unknown_mode(key):
    dyn = random_dynamics(key, 2, 3)
    with pytest.raises(ValueError, match="sqrt"):
        ja.run_layers(dyn, random_tokens(key, 4, 3), 5, checkpoints="log")


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_rk4_is_fourth_order_on_the_flow(key):
    dyn = random_dynamics(key, 2, 3)
    x0 = random_tokens(key, 5, 3)
    ts = jnp.array([0.0, 1.0])
    exact = ja.solve_flow(dyn, x0, ts, rtol=1e-12, atol=1e-13)[-1]
    fixed = dfx.ConstantStepSize()
    errs = [float(jnp.abs(ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=1 / m,
                                        stepsize_controller=fixed)[-1] - exact).max())
            for m in (8, 16, 32)]
    order = np.polyfit(np.log([1 / 8, 1 / 16, 1 / 32]), np.log(errs), 1)[0]
    print(f"RK4 errors {errs}, fitted order {order:.2f}")
    assert 3.6 < order < 4.6


_SHARDED = ULPS_APART_SOURCE + textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxattn as ja
    key = jax.random.PRNGKey(3)
    P = jax.random.normal(key, (2, 3, 3))
    dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(3), (2, 3, 3)), causal=True)
    xb = jax.vmap(lambda k: ja.sample_ellipsoid(k, 5, 3))(jax.random.split(key, 6))
    ts = jnp.linspace(0.0, 2.0, 5)
    a = ja.run_layers(dyn, xb, 10, 0.2)
    b = ja.run_layers(dyn, xb, 10, 0.2, devices=4)
    c = ja.solve_flow(dyn, xb, ts)
    d = ja.solve_flow(dyn, xb, ts, devices=jax.devices())
    print(json.dumps({
        "devices": len(jax.devices()),
        "layers_ulps": ulps_apart(a, b),
        "flow_err": float(np.abs(np.asarray(c) - np.asarray(d)).max()),
        "shape": list(b.shape),
    }))
    """
)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_sharded_batch_equals_unsharded():
    res = run_on_forced_devices(_SHARDED, timeout=600)
    assert res["shape"] == [6, 11, 5, 3]
    assert res["layers_ulps"] <= 4, res  # two programs (4 devices, 1): rounding
    assert res["flow_err"] < 1e-12


def test_bad_devices(key):
    dyn = random_dynamics(key, 1, 3)
    xb = random_tokens(key, 4, 3, batch=(2,))
    with pytest.raises(ValueError, match="device"):
        ja.run_layers(dyn, xb, 2, 0.1, devices=len(jax.devices()) + 1)
    with pytest.raises(TypeError, match="devices="):
        ja.run_layers(dyn, xb, 2, 0.1, devices="gpu")


def test_implicit_solvers_take_a_matrix_free_root_finder_for_a_large_state():
    """Issue 43, point 3: past `JACOBIAN_LIMIT` bytes of dense Jacobian an implicit
    solver left with diffrax's default root finder gets Newton–GMRES (small restart);
    a small state, a root finder the user gave and constant steps keep theirs. Only
    the choice is made here (no big solve)."""
    import equinox as eqx
    import lineax as lx
    import optimistix as optx

    from jaxattn._flow import JACOBIAN_LIMIT, choose_root_finder

    pid = dfx.PIDController(rtol=1e-6, atol=1e-8)
    default = dfx.Kvaerno3().root_finder
    n_big = int(np.sqrt(JACOBIAN_LIMIT / 8) / 3) + 1  # (3 n)² float64 past the limit
    big = choose_root_finder(dfx.Kvaerno3(), pid, (n_big, 3), jnp.float64)
    assert isinstance(big.root_finder, optx.Newton)
    assert isinstance(big.root_finder.linear_solver, lx.GMRES)
    assert big.root_finder.linear_solver.restart <= 8
    assert big.root_finder.rtol is default.rtol  # tolerances from the controller
    assert isinstance(choose_root_finder(dfx.Kvaerno5(), pid, (n_big, 3), jnp.float64).root_finder,
                      optx.Newton)
    small = choose_root_finder(dfx.Kvaerno3(), pid, (n_big // 2, 3), jnp.float64)
    assert eqx.tree_equal(small.root_finder, default)
    own = dfx.Kvaerno3(root_finder=dfx.VeryChord(rtol=1e-5, atol=1e-7, norm=optx.max_norm))
    assert choose_root_finder(own, pid, (n_big, 3), jnp.float64) is own
    assert choose_root_finder(dfx.Tsit5(), pid, (n_big, 3), jnp.float64) == dfx.Tsit5()
    fixed = choose_root_finder(dfx.Kvaerno3(), dfx.ConstantStepSize(), (n_big, 3), jnp.float64)
    assert eqx.tree_equal(fixed.root_finder, default)  # diffrax asks for tolerances itself


def test_the_matrix_free_root_finder_solves_the_flow(key, monkeypatch):
    """The chosen Newton–GMRES runs inside `solve_flow` (a tiny state, the limit
    lowered to force it) and agrees with Tsit5."""
    import jaxattn._flow as flow

    monkeypatch.setattr(flow, "JACOBIAN_LIMIT", 0)
    dyn = random_dynamics(key, 1, 2)
    x0 = random_tokens(key, 4, 2)
    ts = jnp.array([0.0, 0.5])
    implicit = ja.solve_flow(dyn, x0, ts, solver=dfx.Kvaerno3(), rtol=1e-8, atol=1e-10)
    explicit = ja.solve_flow(dyn, x0, ts, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)
