"""`ja.explore`: gradients of every objective against finite differences, the
optimiser against its random baseline, constraints at every iterate, adjoints."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import random_dynamics, random_tokens

import jaxattn as ja
from jaxattn.experiments import paper as _paper
from jaxattn.explore import BipartiteWeights
from jaxattn.explore._bipartite import bipartite_log_radius

E = ja.explore


def _fd_check(f, x, key, h=1e-6, rtol=1e-5):
    """Directional derivatives of `f` (scalar or vector valued) at `x` along two
    random directions: reverse mode against central differences, per output."""
    f = jax.jit(f)
    jac = jax.jit(jax.jacrev(f))(x)
    for j in range(2):
        v = jax.random.normal(jax.random.fold_in(key, j), x.shape)
        fd = (f(x + h * v) - f(x - h * v)) / (2 * h)
        ad = jnp.tensordot(jac, v, axes=x.ndim)
        print(f"autodiff {np.asarray(ad)}, finite difference {np.asarray(fd)}")
        assert np.all(np.abs(ad - fd) <= rtol * np.abs(fd) + 1e-12)


def _custom(ts, ys):
    return jnp.sum(ys[-1, :, 0] ** 2) + jnp.mean(ys[:, 1, 1])


def _every_objective(ts, ys, dyn):
    """All built-in objectives and a custom one of the same trajectory: one
    compilation checks every gradient."""
    values = [E.builtin_objective(name)(ts, ys, dyn) for name in E.OBJECTIVES]
    return jnp.stack(values + [_custom(ts, ys)])


@pytest.mark.parametrize("model", [pytest.param("flow", marks=pytest.mark.slow), "layers"])
def test_objective_gradients_match_finite_differences(model, key):
    kd, kx, kv = jax.random.split(key, 3)
    dyn = random_dynamics(kd, h=2, d=3, scale=0.8)
    x0 = random_tokens(kx, 5, 3)
    # The layers run passes a two-argument objective `(ts, ys)`, the flow run three.
    objective = _every_objective if model == "flow" else (
        lambda ts, ys: _every_objective(ts, ys, dyn))
    kw = dict(objective=objective, horizon=1.5, model=model, saves=15, tau=0.1,
              rtol=1e-10, atol=1e-12)
    _fd_check(lambda x: E.consensus_objective(dyn, x, **kw), x0, kv)


def test_weight_gradient_matches_finite_differences(key):
    kd, kx, kv = jax.random.split(key, 3)
    dyn = random_dynamics(kd, h=2, d=3, scale=0.8, causal=True)
    x0 = random_tokens(kx, 4, 3)

    def f(U):
        d = ja.SelfAttentionDynamics(dyn.P, U, causal=True)
        return E.consensus_objective(d, x0, objective="integrated", horizon=1.0,
                                     model="layers", tau=0.1)

    _fd_check(f, dyn.U.value, kv)


@pytest.mark.slow
def test_backsolve_matches_finite_differences_on_a_short_horizon(key):
    dyn = _paper.sphere_dynamics(key)
    x0 = _paper.hemisphere_tokens(jax.random.fold_in(key, 1), 6, 3)
    kw = dict(horizon=0.5, saves=5, rtol=1e-10, atol=1e-12)
    out = E.compare_adjoints(dyn, x0, **kw)
    print("relative difference", out["relative_error"])
    assert out["relative_error"] < 1e-4
    _fd_check(lambda x: E.consensus_objective(dyn, x, adjoint="backsolve", **kw), x0,
              jax.random.fold_in(key, 2))


@pytest.mark.slow  # long adjoint solves
def test_backsolve_is_refused_when_it_disagrees(key):
    dyn = random_dynamics(key, h=1, d=3, scale=0.8)
    x0 = random_tokens(jax.random.fold_in(key, 1), 4, 3)
    # A zero tolerance: any rounding-level difference counts as disagreement.
    with pytest.raises(ValueError, match="backsolve"):
        E.slow_consensus(dyn, init=x0, restarts=1, steps=1, horizon=0.5, saves=5,
                         adjoint="backsolve", adjoint_rtol=0.0)


@pytest.mark.slow  # a full search against a random baseline
def test_optimiser_beats_random_starts_and_tokens_stay_in_the_cap(key):
    dyn = _paper.sphere_dynamics(key)
    res = E.slow_consensus(
        dyn, init=jax.random.fold_in(key, 1), n=6, restarts=4, steps=40, horizon=1.0,
        model="layers", tau=0.1, optimizer=optax.adam(0.05), baseline_samples=32,
        constraints=E.Constraints(hemisphere=jnp.array([0.0, 0.0, 1.0]), margin=0.1),
    )
    print("gain", res.gain, "value", res.value, "baseline median", np.median(res.baseline))
    assert res.gain > 10
    assert res.value > np.max(res.baseline)
    assert res.trace.shape == (41, 4) and res.violation.shape == (41, 4)
    assert np.max(res.violation) < 1e-12
    assert np.min(res.x0 @ jnp.array([0.0, 0.0, 1.0])) >= 0.1 - 1e-12
    np.testing.assert_allclose(np.linalg.norm(res.x0s, axis=-1), 1.0, atol=1e-12)


def test_weight_constraints_hold_at_every_iterate(key):
    kq, ku, kx = jax.random.split(key, 3)
    d = 3
    basis, _ = jnp.linalg.qr(jax.random.normal(ku, (d, d)))
    Ud = (basis * jnp.array([[1.0, 0.3, -0.5]])) @ basis.T
    v1 = basis[:, 0]
    P = jax.random.uniform(kq, (1, d, d), minval=-0.5, maxval=0.5)
    dyn = ja.SelfAttentionDynamics(P, Ud[None], causal=True)
    x0 = _paper.hemisphere_of(kx, v1, 5)
    cons = E.Constraints(train=("P", "U"), norm="spectral", bound={"P": 1.0, "U": 1.0},
                         symmetric=("U",), top_eigenvector=v1, gap=0.1)
    res = E.slow_consensus(dyn, init=x0, target="weights", restarts=3, steps=20, horizon=2.0,
                           model="layers", tau=0.1, constraints=cons, optimizer=optax.adam(0.05))
    assert np.max(res.violation) < 1e-10
    U = np.asarray(res.weights.U.value)  # (R, 1, d, d)
    P = np.asarray(res.weights.P.value)
    np.testing.assert_array_equal(U, np.swapaxes(U, -1, -2))
    assert np.linalg.norm(U, 2, axis=(-2, -1)).max() <= 1 + 1e-12
    assert np.linalg.norm(P, 2, axis=(-2, -1)).max() <= 1 + 1e-12
    for Ur in U[:, 0]:
        lam, vec = np.linalg.eigh(Ur)
        assert abs(abs(vec[:, -1] @ np.asarray(v1)) - 1) < 1e-10
        assert lam[-1] - lam[-2] >= 0.1 - 1e-10
        assert lam[-1] >= 0.1 - 1e-10  # positive λ₁ (it went negative, off Theorem 5.2)
    assert res.value >= res.trace[0].max()


@pytest.mark.slow
def test_gap_of_the_head_sum_holds_at_every_iterate(key):
    kb, kq, kx = jax.random.split(key, 3)
    basis, _ = jnp.linalg.qr(jax.random.normal(kb, (3, 3)))
    Ud = (basis * jnp.array([[0.8, 0.1, -0.4]])) @ basis.T  # ΣU: gap 1.4, λ₁ = 1.6
    P = jax.random.uniform(kq, (2, 3, 3), minval=-0.5, maxval=0.5)
    dyn = ja.SelfAttentionDynamics(P, jnp.stack([Ud, Ud]), causal=True)
    cons = E.Constraints(train=("P", "U"), norm="spectral", bound={"P": 1.0, "U": 1.0},
                         symmetric=("U",), sum_gap=1.2)
    res = E.slow_consensus(dyn, init=kx, n=4, target="both", restarts=3, steps=10,
                           horizon=1.0, model="layers", tau=0.2, constraints=cons,
                           optimizer=optax.adam(0.2))
    assert np.max(res.violation) <= 1e-12
    lam = np.linalg.eigvalsh(np.asarray(res.weights.U.value).sum(axis=1))  # (R, d)
    print("gaps of ΣU", lam[:, -1] - lam[:, -2])
    assert np.all(lam[:, -1] - lam[:, -2] >= 1.2 - 1e-12) and np.all(lam[:, -1] >= 1.2 - 1e-12)
    assert np.all(np.isfinite(res.trace))


@pytest.mark.slow
def test_frobenius_bound_and_fixed_U(key):
    dyn = random_dynamics(key, h=2, d=3, scale=1.0)
    U0 = np.asarray(dyn.U.value)
    res = E.slow_consensus(dyn, init=jax.random.fold_in(key, 2), n=4, target="both",
                           restarts=2, steps=5, horizon=1.0, model="layers", tau=0.2,
                           constraints=E.Constraints(train=("P",), norm="frobenius", bound=0.7))
    assert np.max(res.violation) < 1e-12
    np.testing.assert_array_equal(np.asarray(res.dyn.U.value), U0)
    assert np.linalg.norm(np.asarray(res.weights.P.value), axis=(-2, -1)).max() <= 0.7 + 1e-12


def test_bad_requests_raise(key):
    dyn = random_dynamics(key)
    with pytest.raises(ValueError, match="target"):
        E.slow_consensus(dyn, init=key, n=3, target="bias")
    with pytest.raises(ValueError, match="objective"):
        E.slow_consensus(dyn, init=key, n=3, objective="speed")
    with pytest.raises(ValueError, match="`init` tokens must be"):
        E.slow_consensus(dyn, init=jnp.ones((2, 3, 3)), restarts=3)
    with pytest.raises(ValueError, match="breaks `sum_gap=1e"):  # checked at the entry
        E.slow_consensus(dyn, init=key, n=3, target="weights",
                         constraints=E.Constraints(symmetric=("U",), sum_gap=1e6))
    with pytest.raises(ValueError, match="bound"):
        E.Constraints(norm="spectral")
    with pytest.raises(ValueError, match="top_eigenvector"):
        E.slow_consensus(dyn, init=key, n=3, target="weights",
                         constraints=E.Constraints(symmetric=("U",),
                                                   top_eigenvector=jnp.array([1.0, 0, 0])))


@pytest.mark.slow  # a long constrained search
def test_bipartite_radius_gradient_and_constraints(key):
    v = jnp.array([0.0, 1.0, 0.0])
    k1, k2, k3 = jax.random.split(key, 3)
    w0 = BipartiteWeights(jax.random.normal(k1, (3, 2, 3, 3)), jax.random.normal(k2, (3, 2, 3, 3)))
    w, trace, viol = E.stabilize_bipartite(w0, v, n=5, m=2, steps=15, p_bound=4.0, u_bound=2.0)
    assert trace.shape == (16, 3) and np.max(viol) < 1e-12
    x = E.bipartite_point(v, 5, 2)
    for r in range(3):  # a true fixed point of the layer map at every returned iterate
        dyn = ja.SelfAttentionDynamics(w.P[r], w.U[r])
        np.testing.assert_allclose(dyn.layer(0.0, x, 1.0), x, atol=1e-12)
    wr = jax.tree.map(lambda a: a[0], w)
    _fd_check(lambda U: bipartite_log_radius(BipartiteWeights(wr.P, U), v, 5, 2, 1.0, 1.0),
              wr.U, k3)
    # The smooth bound is ≥ the log spectral radius of the same tangent Jacobian.
    J = E.tangent_jacobian(wr.dynamics(), x, 1.0)
    assert float(bipartite_log_radius(wr, v, 5, 2)) >= float(jnp.log(E.spectral_radius(J)))


def test_bipartite_tools_are_the_spectral_ones():
    """One implementation each: `ja.explore`'s names are `ja.spectral`'s functions."""
    assert E.spectral_radius is ja.spectral.spectral_radius
    assert E.tangent_jacobian is ja.spectral.tangent_jacobian


@pytest.mark.parametrize("model", ["flow", "layers"])
def test_objectives_lower_at_float32_precision(model, key):
    """Every matrix product of every built-in objective (through `consensus_objective`)
    and of the bipartite search's objective states true float32 (`Precision.HIGHEST`)
    for float32 inputs, whatever the backend would default to."""
    kP, kU, kx = jax.random.split(key, 3)
    f32 = jnp.float32
    P, U = (0.5 * jax.random.normal(k, (2, 3, 3), f32) for k in (kP, kU))
    x0 = ja.normalize(jax.random.normal(kx, (5, 3), f32))

    def objectives(dyn, x0):
        return jnp.stack([E.consensus_objective(dyn, x0, objective=name, horizon=0.5,
                                                model=model, saves=5)
                          for name in E.OBJECTIVES])

    def bipartite(w, v):
        return bipartite_log_radius(w, v, 5, 3)

    for fn, args in ((objectives, (ja.SelfAttentionDynamics(P, U), x0)),
                     (jax.grad(bipartite), (BipartiteWeights(P, U), x0[0]))):
        dots = [line.strip() for line in jax.jit(fn).lower(*args).as_text().splitlines()
                if "stablehlo.dot_general" in line]
        print("\n".join(dots))
        assert len(dots) >= 4
        assert all("precision = [HIGHEST, HIGHEST]" in line for line in dots)


def test_negative_steps_are_refused(key):
    dyn = random_dynamics(key)
    with pytest.raises(ValueError, match="`steps` must be a whole number ≥ 0, got -1"):
        E.slow_consensus(dyn, init=key, n=3, steps=-1)
    with pytest.raises(ValueError, match="`baseline_samples` must be a whole number ≥ 0"):
        E.slow_consensus(dyn, init=key, n=3, baseline_samples=-2)
    with pytest.raises(ValueError, match="`steps` must be a whole number ≥ 0, got 2.5"):
        E.slow_consensus(dyn, init=key, n=3, steps=2.5)
    w0 = BipartiteWeights(jnp.zeros((1, 1, 3, 3)), jnp.zeros((1, 1, 3, 3)))
    with pytest.raises(ValueError, match="`steps` must be a whole number ≥ 0, got -1"):
        E.stabilize_bipartite(w0, jnp.array([0.0, 1.0, 0.0]), n=4, m=2, steps=-1)


@pytest.mark.parametrize("options, error, match", [
    ({"optimizer": "adam"}, TypeError, "`optimizer` must be an optax transformation"),
    ({"constraints": 3}, TypeError, "`constraints` must be a ja.explore.Constraints, got int"),
    ({"weight_noise": -1.0}, ValueError, "`weight_noise` must be ≥ 0"),
    ({"adjoint_rtol": -1.0}, ValueError, "`adjoint_rtol` must be ≥ 0"),
    # these ran: a degenerate cap never moved the tokens (violation NaN), n = 1 gave
    # value -inf, an ignored option was silently dropped
    ({"constraints": E.Constraints(hemisphere=jnp.zeros(3))}, ValueError,
     r"`Constraints.hemisphere` must be a finite nonzero direction, got \[0.0, 0.0, 0.0\]"),
    ({"constraints": E.Constraints(hemisphere=jnp.array([jnp.nan, 0.0, 1.0]))}, ValueError,
     "must be a finite nonzero direction"),
    ({"constraints": E.Constraints(hemisphere=jnp.ones(2))}, ValueError,  # was a JAX TypeError
     r"`Constraints.hemisphere` must be a direction of shape \(3,\), got \(2,\)"),
    ({"n": 1}, ValueError, "`n` must be a whole number ≥ 2, got 1"),
    ({"init": 0}, TypeError, "`init` must be a PRNG key .* got int"),
    ({"init": jnp.ones((4, 3)), "n": 10}, ValueError, "`n`=10 disagrees with the `init` tokens' 4"),
    ({"init": jnp.ones((4, 3)).at[2].set(0.0), "n": None}, ValueError, "an `init` token is zero"),
    ({"init": jnp.eye(4, 3) + 1, "n": None, "baseline_samples": 5}, ValueError,
     "`baseline_samples` draws random starts, so it needs a key as `init`"),
    ({"model": "layers", "adjoint": "backsolve"}, ValueError,
     "adjoint='backsolve' is for model='flow'"),
    ({"objective": lambda ys: ys.sum()}, TypeError, "takes 1 arguments"),
])
def test_slow_consensus_refuses_before_any_work(key, options, error, match):
    """Each was an AttributeError deep in the search, or accepted and meaningless."""
    options = {"init": key, "n": 3} | options
    with pytest.raises(error, match=match):
        E.slow_consensus(random_dynamics(key), steps=1, restarts=1, **options)


def test_slow_consensus_takes_tokens_as_a_list_and_refuses_bad_objectives(key):
    """Tokens written out as a list are tokens (they were read as a PRNG key); an
    objective of a vector, or NaN everywhere, is refused in one line (a JAX grad error;
    value -inf and gain NaN)."""
    dyn = random_dynamics(key)
    kw = dict(steps=1, restarts=1, model="layers", horizon=0.5)
    listed = E.slow_consensus(dyn, init=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], **kw)
    array = E.slow_consensus(dyn, init=jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), **kw)
    np.testing.assert_array_equal(listed.values, array.values)
    with pytest.raises(TypeError, match=r"slow_consensus maximises one number; .* shape \(3,\)"):
        E.slow_consensus(dyn, init=key, n=3, objective=lambda ts, ys: ys[-1, 0], **kw)
    with pytest.raises(ValueError, match="the objective was NaN or inf at every start and step"):
        E.slow_consensus(dyn, init=key, n=3, objective=lambda ts, ys: jnp.nan, **kw)
    with pytest.raises(TypeError, match="`factory` must be an optax function"):
        E.NamedOptimizer("adam", learning_rate=0.1)


@pytest.mark.parametrize("options, match", [
    ({"norm": "spectral", "bound": -1.0}, "`bound` must be a finite number > 0 .* got -1.0"),
    ({"norm": "spectral", "bound": float("nan")}, "`bound` must be a finite number > 0"),
    ({"norm": "spectral", "bound": "1"}, "`bound` must be a finite number > 0 .* got '1'"),
    ({"norm": "spectral", "bound": {"Pp": 1.0}}, "unknown weight 'Pp'"),
    ({"gap": -1.0}, "`gap` must be a finite number ≥ 0, got -1.0"),
    # the feasible set is empty: the search broke ‖U‖₂ ≤ 1 by 3 and said it agreed
    ({"norm": "spectral", "bound": 1.0, "top_eigenvector": jnp.array([1.0, 0.0, 0.0]),
      "gap": 5.0}, "`gap` 5.0 cannot be kept with ‖U‖₂ ≤ 1.0"),
])
def test_constraints_refuse_bounds_they_cannot_keep(options, match):
    with pytest.raises(ValueError, match=match):
        E.Constraints(**options)
    assert E.Constraints(train="P").train == ("P",)  # was a TypeError on `+` of str and tuple
    E.Constraints(norm="spectral", bound=1.0, top_eigenvector=jnp.array([1.0, 0.0, 0.0]),
                  gap=1.0)  # at the edge: kept, with λ₁ = 1 and the others ≤ 0
    with pytest.raises(ValueError, match="`gap` 2.0 cannot be kept"):  # λ₁ ≥ 2 > ‖U‖₂
        E.Constraints(norm="spectral", bound=1.0, top_eigenvector=jnp.array([1.0, 0, 0]), gap=2.0)


def test_stabilize_bipartite_refuses_what_it_cannot_keep():
    """A non-unit `v` was used raw by the projection (violation 56, no fixed point);
    bad bounds and shapes ran or failed inside einsum."""
    w0 = BipartiteWeights(jnp.ones((2, 1, 3, 3)), jnp.ones((2, 1, 3, 3)))
    v = jnp.array([1.0, 0.0, 0.0])
    for kw, match in [({"v": 2 * v}, "`v` must be a unit vector"),
                      ({"v": jnp.zeros(3)}, "`v` must be a unit vector"),
                      ({"v": v[:2]}, r"`v` must be a direction \(3,\), got shape \(2,\)"),
                      ({"p_bound": -1.0}, "`p_bound` must be > 0"),
                      ({"tau": float("nan")}, "`tau` must be finite"),
                      ({"m": 4}, "`m` must be in 1..n−1 = 1..3, got 4"),
                      ({"w0": BipartiteWeights(w0.P[0], w0.U[0])},
                       r"must both be \(restarts, h, d, d\), got \(1, 3, 3\)")]:
        args = {"w0": w0, "v": v, "n": 4, "m": 2, "steps": 1} | kw
        with pytest.raises(ValueError, match=match):
            E.stabilize_bipartite(args.pop("w0"), args.pop("v"), **args)


def test_tokens_with_nan_and_batches_are_refused(key):
    dyn = random_dynamics(key)
    x0 = jnp.ones((4, 3)).at[1, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="`init` tokens contain NaN or inf"):  # was: a run
        E.slow_consensus(dyn, init=x0, steps=1, restarts=1)
    with pytest.raises(ValueError, match=r"`x0` must be one sequence of tokens \(n, d\), got "
                                         r"shape \(1, 4, 3\); use jax.vmap"):  # was JAX's grad
        E.compare_adjoints(dyn, jnp.ones((1, 4, 3)))
    with pytest.raises(ValueError, match="`eps` must be > 0"):
        E.builtin_objective("consensus_time", eps=-1.0)


def test_the_default_objective_is_symmetric_and_the_baseline_median_is_reported(key):
    """slow_consensus maximises the pairwise misalignment by default (the same value
    whatever the tokens' order, unlike E against token 1), and reports the baseline's
    median beside its mean."""
    dyn = random_dynamics(key, h=1, d=3, scale=0.5)
    x0 = random_tokens(jax.random.fold_in(key, 1), 4, 3)
    kw = dict(restarts=1, steps=0, horizon=0.5, saves=5)
    res = E.slow_consensus(dyn, init=x0, **kw)
    flipped = E.slow_consensus(dyn, init=x0[::-1], **kw)
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, 0.5, 6))
    np.testing.assert_allclose(res.value, ja.metrics.pairwise_misalignment(ys[-1]), rtol=1e-6)
    np.testing.assert_allclose(flipped.value, res.value, rtol=1e-6)
    final = E.slow_consensus(dyn, init=x0, objective="final", **kw)
    np.testing.assert_allclose(final.value, ja.misalignment(ys[-1]), rtol=1e-6)
    assert res.baseline_median == np.median(res.baseline)
    assert res.baseline_mean == np.mean(res.baseline)
    np.testing.assert_allclose(res.gain_median, res.value / np.median(res.baseline))
    # gain and gain_median count the pick of the best start; gain_best does not
    picked = E.slow_consensus(dyn, init=key, n=4, restarts=3, steps=0, horizon=0.5, saves=5)
    assert picked.gain > 1 and picked.gain_median > 1  # no step taken
    assert picked.gain_best == 1.0


@pytest.mark.parametrize("options, match", [
    # the bound was silently ignored (‖P‖₂ = 7.66 against bound 0.5, no violation reported)
    ({"bound": 0.5}, "`bound` needs a `norm`"),
    ({"sum_gap": "a"}, "`sum_gap` must be a finite number > 0, got 'a'"),  # a raw TypeError
    ({"hemisphere": jnp.ones(3), "margin": "a"}, "`margin` must be a number in"),
])
def test_constraints_refuse_a_bound_without_norm_and_non_numbers(options, match):
    with pytest.raises(ValueError, match=match):
        E.Constraints(**options)


def test_a_search_whose_every_step_is_skipped_is_refused(key):
    """adam(nan) skipped every step as non-finite and returned the starts unchanged."""
    dyn = random_dynamics(key)
    kw = dict(init=key, n=4, steps=2, restarts=2, horizon=0.5, model="layers")
    with pytest.raises(ValueError, match="every step of every restart was skipped"):
        E.slow_consensus(dyn, optimizer=optax.adam(float("nan")), **kw)


def test_slow_consensus_refuses_a_non_bool_log_and_one_token(key):
    dyn = random_dynamics(key)
    kw = dict(steps=1, restarts=1, model="layers", horizon=0.5)
    with pytest.raises(TypeError, match="`log` must be True or False, got 'yes'"):
        E.slow_consensus(dyn, init=key, n=3, log="yes", **kw)
    # one token: value 0 and gain NaN (n ≥ 2 was enforced only for a key as init)
    with pytest.raises(ValueError, match="`init` tokens must number n ≥ 2"):
        E.slow_consensus(dyn, init=jnp.ones((1, 3)), **kw)


def test_slow_consensus_refuses_what_would_search_nothing_or_descend(key):
    dyn = random_dynamics(key)
    kw = dict(steps=1, restarts=1, model="layers", horizon=0.5)
    # tokens at one point: "every step skipped ... check the optimizer" (log E = −inf)
    with pytest.raises(ValueError, match="restart 0 are a consensus already"):
        E.slow_consensus(dyn, init=jnp.tile(jnp.array([[0.0, 0.0, 2.0]]), (4, 1)), **kw)
    # a key's random starts may or may not share a hemisphere: it ran for some seeds
    with pytest.raises(ValueError, match=r"hemisphere='start'\) .* pass tokens as `init`"):
        E.slow_consensus(dyn, init=key, n=4, constraints=E.Constraints(hemisphere="start"),
                         **kw)
    with pytest.raises(ValueError, match="`learning_rate` must be > 0"):  # it minimised
        E.NamedOptimizer(optax.adam, learning_rate=-0.5)
    with pytest.raises(TypeError, match="`horizon` must be a real number, got '3'"):  # ran
        E.slow_consensus(dyn, init=key, n=4, **{**kw, "horizon": "3"})


def test_consensus_objective_raises_at_the_step_budget(key):
    """It returned NaN where ja.solve_flow raises for concrete inputs."""
    dyn = random_dynamics(key)
    x0 = random_tokens(key, 4, 3)
    with pytest.raises(ValueError, match="reached `max_steps` before the horizon"):
        E.consensus_objective(dyn, x0, max_steps=2)
    with pytest.raises(ValueError, match="reached `max_steps` before the horizon"):
        jax.grad(lambda x: E.consensus_objective(dyn, x, max_steps=2))(x0)  # traced x
    assert np.isfinite(float(E.consensus_objective(dyn, x0)))


def test_stabilize_bipartite_refuses_nan_weights():
    w0 = BipartiteWeights(jnp.ones((2, 1, 3, 3)).at[0, 0, 0, 0].set(jnp.nan),
                          jnp.ones((2, 1, 3, 3)))
    with pytest.raises(ValueError, match="`w0` contains NaN or inf"):
        E.stabilize_bipartite(w0, jnp.array([1.0, 0.0, 0.0]), n=4, m=2, steps=1)
