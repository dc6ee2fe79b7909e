"""`ja.theory`: each theorem's hypotheses read off models, and each prediction
verified by simulating 64 random starts in one batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_spd, random_tokens

import jaxattn as ja
from jaxattn.experiments import paper as _paper

T = ja.theory
B = 64  # random instances per prediction


def _flow_end(dyn, x0, horizon, **kw):
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, horizon, 3), **kw)
    return ys[:, -1]


def _identity(h, d):
    return jnp.broadcast_to(jnp.eye(d), (h, d, d))


def _batch(key, n, d, W=None):
    return random_tokens(key, n, d, W, batch=(B,))


def test_theorem_41_consensus_from_a_hemisphere(key):
    dyn = _paper.sphere_dynamics(key)  # h = 2, U = I, smooth time-varying P(t)
    assert T.classify(dyn).theorems == ("4.1",)
    x0 = _batch(jax.random.fold_in(key, 1), 5, 3)  # P(in a hemisphere) = 11/16
    pred = T.predict(dyn, x0)
    assert pred.theorem == "4.1" and pred.outcome == "consensus"
    inside = pred.in_domain
    assert 20 < inside.sum() < B
    xT = _flow_end(dyn, x0, 40.0)
    ok = pred.check(xT, tol=1e-6)
    print(f"{inside.sum()}/{B} starts in a hemisphere; all converge: {ok[inside].all()}")
    assert ok[inside].all()
    # outcome 'consensus' beside in_domain False: the prediction says what that means
    line = str(pred)
    assert line.startswith("Theorem 4.1: consensus, for the starts in its domain")
    assert f"({inside.sum()} of {B})" in line and "about the others it says nothing" in line
    assert "says nothing" not in str(T.predict(dyn, x0[np.flatnonzero(inside)[:1]]))


@pytest.mark.slow
def test_theorem_41_on_an_ellipsoid(key):
    d = 3
    W = random_spd(key, d)
    P = jax.random.normal(jax.random.fold_in(key, 1), (3, d, d))
    dyn = ja.SelfAttentionDynamics(P, _identity(3, d), W=W)
    assert "4.1" in T.classify(dyn).theorems
    x0 = _batch(jax.random.fold_in(key, 2), 6, d, W)
    pred = T.predict(dyn, x0)
    xT = _flow_end(dyn, x0, 60.0)
    assert pred.in_domain.sum() > 10 and pred.check(xT, tol=1e-6)[pred.in_domain].all()


def test_theorem_51_every_token_to_the_first(key):
    d, n = 4, 6
    P = ja.Schedule(lambda t, P0: P0 * jnp.cos(2.0 * t), 1.5 * jax.random.normal(key, (2, d, d)))
    dyn = ja.SelfAttentionDynamics(P, _identity(2, d), causal=True)
    assert T.classify(dyn).theorems == ("5.1",)
    x0 = _batch(jax.random.fold_in(key, 1), n, d)
    pred = T.predict(dyn, x0)
    assert pred.outcome == "consensus at x₁(0)" and pred.in_domain.all()
    np.testing.assert_allclose(pred.limit, np.broadcast_to(np.asarray(x0)[:, :1], x0.shape))
    xT = _flow_end(dyn, x0, 40.0)
    assert pred.check(xT, tol=1e-6).all()
    antipode = x0.at[0, 1].set(-x0[0, 0])  # x₂ = −x₁: the known exceptional start
    assert not T.predict(dyn, antipode).in_domain[0]


def _symmetric_model(key, d, lam):
    basis, _ = jnp.linalg.qr(jax.random.normal(key, (d, d)))
    U = (basis * jnp.asarray(lam)[None, :]) @ basis.T
    P = jax.random.normal(jax.random.fold_in(key, 1), (1, d, d))
    return ja.SelfAttentionDynamics(P, U[None], causal=True), basis[:, 0]


def test_theorem_52_convergence_to_v1(key):
    d, n = 3, 5
    dyn, v1 = _symmetric_model(key, d, [1.0, 0.3, -0.4])
    cls = T.classify(dyn)
    assert cls.theorems == ("5.2", "5.3")
    np.testing.assert_allclose(abs(cls["5.2"].data["v1"] @ v1), 1.0, rtol=1e-12)
    # Half the starts on each side of v₁: the theorem predicts ±v₁.
    x0 = jax.vmap(lambda k: _paper.hemisphere_of(k, v1, n))(jax.random.split(key, B))
    x0 = x0 * jnp.where(jnp.arange(B) % 2 == 0, 1.0, -1.0)[:, None, None]
    pred = T.predict(dyn, x0)
    assert pred.theorem == "5.2" and pred.in_domain.all()
    signs = np.sign(pred.limit[:, 0] @ np.asarray(v1))
    assert np.array_equal(signs, np.where(np.arange(B) % 2 == 0, 1.0, -1.0))
    xT = _flow_end(dyn, x0, 40.0)
    assert pred.check(xT, tol=1e-6).all()
    mixed = T.predict(dyn, _batch(jax.random.fold_in(key, 5), n, d))
    assert 0 < mixed.in_domain.sum() < B  # random starts straddle the two sides


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_theorem_52_needs_a_positive_top_eigenvalue(key):
    """With λ₁ < 0 the consensus at v₁ is unstable for token 2: classify refuses."""
    d = 3
    U = jnp.diag(jnp.array([-1.0, -1.05, -3.0]))[None]  # v₁ = e₁, λ₁ = −1
    dyn = ja.SelfAttentionDynamics(jnp.zeros((1, d, d)), U, causal=True)
    cls = T.classify(dyn)
    assert "5.2" not in cls.theorems and cls.theorems == ()
    x0 = jnp.array([[1.0, 0.0, 0.0], [0.9, 0.3, 0.1]])  # both in ⟨e₁, x⟩ > 0
    xT = _flow_end(dyn, x0[None], 60.0)[0]
    print(f"⟨x₂(T), v₁⟩ = {float(xT[1, 0]):.3f}")
    assert float(xT[1, 0]) < 0.99  # token 2 does not reach v₁
    assert T.predict(dyn, x0).outcome == "none"


def _rotating(t, params):
    lam, axis_speed = params
    c, s = jnp.cos(axis_speed * t), jnp.sin(axis_speed * t)
    R = jnp.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    return (R @ jnp.diag(lam) @ R.T)[None]


def test_theorem_53_ball_around_a_moving_eigenvector(key):
    n = 4
    lam = jnp.array([1.0, 0.2, -0.5])
    P = 0.5 * jax.random.normal(key, (1, 3, 3))
    x0 = jax.vmap(lambda k: _paper.hemisphere_of(k, jnp.array([1.0, 0.0, 0.0]), n))(
        jax.random.split(jax.random.fold_in(key, 1), B)
    )
    gaps = []
    for speed in (0.02, 0.2):
        dyn = ja.SelfAttentionDynamics(P, ja.Schedule(_rotating, (lam, jnp.asarray(speed))),
                                       causal=True)
        assert T.classify(dyn).theorems == ("5.3",)
        pred = T.predict(dyn, x0)
        assert pred.outcome == "near v₁(t)" and pred.in_domain.all()
        xT = _flow_end(dyn, x0, 30.0)
        v = pred.reference(30.0)
        angle = 30.0 * speed  # v₁(t) = (cos st, sin st, 0) up to sign
        np.testing.assert_allclose(np.abs(v[0]), np.abs([np.cos(angle), np.sin(angle), 0]),
                                   atol=1e-9)
        gaps.append(float(np.max(1 - np.einsum("bnd,bd->bn", np.asarray(xT), v))))
        if speed == 0.02:
            assert pred.check(xT, 30.0, tol=1e-2).all()
    print(f"final 1 − ⟨x_i, v₁(T)⟩: slow {gaps[0]:.2e}, fast {gaps[1]:.2e}")
    assert gaps[1] > 5 * gaps[0]  # the ball grows with the speed of v₁(t)


@pytest.mark.parametrize("ellipsoid", [False, True])
def test_theorem_32_gradient_flow_to_an_equilibrium(key, ellipsoid):
    n, d = 5, 3
    dyn = _paper.gradient_dynamics(key, d, ellipsoid=ellipsoid)
    assert T.classify(dyn).theorems == ("3.2",)
    x0 = _batch(jax.random.fold_in(key, 1), n, d, dyn.W)
    pred = T.predict(dyn, x0)
    assert pred.outcome == "equilibrium" and pred.in_domain.all()
    # The theorem gives no rate; near the two-cluster equilibria the speed decays
    # like exp(−0.17 t) in this instance, hence the long horizon.
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, 100.0, 201), rtol=1e-9, atol=1e-11)
    EP = np.asarray(ja.metrics.potential(ys, dyn.query_key(0.0)[0], dyn.beta))
    drop = np.max(-np.diff(EP, axis=-1) / EP[:, :1])
    print(f"largest relative drop of E_P: {drop:.2e}")
    assert drop < 1e-9
    assert pred.check(ys[:, -1], 100.0, tol=1e-5).all()


def test_theorem_32_and_41_overlap_and_scaled_pairs(key):
    d = 3
    dyn = ja.SelfAttentionDynamics(jnp.eye(d)[None], jnp.eye(d)[None])  # U = I = P
    cls = T.classify(dyn)
    assert cls.theorems == ("3.2", "4.1")
    assert "stable equilibria are consensus" in cls["3.2"].statement
    pred = T.predict(dyn, _batch(key, 4, d))
    assert pred.theorem == "4.1" and [p.theorem for p in pred.others] == ["3.2"]
    P = 2.0 * random_spd(key, d)
    assert T.classify(ja.SelfAttentionDynamics(P[None], 0.5 * P[None])).theorems == ("3.2",)
    assert T.classify(ja.SelfAttentionDynamics(P[None], -P[None])).theorems == ()  # c < 0
    assert T.classify(ja.SelfAttentionDynamics(P[None], P[None], beta=-1.0)).theorems == ()


def test_no_theorem_applies(key):
    d = 3
    dyn = ja.SelfAttentionDynamics(jax.random.normal(key, (2, d, d)),
                                   jax.random.normal(jax.random.fold_in(key, 1), (2, d, d)))
    cls = T.classify(dyn)
    assert cls.theorems == () and "no theorem" in cls.summary()
    pred = T.predict(dyn, _batch(key, 4, d))
    assert pred.theorem is None and pred.outcome == "none" and not pred.in_domain.any()
    assert not pred.check(_batch(key, 4, d)).any()
    assert str(pred).startswith("No theorem of paper 001 applies")
    assert "does not apply" in str(cls)


def test_numerical_tolerances_and_schedule_types(key):
    d = 3
    tiny = 1e-12 * jax.random.normal(key, (2, d, d))
    P = jax.random.normal(jax.random.fold_in(key, 1), (2, d, d))
    near = ja.SelfAttentionDynamics(P, _identity(2, d) + tiny)
    assert "4.1" in T.classify(near).theorems  # within the 1e-8 tolerance
    off = ja.SelfAttentionDynamics(P, _identity(2, d) + 1e6 * tiny)  # |U − I| ~ 1e-6
    assert "4.1" not in T.classify(off).theorems
    assert "4.1" in T.classify(off, tol=1e-4).theorems
    # A looped stack of layers jumps: not uniformly continuous (4.1), still bounded (5.1).
    stack = ja.PiecewiseConstant(jax.random.normal(key, (3, 2, d, d)), dt=0.5)
    assert "4.1" not in T.classify(ja.SelfAttentionDynamics(stack, _identity(2, d))).theorems
    causal = ja.SelfAttentionDynamics(stack, _identity(2, d), causal=True)
    assert T.classify(causal).theorems == ("5.1",)
    varying_U = ja.Schedule(lambda t: _identity(1, d) * (1 + 0.1 * jnp.sin(t)))
    dyn = ja.SelfAttentionDynamics(jnp.eye(d)[None], varying_U)
    assert "3.2" not in T.classify(dyn).theorems  # U is not time-invariant
    with pytest.raises(TypeError):
        T.classify("not a model")
    with pytest.raises(KeyError):
        T.classify(dyn)["9.9"]


def _check(report, name):
    (check,) = [c for c in report.checks if c.name == name]
    return check


def test_time_checks_read_the_schedule_or_name_their_grid(key):
    d = 3
    # 40 equal layers but layer 25 (t in [25, 26), past the default grid on [0, 10]):
    # every piece is compared, so U is not time-invariant.
    U = jnp.broadcast_to(jnp.diag(jnp.array([1.0, 0.3, -0.4])), (40, 1, d, d))
    stack = ja.PiecewiseConstant(U.at[25].set(-U[25]), dt=1.0)
    cls = T.classify(ja.SelfAttentionDynamics(jnp.eye(d)[None], stack, causal=True))
    assert cls.theorems == ()
    invariant = _check(cls["5.2"], "U time-invariant")
    assert not invariant.holds and "all 40 pieces, no grid" in invariant.detail
    assert not _check(cls["5.3"], "U differentiable in t").holds
    # Equal pieces: time-invariant and continuous, read without a grid.
    S = random_spd(key, d)
    flat = ja.PiecewiseConstant(jnp.broadcast_to(S, (4, 1, d, d)), dt=0.5)
    cls = T.classify(ja.SelfAttentionDynamics(flat, 2 * S[None]))
    assert cls.theorems == ("3.2",)
    assert "no grid" in _check(cls["3.2"], "P time-invariant").detail
    assert "U has finitely many values" in _check(cls["4.1"], "P, U bounded").detail
    # A Schedule function is sampled, and every check made from it says where.
    varying = ja.Schedule(lambda t: _identity(1, d) * (1 + 0.1 * jnp.sin(t)))
    dyn = ja.SelfAttentionDynamics(S[None], varying)
    for times, grid in ((None, "a grid of 201 times on [0, 10]"),
                        (np.linspace(0.0, 2.0, 5), "a grid of 5 times on [0, 2]")):
        cls = T.classify(dyn, times=times)
        assert grid in _check(cls["3.2"], "U time-invariant").detail
        assert f"U finite where sampled on {grid}" in _check(cls["4.1"], "P, U bounded").detail
        assert "exact: a constant, no grid" in _check(cls["3.2"], "P time-invariant").detail
    assert "not checked" in _check(T.classify(dyn)["5.3"], "U differentiable in t").detail


# --- the traceable tests (`theorem_test`) against the host `predict` -------------------


@pytest.mark.parametrize("v1, message", [
    (np.ones(5), r"got shape \(5,\)\.$"),  # was einsum's message
    (np.zeros(3), "norm 0"),  # was accepted: no token is ever near 0
])
def test_theorem_test_refuses_a_v1_that_is_no_direction(v1, message):
    dyn = ja.random_dynamics(jax.random.PRNGKey(0), 1, 3)
    with pytest.raises(ValueError, match=r"`v1` must be a unit vector of shape \(3,\).*" + message):
        T.theorem_test("5.2", dyn, v1=v1)



def _halves(x0, target):
    """Final states: even samples at `target` (the predicted outcome), odd ones left
    at the start (not reached)."""
    even = (jnp.arange(x0.shape[0]) % 2 == 0)[:, None, None]
    return jnp.where(even, jnp.broadcast_to(target, x0.shape), x0)


def _agree(pred, test, x0, xT, t=None, tol=1e-4):
    """`test.domain` and `test.reached`, jitted and vmapped over the samples, give the
    verdicts (and margins) of `predict` and `Prediction.check`."""
    x0 = ja.normalize(x0, pred.dyn.W)  # predict puts the starts on E_W
    inside, margin = jax.jit(jax.vmap(test.domain))(x0)
    np.testing.assert_array_equal(np.asarray(inside), pred.in_domain)
    np.testing.assert_allclose(np.asarray(margin), pred.margin, rtol=1e-10, atol=1e-14)
    reached = np.asarray(jax.jit(jax.vmap(lambda a, b: test.reached(a, b, t, tol)))(x0, xT))
    # Where the theorem names a limit, `check` is False outside the domain (no limit).
    expected = reached & pred.in_domain if pred.limit is not None else reached
    np.testing.assert_array_equal(expected, pred.check(xT, t, tol))
    # ... which is the theorem's traceable `check` of each sequence
    checked = jax.jit(jax.vmap(lambda a, b: test.check(a, b, t, tol)))(x0, xT)
    np.testing.assert_array_equal(expected, np.asarray(checked))
    return np.asarray(inside), reached


def test_traceable_tests_theorem_41_in_and_out_of_the_hemisphere(key):
    dyn = _paper.sphere_dynamics(key)
    x0 = ja.normalize(_batch(jax.random.fold_in(key, 1), 5, 3))
    pred = T.predict(dyn, x0)
    test = T.theorem_test("4.1", dyn)
    assert isinstance(test, T.Theorem41Test) and test.host_domain
    inside, reached = _agree(pred, test, x0, _halves(x0, x0[:, :1]))
    assert 0 < inside.sum() < B and 0 < reached.sum() < B
    W = random_spd(key, 3)  # on an ellipsoid too
    dyn_W = ja.SelfAttentionDynamics(jax.random.normal(key, (2, 3, 3)), _identity(2, 3), W=W)
    xW = ja.normalize(_batch(jax.random.fold_in(key, 2), 6, 3, W), W)
    inside, _ = _agree(T.predict(dyn_W, xW), T.theorem_test("4.1", dyn_W), xW,
                       _halves(xW, xW[:, :1]))
    assert 0 < inside.sum() < B


def test_traceable_tests_theorem_51_and_its_exceptional_start(key):
    d, n = 4, 6
    dyn = ja.SelfAttentionDynamics(jax.random.normal(key, (2, d, d)), _identity(2, d),
                                   causal=True)
    x0 = ja.normalize(_batch(jax.random.fold_in(key, 1), n, d))
    x0 = x0.at[1, 1].set(-x0[1, 0])  # x₂ = −x₁: outside the domain
    pred = T.predict(dyn, x0)
    assert pred.theorem == "5.1"
    inside, reached = _agree(pred, T.theorem_test("5.1", dyn), x0, _halves(x0, x0[:, :1]))
    assert not inside[1] and inside.sum() == B - 1 and 0 < reached.sum() < B


@pytest.mark.parametrize("theorem", ["5.2", "5.3"])
def test_traceable_tests_theorems_52_53_on_both_sides_of_v1(key, theorem):
    d, n = 3, 4
    if theorem == "5.2":
        dyn, v1 = _symmetric_model(key, d, [1.0, 0.3, -0.4])
    else:
        lam = jnp.array([1.0, 0.2, -0.5])
        dyn = ja.SelfAttentionDynamics(0.5 * jax.random.normal(key, (1, 3, 3)),
                                       ja.Schedule(_rotating, (lam, jnp.asarray(0.1))),
                                       causal=True)
        v1 = jnp.array([1.0, 0.0, 0.0])
    x0 = ja.normalize(_batch(jax.random.fold_in(key, 1), n, d))
    pred = T.predict(dyn, x0)
    assert pred.theorem == theorem
    test = T.theorem_test(theorem, dyn)  # v₁ computed in JAX, of either sign
    side = jnp.where(x0[:, 0] @ v1 >= 0, 1.0, -1.0)[:, None, None]
    target = side * v1[None, None, :]
    inside, reached = _agree(pred, test, x0, _halves(x0, target), t=0.0)
    assert 0 < inside.sum() < B and 0 < reached.sum() < B


def test_traceable_tests_theorem_32_equilibrium(key):
    n, d = 5, 3
    dyn = _paper.gradient_dynamics(key, d)
    x0 = _batch(jax.random.fold_in(key, 1), n, d, dyn.W)
    pred = T.predict(dyn, x0)
    speeds = jax.vmap(lambda x: jnp.max(jnp.abs(dyn.velocity(0.5, x))))(x0)
    tol = float(np.median(speeds))  # half the samples count as at rest
    inside, reached = _agree(pred, T.theorem_test("3.2", dyn), x0, x0, t=0.5, tol=tol)
    assert inside.all() and 0 < reached.sum() < B
    with pytest.raises(ValueError, match="no Theorem"):
        T.theorem_test("9.9", dyn)


def test_check_is_one_program_for_every_time_and_tolerance(key):
    """`Prediction.check` traces once: a second check at a new `t`, `tol` and tokens of
    the same shape reuses the program (t and tol are traced, not baked in)."""
    n, d = 6, 4
    S = random_spd(key, d)
    traces = []

    def P_of_t(t, P):
        traces.append(1)  # runs only when JAX traces the schedule
        return P

    dyn = ja.SelfAttentionDynamics(ja.Schedule(P_of_t, S[None]), S[None])  # W U = P
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d, batch=(3,))
    pred = T.predict(dyn, x0)
    assert pred.theorem == "3.2"
    first = pred.check(x0, 0.5, 1e-3)
    before = len(traces)
    assert before > 0
    second = pred.check(x0 + 0.0, 0.25, 0.5)
    assert len(traces) == before
    test = pred.test
    for got, t, tol in ((first, 0.5, 1e-3), (second, 0.25, 0.5)):
        np.testing.assert_array_equal(got, [bool(test.check(x, x, t, tol)) for x in x0])


def test_check_and_classify_refuse_tolerances_and_shapes_without_meaning(key):
    """`check` with `tol` NaN or negative answered False everywhere, with the wrong batch
    a JAX broadcasting error; `classify(tol=inf)` judged every hypothesis true."""
    dyn = ja.random_dynamics(key, 1, 3)
    x0 = jax.vmap(lambda k: ja.sample_ellipsoid(k, 5, 3))(jax.random.split(key, 4))
    prediction = ja.theory.predict(dyn, x0)
    assert prediction.check(x0).shape == (4,)
    for tol, words in ((float("nan"), "`tol` must be finite"), (-1.0, "`tol` must be > 0")):
        with pytest.raises(ValueError, match=words):
            prediction.check(x0, tol=tol)
    with pytest.raises(ValueError, match=r"Prediction.check: `x` must be tokens of the shape "
                                         r"of the starts \(4, 5, 3\) .* got \(3, 5, 3\)"):
        prediction.check(jnp.ones((3, 5, 3)))
    with pytest.raises(ValueError, match="classify: `tol` must be a finite number > 0, got inf"):
        ja.theory.classify(dyn, tol=float("inf"))


def test_a_top_eigenvalue_crossing_between_read_times_is_not_simple():
    """λ₁(U(t)) = λ₂(U(t)) at t = 4.935, between two read times: the gap at the read
    times is positive, so Theorem 5.3 was said to apply. The top eigenvector's turn
    between the read times shows the crossing; a smooth U with a simple λ₁ keeps 5.3."""
    eye = np.eye(3)[None]
    crossing = ja.Schedule(lambda t: jnp.diag(jnp.array([2 - 0.2 * t, 1.013, 0.5]))[None])
    found = ja.theory.classify(ja.SelfAttentionDynamics(eye, crossing, causal=True))
    assert found.theorems == () and "cross between them" in str(found), str(found)
    smooth = ja.Schedule(lambda t: jnp.diag(jnp.array([2 + 0.1 * jnp.sin(t), 1.0, 0.5]))[None])
    assert ja.theory.classify(ja.SelfAttentionDynamics(eye, smooth, causal=True)).theorems == (
        "5.3",)
