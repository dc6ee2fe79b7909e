"""`ja.metrics` against brute force, closed forms, scipy's LP solver and Monte Carlo."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from _helpers import random_spd, random_tokens

import jaxattn as ja
from jaxattn.experiments import paper as _paper

M = ja.metrics


def _cap(key, n, d, spread=0.15):
    """`n` unit tokens near one direction: every pairwise product positive."""
    kc, kx = jax.random.split(key)
    c = ja.sample_ellipsoid(kc, 1, d)[0]
    return ja.normalize(c[None] + spread * jax.random.normal(kx, (n, d)))


# --- V, E_P, residual, entropy ------------------------------------------------------


def test_pairwise_lyapunov_brute_force_and_consensus(key):
    n, d = 5, 4
    W = random_spd(key, d)
    x = random_tokens(jax.random.fold_in(key, 1), n, d, W, batch=(3,))
    brute = [1 - min(float(a @ W @ b) for a, b in itertools.product(xs, xs)) for xs in x]
    np.testing.assert_allclose(M.pairwise_lyapunov(x, W), brute, rtol=1e-12)
    same = jnp.broadcast_to(x[0, :1], (n, d))
    assert abs(float(M.pairwise_lyapunov(same, W))) < 1e-14
    assert float(M.pairwise_lyapunov(x[0], W)) > 1e-3


@pytest.mark.slow  # long flows
@pytest.mark.parametrize("time_varying", [False, True])
def test_pairwise_lyapunov_never_increases_along_the_flow(key, time_varying):
    """Theorem 4.1's V: U = I, full attention, all ⟨x_i, x_j⟩ > 0 ⇒ V nonincreasing."""
    n, d = 6, 3
    if time_varying:
        dyn = _paper.sphere_dynamics(key)
    else:
        P = 1.5 * jax.random.normal(key, (2, d, d))
        dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(d), (2, d, d)))
    x0 = jax.vmap(lambda k: _cap(k, n, d))(jax.random.split(jax.random.fold_in(key, 3), 8))
    assert float(jnp.min(jnp.einsum("bid,bjd->bij", x0, x0))) > 0
    ys = ja.solve_flow(dyn, x0, jnp.linspace(0.0, 6.0, 301), rtol=1e-10, atol=1e-12)
    V = np.asarray(M.pairwise_lyapunov(ys))
    rise = np.diff(V, axis=-1).max()
    print(f"largest rise of V: {rise:.2e}; V(0) = {V[:, 0].min():.3f}, V(T) = {V[:, -1].max():.2e}")
    assert rise < 1e-12
    assert V[:, -1].max() < 1e-3 * V[:, 0].min()


def test_potential_closed_form_and_gradient_flow(key):
    n, d = 4, 3
    dyn = _paper.gradient_dynamics(key, d, beta=0.7)
    P, W = dyn.query_key(0.0)[0], dyn.W
    x = random_tokens(jax.random.fold_in(key, 1), n, d, W, batch=(5,))
    loops = [0.5 * sum(np.exp(0.7 * float(a @ P @ b)) for a in xs for b in xs) for xs in x]
    np.testing.assert_allclose(M.potential(x, P, 0.7), loops, rtol=1e-12)
    # Along the flow of a gradient model dE_P/dt = ⟨∇E_P, ẋ⟩ ≥ 0 at every point.
    grads = jax.vmap(jax.grad(lambda xi: M.potential(xi, P, 0.7)))(x)
    vel = jax.vmap(lambda xi: dyn.velocity(0.0, xi))(x)
    rate = jnp.sum(grads * vel, axis=(-2, -1))
    assert float(rate.min()) > 0
    with pytest.raises(ValueError, match="one head"):
        M.potential(x, dyn.query_key(0.0), 1.0)


def test_rank_collapse_residual(key):
    x = jax.random.normal(key, (3, 5, 4))
    ref = [np.linalg.norm(xi - xi.mean(0)) / np.linalg.norm(xi) for xi in np.asarray(x)]
    np.testing.assert_allclose(M.rank_collapse_residual(x), ref, rtol=1e-12)
    assert float(M.rank_collapse_residual(jnp.ones((5, 4)))) == 0.0
    assert float(M.rank_collapse_residual(jnp.zeros((3, 2)))) == 0.0  # equal tokens: was NaN


