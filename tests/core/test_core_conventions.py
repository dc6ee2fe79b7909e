"""Core numerics users can trust: tolerances that follow the dtype, the floor and the
symmetric companion of the misalignment, errors that name the argument, a random
model, and solve_flow's solution and events."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_same_values

import jaxattn as ja
from jaxattn._dynamics import NORMS

T = ja.theory
F32 = jnp.float32


def _one_line(err) -> bool:
    return "\n" not in str(err.value)


# --- classify and Theorem 3.2's test follow the dtype -----------------------------


def test_float32_models_that_satisfy_a_hypothesis_keep_their_theorem():
    d, hit32, hit52 = 3, 0, 0
    for s in range(8):
        A = jax.random.normal(jax.random.PRNGKey(s), (d, d), F32)
        P = A @ A.T + 0.5 * jnp.eye(d, dtype=F32)
        P = (P + P.T) / 2
        cls = T.classify(ja.SelfAttentionDynamics(P[None], (F32(0.7) * P)[None]))  # W U = c P
        hit32 += cls.theorems == ("3.2",)
        Q, _ = jnp.linalg.qr(A)
        S = (Q * jnp.array([3.0, 1.0, -0.5], F32)[None, :]) @ Q.T  # symmetric to rounding
        ones = jnp.ones((1, d, d), F32)
        hit52 += T.classify(ja.SelfAttentionDynamics(ones, S[None], causal=True)).theorems \
            == ("5.2", "5.3")
    assert hit32 == 8 and hit52 == 8
    # float64 keeps its 1e-8: a departure of 1e-6 is still refused.
    P64 = np.asarray(P, np.float64)
    off = P64 + 1e-6 * np.triu(np.ones((d, d)), 1)
    assert "3.2" not in T.classify(ja.SelfAttentionDynamics(P64[None], off[None])).theorems
    assert T.default_tol(jnp.float64, d) == 1e-8 < T.default_tol(F32, d)


def _gradient_model(key, d, c=1.0, dtype=jnp.float64):
    A = jax.random.normal(key, (d, d), dtype)
    P = A @ A.T / d + jnp.eye(d, dtype=dtype)
    return ja.SelfAttentionDynamics(P[None], (c * P)[None])


def test_equilibrium_test_is_relative_to_the_field_and_its_dtype(key):
    n, d = 5, 3
    x = ja.normalize(jax.random.normal(key, (n, d)))
    base = _gradient_model(key, d)
    ratio = jnp.max(jnp.abs(base.velocity(0.0, x))) / jnp.max(jnp.abs(base.raw_update(0.0, x)))
    for c in (1e-3, 1.0, 1e3):  # U → cU only rescales time: the same verdict
        test = T.theorem_test("3.2", _gradient_model(key, d, c))
        assert bool(test.reached(x, x, 0.0, 2 * ratio))
        assert not bool(test.reached(x, x, 0.0, ratio / 2))
    # A float32 equilibrium (every token at U's top eigenvector) is one, whatever tol:
    # its velocity is rounding.
    U = jnp.diag(jnp.array([2.0, 1.0, 0.5], F32))
    rot, _ = jnp.linalg.qr(jax.random.normal(key, (d, d), F32))
    U = rot @ U @ rot.T
    dyn = ja.SelfAttentionDynamics(jnp.eye(d, dtype=F32)[None], U[None], causal=True)
    x_eq = jnp.broadcast_to(rot[:, 0], (n, d))
    assert float(jnp.max(jnp.abs(dyn.velocity(0.0, x_eq)))) > 0  # rounding, not zero
    assert bool(T.theorem_test("3.2", dyn).reached(x_eq, x_eq, 0.0, 1e-12))


def test_classify_names_its_bad_arguments():
    dyn = ja.SelfAttentionDynamics(jnp.eye(3)[None], jnp.eye(3)[None])
    for kwargs, name in [({"times": "x"}, "times"), ({"times": [[0.0, 1.0]]}, "times"),
                         ({"tol": "x"}, "tol"), ({"tol": -1.0}, "tol")]:
        with pytest.raises((TypeError, ValueError), match=f"`{name}`") as err:
            T.classify(dyn, **kwargs)
        assert _one_line(err)


# --- the misalignment: no tokens, its floor, its symmetric companion ---------------


@pytest.mark.parametrize("name", ["misalignment", "pairwise_misalignment"])
@pytest.mark.parametrize("shape", [(0, 3), (2, 0, 3), (4, 0)])
def test_misalignment_of_no_tokens_is_refused_by_name(name, shape):
    with pytest.raises(ValueError, match="`x`.*at least one token") as err:
        getattr(ja.metrics, name)(np.zeros(shape))
    assert _one_line(err)


@pytest.mark.parametrize("n,d", [(8, 3), (5, 16), (3, 200)])
def test_misalignment_floor_bounds_collapsed_float32_states(key, n, d):
    k1, k2 = jax.random.split(key)
    direction = jax.random.normal(k1, (500, 1, d), F32)
    scales = jnp.exp(jax.random.normal(k2, (500, n, 1), F32))
    collapsed = direction * scales  # one direction, each token rounded on its own
    floor = ja.metrics.misalignment_floor(F32, n, d)
    E = np.asarray(ja.misalignment(collapsed))
    pair = np.asarray(ja.metrics.pairwise_misalignment(collapsed))
    print(f"n={n} d={d}: max E {E.max():.3g}, floor {floor:.3g}")
    assert E.dtype == np.float32 and E.max() <= floor
    assert pair.max() <= n / (n - 1) * floor
    assert floor < 100 * E.max()  # a floor, not a loose bound
    assert ja.metrics.misalignment_floor(jnp.float64, n, d) < floor * 1e-15
    assert ja.metrics.misalignment_floor(F32, 1, d) == 0.0


def test_float32_post_ln_layers_reach_the_floor(key):
    n, d = 6, 4
    with jax.enable_x64(False):
        P = ja.random_dynamics(key, 2, d, scale=0.3).query_key(0.0)
        dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(d), (2, d, d)))
        x0 = jnp.ones(d)[None, None, :] + 0.1 * jax.random.normal(key, (3, n, d))
        E = np.asarray(ja.run_layers(dyn, x0, 200, 1.0, observe=ja.misalignment))
    assert E.dtype == np.float32 and E[:, 0].min() > 1e-4
    assert (E[:, -1] <= ja.metrics.misalignment_floor(F32, n, d)).all()


def test_pairwise_misalignment_is_symmetric_and_matches_a_float64_reference(key):
    n, d = 5, 3
    x = jax.random.normal(key, (7, n, d))
    pair = np.asarray(ja.metrics.pairwise_misalignment(x))
    u = np.asarray(x) / np.linalg.norm(np.asarray(x), axis=-1, keepdims=True)
    ref = np.mean([1 - np.sum(u[:, i] * u[:, j], -1)
                   for i, j in itertools.permutations(range(n), 2)], axis=0)
    np.testing.assert_allclose(pair, ref, rtol=1e-12)
    for perm in ([4, 3, 2, 1, 0], [1, 0, 2, 3, 4], [2, 4, 1, 0, 3]):
        np.testing.assert_allclose(ja.metrics.pairwise_misalignment(x[:, perm, :]), pair,
                                   rtol=1e-12)
    E = np.asarray(ja.misalignment(x))
    assert not np.allclose(ja.misalignment(x[:, [4, 3, 2, 1, 0], :]), E)  # E is not
    assert (pair <= 4 * E).all() and (E <= (n - 1) / 2 * pair).all()
    W = ja.metrics.pairwise_misalignment(x, 2.0 * jnp.eye(d))  # a scaled metric: same cosines
    np.testing.assert_allclose(W, pair, rtol=1e-12)
    assert float(ja.metrics.pairwise_misalignment(x[0, :1])) == 0.0


def test_docstrings_say_how_to_read_E_and_every_layer_update():
    doc = ja.misalignment.__doc__
    assert "pairwise_misalignment" in doc and "misalignment_floor" in doc
    for norm in NORMS:
        assert f'`"{norm}"`' in ja.run_layers.__doc__


# --- a random model; solve_flow's solution and events --------------------------------


def test_random_dynamics_draws_its_documented_distribution(key):
    heads, d, scale = 64, 8, 0.5
    dyn = ja.random_dynamics(key, heads, d, scale=scale, causal=True, norm="pre")
    P, U = dyn.query_key(0.0), dyn.U(0.0)
    assert P.shape == U.shape == (heads, d, d) and dyn.causal and dyn.norm.name == "pre"
    for w in (P, U):
        var = float(jnp.var(w))
        assert abs(var / (scale**2 / d) - 1) < 0.1  # 4096 entries: ~2 % standard error
    assert abs(float(jnp.corrcoef(P.ravel(), U.ravel())[0, 1])) < 0.1
    again = ja.random_dynamics(key, heads, d, scale=scale, causal=True, norm="pre")
    np.testing.assert_array_equal(again.query_key(0.0), P)
    assert ja.random_dynamics(key, 1, 3, dtype=F32).U(0.0).dtype == F32
    with pytest.raises(ValueError, match="`heads`"):
        ja.random_dynamics(key, 0, 3)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_solve_flow_solution_and_event_stop_at_the_dense_crossing(key):
    n, d, eps = 5, 3, 1e-4
    dyn = ja.SelfAttentionDynamics(ja.random_dynamics(key, 2, d).query_key(0.0),
                                   jnp.broadcast_to(jnp.eye(d), (2, d, d)))
    x0 = jax.random.normal(jax.random.fold_in(key, 1), (3, n, d)) + 2.0
    ts = jnp.linspace(0.0, 10.0, 11)
    tight = {"rtol": 1e-10, "atol": 1e-12}
    ys = ja.solve_flow(dyn, x0, ts, **tight)
    sol = ja.solve_flow(dyn, x0, ts, solution=True, **tight)
    assert isinstance(sol, ja.FlowSolution)
    assert_same_values(sol.ys, ys)  # another program: the dense output's bookkeeping
    np.testing.assert_array_equal(sol.t1, 10.0)
    assert_same_values(sol.y1, ys[:, -1])  # the last step's end; its interpolant at t1
    assert sol.success.all() and not sol.event.any() and (sol.stats["num_steps"] > 0).all()
    stop = ja.solve_flow(dyn, x0, ts, solution=True, **tight,
                         event=lambda t, x: ja.misalignment(x) - eps)
    dense = jnp.linspace(0.0, 10.0, 2001)
    crossing = ja.metrics.consensus_time(dense, ja.misalignment(ja.solve_flow(dyn, x0, dense,
                                                                              **tight)), eps)
    print("event", stop.t1, "dense crossing", crossing)
    assert stop.event.all() and stop.success.all()
    np.testing.assert_allclose(stop.t1, crossing, rtol=1e-6)
    np.testing.assert_allclose(ja.misalignment(stop.y1), eps, rtol=1e-6)
    after = np.asarray(ts)[None, :] > np.asarray(stop.t1)[:, None]
    assert np.isinf(np.asarray(stop.ts)[after]).all() and np.isfinite(stop.ts[~after]).all()
    np.testing.assert_allclose(stop.ys[~after], ys[~after], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="solution=True") as err:
        ja.solve_flow(dyn, x0, ts, event=lambda t, x: ja.misalignment(x) - eps)
    assert _one_line(err)