def test_attention_entropy_limits(key):
    n, d = 6, 3
    x = ja.sample_ellipsoid(key, n, d)
    zero = ja.SelfAttentionDynamics(jnp.zeros((2, d, d)), jnp.zeros((2, d, d)))
    np.testing.assert_allclose(M.attention_entropy(zero, 0.0, x), np.log(n) * np.ones(2))
    causal = ja.SelfAttentionDynamics(jnp.zeros((1, d, d)), jnp.zeros((1, d, d)), causal=True)
    np.testing.assert_allclose(M.attention_entropy(causal, 0.0, x),
                               [np.mean(np.log(np.arange(1, n + 1)))], rtol=1e-12)
    sharp = ja.SelfAttentionDynamics(jnp.eye(d)[None], jnp.eye(d)[None], beta=1e4)
    assert float(M.attention_entropy(sharp, 0.0, x)[0]) < 1e-6  # each token attends to itself
    assert M.attention_entropy(zero, 0.0, jnp.stack([x, x, x])).shape == (3, 2)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_metrics_compose_with_jit_vmap_grad(key):
    x = random_tokens(key, 5, 3, batch=(4,))
    P = jnp.eye(3)
    for f in (M.pairwise_lyapunov, M.rank_collapse_residual, M.misalignment,
              lambda y: M.potential(y, P, 1.0)):
        np.testing.assert_allclose(jax.jit(jax.vmap(f))(x), f(x), rtol=1e-12)
        g = jax.grad(lambda y: jnp.sum(f(y)))(x)
        assert g.shape == x.shape and bool(jnp.all(jnp.isfinite(g)))
    assert M.misalignment is ja.misalignment


# --- cancellation-free forms (float32) ---------------------------------------------


def _near_consensus(key, n, d, delta, batch):
    """float32 tokens at distance ~`delta` from one direction, and their float64 copy."""
    c = np.asarray(jax.random.normal(key, (d,)))
    x = c + delta * np.asarray(jax.random.normal(jax.random.fold_in(key, 1), batch + (n, d)))
    x32 = x.astype(np.float32)
    return x32, x32.astype(np.float64)


def _one_minus_cos(x, W=None):
    """Reference in float64 (NumPy): 1 − cos_W(x_1, x_i), shape (..., n)."""
    W = np.eye(x.shape[-1]) if W is None else np.asarray(W, np.float64)
    g = np.einsum("...id,de,...je->...ij", x, W, x)
    norms = np.sqrt(np.diagonal(g, axis1=-2, axis2=-1))
    return 1 - g[..., 0, :] / (norms[..., :1] * norms)


def test_misalignment_resolves_small_values_in_float32():
    """1 − mean cos floors at the rounding of the cosines (~1e-7) and goes negative;
    the cancellation-free form resolves E ≈ 1e-14 and is never negative."""
    with jax.enable_x64(False):
        E = M.misalignment(jnp.array([[1.0, 0, 0], [1, 1e-4, 0]], jnp.float32))
        assert E.dtype == jnp.float32
        np.testing.assert_allclose(float(E), 0.5 * (1 - 1 / np.sqrt(1 + 1e-8)), rtol=1e-4)
        tiny = M.misalignment(jnp.array([[1.0, 0, 0], [1, 2e-7, 0]], jnp.float32))
        np.testing.assert_allclose(float(tiny), 1e-14, rtol=1e-3)
        x32, x64 = _near_consensus(jax.random.PRNGKey(0), 7, 3, 1e-3, (200,))
        E = np.asarray(M.misalignment(jnp.asarray(x32)))
        ref = _one_minus_cos(x64).mean(-1)
        np.testing.assert_allclose(E, ref, rtol=1e-3)
        x32, _ = _near_consensus(jax.random.PRNGKey(1), 7, 3, 1e-6, (500,))
        assert np.all(np.asarray(M.misalignment(jnp.asarray(x32))) >= 0)


def test_pairwise_lyapunov_resolves_small_values_in_float32():
    with jax.enable_x64(False):
        W = np.asarray(random_spd(jax.random.PRNGKey(2), 3), np.float32)
        for metric in (None, W):
            x32, x64 = _near_consensus(jax.random.PRNGKey(3), 6, 3, 1e-4, (50,))
            x32 = np.asarray(ja.normalize(jnp.asarray(x32), metric))
            x64 = x32.astype(np.float64)
            V = np.asarray(M.pairwise_lyapunov(jnp.asarray(x32), metric))
            assert V.dtype == np.float32
            # float64 reference of max_ij (1 − cos_W(x_i, x_j)), tokens put on E_W
            ref = np.stack([_one_minus_cos(np.roll(x64, -i, axis=-2), metric)
                            for i in range(6)]).max(axis=(0, -1))
            np.testing.assert_allclose(V, ref, rtol=1e-2)


def test_misalignment_with_a_metric_is_the_span_misalignment(key):
    """misalignment(Y, X₀X₀ᵀ) is the misalignment of the tokens Y X₀ (float64 reference)."""
    n, m, d = 4, 6, 9
    X0 = np.asarray(jax.random.normal(key, (m, d)))
    Y = np.asarray(jax.random.normal(jax.random.fold_in(key, 1), (5, n, m)))
    G = X0 @ X0.T
    np.testing.assert_allclose(M.misalignment(Y, G), _one_minus_cos(Y @ X0).mean(-1),
                               rtol=1e-10)
    W = np.asarray(random_spd(jax.random.fold_in(key, 2), m))
    np.testing.assert_allclose(M.misalignment(Y, W), _one_minus_cos(Y, W).mean(-1), rtol=1e-10)
    with pytest.raises(ValueError, match="d=6"):
        M.misalignment(Y, np.eye(5))


@pytest.mark.parametrize("scale", [1e-25, 1e-20, 1.0, 2e19, 1e38])
def test_metrics_of_tiny_and_huge_float32_tokens(key, scale):
    """Tokens are brought to unit scale by a power of two before squaring: identical
    tokens give 0 at any size, and every metric is scale-invariant."""
    with jax.enable_x64(False):
        x = np.asarray(random_tokens(key, 5, 3, batch=(4,)), np.float32)
        same = np.broadcast_to(x[:, :1], x.shape)
        big = jnp.asarray(scale * same.astype(np.float64), jnp.float32)
        assert np.all(np.asarray(M.misalignment(big)) == 0)
        assert np.all(np.asarray(M.pairwise_lyapunov(big)) == 0)
        xs = jnp.asarray(scale * x.astype(np.float64), jnp.float32)
        for f in (M.misalignment, M.pairwise_lyapunov, M.rank_collapse_residual):
            np.testing.assert_allclose(f(xs), f(jnp.asarray(x)), rtol=1e-5, atol=1e-7)


def test_metrics_keep_float64(key):
    x = np.asarray(random_tokens(key, 5, 3, batch=(2,)), np.float64)
    for f in (M.misalignment, M.pairwise_lyapunov, M.rank_collapse_residual):
        assert f(x).dtype == jnp.float64
        assert f(x.astype(np.float32)).dtype == jnp.float32


# --- consensus time and clusters ----------------------------------------------------


def test_consensus_time_interpolates_exponential_decay():
    ts = jnp.linspace(0.0, 10.0, 11)
    E = jnp.stack([jnp.exp(-ts), jnp.exp(-2 * ts), jnp.full_like(ts, 0.5), jnp.full_like(ts, 1e-6)])
    t = M.consensus_time(ts, E, 1e-3)
    np.testing.assert_allclose(t[:2], [np.log(1e3), np.log(1e3) / 2], rtol=1e-12)
    assert np.isinf(t[2]) and float(t[3]) == 0.0
    # A linear crossing where the later sample is exactly zero.
    lin = M.consensus_time(jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0]), 0.25)
    np.testing.assert_allclose(lin, 0.75)


def test_cluster_count_chains_and_groups(key):
    x = jnp.array([[0.0, 0.0], [0.08, 0.0], [0.16, 0.0], [1.0, 1.0], [1.05, 1.0], [-3.0, 2.0]])
    assert int(M.cluster_count(x, 0.1)) == 3  # the first three chain together
    assert int(M.cluster_count(x, 0.07)) == 5
    perm = jax.random.permutation(key, 6)
    assert int(M.cluster_count(x[perm], 0.1)) == 3
    assert M.cluster_count(jnp.stack([x, x[:, ::-1]]), 0.1).tolist() == [3, 3]


# --- the hemisphere test -------------------------------------------------------------


def _lp_open_hemisphere(u):
    """Independent reference: max t s.t. ⟨y, u_i⟩ ≥ t, |y|_∞ ≤ 1 (scipy's HiGHS LP)."""
    n, d = u.shape
    c = np.zeros(d + 1)
    c[-1] = -1.0
    A = np.hstack([-u, np.ones((n, 1))])
    res = scipy.optimize.linprog(c, A_ub=A, b_ub=np.zeros(n), bounds=[(-1, 1)] * d + [(None, 1)])
    assert res.success
    return -res.fun


@pytest.mark.parametrize("n,d", [(3, 2), (5, 3), (8, 3), (12, 5)])
def test_hemisphere_agrees_with_linear_program(key, n, d):
    x = np.asarray(random_tokens(key, n, d, batch=(40,)))
    h = M.hemisphere(x)
    lp = np.array([_lp_open_hemisphere(xi) for xi in x])
    assert np.array_equal(np.asarray(h.inside), lp > 1e-9)
    assert 0 < h.inside.sum() < 40 or n <= d
    # The certificate is a W-unit vector achieving the margin on every token.
    inside = np.asarray(h.inside)
    z, margin = np.asarray(h.z)[inside], np.asarray(h.margin)[inside]
    np.testing.assert_allclose(np.linalg.norm(z, axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.einsum("bd,bnd->bn", z, x[inside]).min(-1), margin, atol=1e-10)
    assert np.all(np.asarray(h.margin)[~inside] == 0)


def test_hemisphere_margin_is_the_max_min(key):
    """No direction of a fine grid on S² beats the margin; SLSQP on the convex
    program max t s.t. ⟨y, x_i⟩ ≥ t, |y| ≤ 1 reaches it."""
    x = np.asarray(_cap(key, 7, 3, spread=0.5))
    h = M.hemisphere(x)
    assert bool(h.inside)
    th, ph = np.meshgrid(np.linspace(0, np.pi, 801), np.linspace(0, 2 * np.pi, 1601))
    dirs = np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], -1)
    best = (dirs.reshape(-1, 3) @ x.T).min(-1).max()
    res = scipy.optimize.minimize(
        lambda v: -v[3], np.r_[x.mean(0), 0.0], method="SLSQP", options={"ftol": 1e-14},
        constraints=[{"type": "ineq", "fun": lambda v: x @ v[:3] - v[3]},
                     {"type": "ineq", "fun": lambda v: 1 - v[:3] @ v[:3]}],
    )
    print(f"margin {float(h.margin):.10f}, grid best {best:.10f}, SLSQP {-res.fun:.10f}")
    assert best <= float(h.margin) + 1e-12
    assert res.success and abs(-res.fun - float(h.margin)) < 1e-8


def test_hemisphere_degenerate_and_metric(key):
    d = 3
    x = np.asarray(ja.sample_ellipsoid(key, 4, d))
    with_antipode = np.vstack([x, -x[:1]])
    h = M.hemisphere(with_antipode)
    assert not bool(h.inside) and float(h.margin) == 0 and np.all(np.asarray(h.z) == 0)
    great_circle = np.array([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0]])  # closed, not open
    assert not bool(M.hemisphere(great_circle).inside)
    # With a metric W = L Lᵀ the test is the Euclidean one on u = Lᵀx.
    W = np.asarray(random_spd(jax.random.fold_in(key, 1), d))
    xs = np.asarray(random_tokens(jax.random.fold_in(key, 2), 6, d, jnp.asarray(W), batch=(20,)))
    L = np.linalg.cholesky(W)
    hw, he = M.hemisphere(xs, W), M.hemisphere(xs @ L)
    assert np.array_equal(np.asarray(hw.inside), np.asarray(he.inside))
    np.testing.assert_allclose(hw.margin, he.margin, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        M.hemisphere(np.ones(3))


def test_hemisphere_at_any_scale_and_of_any_lengths():
    """Whether tokens share an open hemisphere depends on their directions, and the
    margin (the distance from the origin to their hull) scales with them: at 1e50 the
    margin was |x_1|, at 1e±200 `inside` was False, and lengths 1e5 and 1e-5 were said
    to share no hemisphere."""
    x = np.array([[1.0, 0.1], [0.1, 1.0]])
    want = np.linalg.norm(x.mean(0))  # the hull's nearest point: the midpoint
    for scale in (1e-200, 1e-15, 1.0, 1e50, 1e200):
        h = M.hemisphere(x * scale)
        assert bool(h.inside) and float(h.margin) / scale == pytest.approx(want, rel=1e-12)
    h = M.hemisphere(np.array([[1e5, 0.0], [0.0, 1e-5]]))
    assert bool(h.inside) and float(h.margin) == pytest.approx(1e-5, rel=1e-9)
    assert not bool(M.hemisphere(np.array([[1e5, 0.0], [-1e-5, 0.0]])).inside)


def test_hemisphere_refuses_nan(key):
    x = np.array(random_tokens(key, 5, 3, batch=(2,)))
    x[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        M.hemisphere(x)
    # Traced, the sequence with NaN gets NaN z and margin (not a silent 0); the other
    # is decided as before.
    h = jax.jit(M.hemisphere)(x)
    ok = M.hemisphere(x[:1])
    assert not bool(h.inside[1]) and np.isnan(h.margin[1]) and np.all(np.isnan(h.z[1]))
    assert bool(h.inside[0]) == bool(ok.inside[0])
    np.testing.assert_allclose(h.margin[0], ok.margin[0], rtol=1e-12)


def test_hemisphere_jit_vmap_and_gradient(key):
    x = _cap(key, 5, 3, spread=0.7)
    xs = jnp.stack([x, x[::-1], -x])
    f = jax.jit(jax.vmap(lambda y: M.hemisphere(y).margin))
    np.testing.assert_allclose(f(xs), M.hemisphere(xs).margin, rtol=1e-12)
    g = jax.grad(lambda y: M.hemisphere(y).margin)(x)
    eps = 1e-6
    fd = np.zeros(x.shape)
    for i, j in itertools.product(range(5), range(3)):
        e = jnp.zeros_like(x).at[i, j].set(eps)
        up, down = M.hemisphere(x + e).margin, M.hemisphere(x - e).margin
        fd[i, j] = (float(up) - float(down)) / (2 * eps)
    np.testing.assert_allclose(g, fd, atol=1e-6)


# --- Wendel -------------------------------------------------------------------------


def test_wendel_closed_forms():
    assert M.wendel_probability(3, 3) == 1.0 and M.wendel_probability(1, 1) == 1.0
    assert M.wendel_probability(4, 3) == 7 / 8
    assert M.wendel_probability(6, 3) == 0.5
    assert M.wendel_probability(5, 2) == 5 / 16  # n / 2^{n−1} on the circle
    with pytest.raises(ValueError):
        M.wendel_probability(0, 3)


@pytest.mark.parametrize("n,d", [(6, 3), (10, 4), (7, 2)])
def test_wendel_matches_monte_carlo_with_hemisphere(key, n, d):
    trials = 3000
    x = random_tokens(key, n, d, batch=(trials,))
    freq = float(np.mean(np.asarray(M.hemisphere(x).inside)))
    p = M.wendel_probability(n, d)
    sigma = np.sqrt(p * (1 - p) / trials)
    print(f"n={n} d={d}: Monte Carlo {freq:.4f}, Wendel {p:.4f} (σ = {sigma:.4f})")
    assert abs(freq - p) < 4 * sigma


def test_misalignment_refuses_zero_and_nonfinite_rows():
    """Concrete tokens: a one-line error naming the problem. Traced (inside jit or
    vmap, e.g. as run_layers' observe): no host check, the documented NaN."""
    good = np.array([[1.0, 0, 0], [1, 1e-4, 0], [0, 1, 0]])
    for bad, match in ((0.0, "misalignment: a token \\(row\\) of `x` is zero"),
                       (np.nan, "misalignment: `x` contains NaN or inf"),
                       (np.inf, "misalignment: `x` contains NaN or inf")):
        x = np.stack([good, good])
        x[1, 2] = bad
        with pytest.raises(ValueError, match=match):
            M.misalignment(x)
        with pytest.raises(ValueError, match=match):
            M.misalignment(x, np.eye(3))
        E = jax.jit(M.misalignment)(x)
        assert np.isfinite(E[0]) and np.isnan(E[1])
    tiny = np.full((2, 3), 1e-300)  # tiny but nonzero rows are valid tokens
    assert float(M.misalignment(tiny)) == 0.0


@pytest.mark.parametrize("metric, name", [
    (M.order_parameter, "order_parameter"),
    (M.rank_collapse_residual, "rank_collapse_residual"),
    # these put a NaN token in token 0's cluster (dense; blocked: its own), or gave NaN
    (lambda x: M.cluster_labels(x, 0.1), "cluster_labels"),
    (lambda x: M.cluster_count(x, 0.1), "cluster_count")])
def test_the_plain_token_metrics_refuse_nonfinite_but_take_zero_rows(metric, name):
    """`order_parameter` and `rank_collapse_residual` do not project the tokens: a zero
    row is a valid token, NaN or inf is refused when concrete (NaN when traced)."""
    good = np.array([[1.0, 0, 0], [0, 0, 0], [0, 1, 0]])
    assert np.isfinite(metric(good)).all()
    x = np.stack([good, good])
    x[1, 2, 1] = np.nan
    with pytest.raises(ValueError, match=f"^{name}: `x` contains NaN or inf"):
        metric(x)
    if not name.startswith("cluster"):  # a count of NaN tokens is no number to return
        out = jax.jit(metric)(x)
        assert np.isfinite(out[0]) and np.isnan(out[1])


def test_interaction_energy_takes_unit_tokens_only():
    """Its closed form holds on the sphere: tokens of another length (2x gave 0.218,
    neither the formula's value nor the directions') and a zero row are refused; NaN or
    inf is refused when concrete (NaN when traced), as by the plain token metrics."""
    good = np.array([[1.0, 0, 0], [0.6, 0.8, 0], [0, 1, 0]])
    assert np.isfinite(M.interaction_energy(good, 1.0))
    for bad in (2 * good, good * [[1], [0], [1]]):
        with pytest.raises(ValueError, match="takes unit tokens"):
            M.interaction_energy(bad, 1.0)
    x = np.stack([good, good])
    x[1, 2, 1] = np.nan
    with pytest.raises(ValueError, match="^interaction_energy: `x` contains NaN or inf"):
        M.interaction_energy(x, 1.0)
    out = jax.jit(M.interaction_energy)(x, 1.0)
    assert np.isfinite(out[0]) and np.isnan(out[1])


def test_pairwise_lyapunov_refuses_a_token_without_direction():
    with pytest.raises(ValueError, match="^pairwise_lyapunov: a token .* is zero"):
        M.pairwise_lyapunov(np.array([[0.0, 0, 0], [1, 0, 0]]))


def test_span_misalignment_is_the_cancellation_free_misalignment(key):
    """paper.span_misalignment is ja.misalignment with the metric G: ≥ 0 and resolving
    near-consensus in float32, where 1 − mean cos floors at ~1e-7."""
    with jax.enable_x64(False):
        X0 = np.asarray(jax.random.normal(key, (3, 5)), np.float32)
        G = X0 @ X0.T
        Y = np.eye(3, dtype=np.float32)[[0, 0, 0]] + np.float32(1e-4) * np.eye(3, dtype=np.float32)
        E = _paper.span_misalignment(Y, G)
        np.testing.assert_array_equal(E, M.misalignment(Y, G))
        ref = _one_minus_cos(np.float64(Y) @ np.float64(X0)).mean(-1)
        assert float(E) > 0 and abs(float(E) - ref) < 1e-2 * ref


def test_block_size_zero_is_the_dense_count_as_for_a_model(key):
    """`block_size=0` means the dense path at any n, as `SelfAttentionDynamics`'
    does (it was refused as "a whole number ≥ 1"), and a size past the memory is
    refused in one line."""
    x = np.random.default_rng(0).normal(size=(100, 3))
    assert int(M.cluster_count(x, 0.5, block_size=0)) == int(M.cluster_count(x, 0.5)) == int(
        M.cluster_count(x, 0.5, block_size=7))
    with pytest.raises(ValueError, match="the dense clustering of 1000000 tokens"):
        M.cluster_count(np.ones((10**6, 3)), 0.5, block_size=0)
