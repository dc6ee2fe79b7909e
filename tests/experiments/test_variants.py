"""The model's variants (issue 17): normalisation placements, windows, masks, the
sigmoid and exp kernels and shared keys, each against NumPy written from the formulas;
their flows as the layers' limits; gradients; the default unchanged bit for bit."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_spd

import jaxattn as ja

SAD = ja.SelfAttentionDynamics
NORMS = ("post", "pre", "peri", "ngpt", "none")
BEFORE = "f1e564c"  # the last commit before the variants: the default must equal it


# --- an independent NumPy model ------------------------------------------------


def _np_allowed(n, causal, window, mask):
    ok = np.ones((n, n), bool)
    for i in range(n):
        for j in range(n):
            if causal and j > i:
                ok[i, j] = False
            if window is not None and abs(i - j) >= window:
                ok[i, j] = False
            if mask is not None and not mask[i, j] and i != j:
                ok[i, j] = False
    return ok


def _np_attention(P, beta, x, ok, kernel, bias):
    h, n = P.shape[0], x.shape[0]
    A = np.zeros((h, n, n))
    for e in range(h):
        for i in range(n):
            js = [j for j in range(n) if ok[i, j]]
            s = np.array([beta * x[i] @ P[e] @ x[j] for j in js])
            if kernel == "softmax":
                a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            elif kernel == "sigmoid":
                b = -np.log(n) if bias is None else bias
                a = 1 / (1 + np.exp(-(s + b)))
            else:
                a = np.exp(s) / n
            A[e, i, js] = a
    return A


def _np_v(m, x):
    """`v_i(x) = Σ_η Σ_j α^η_ij U_η x_j`."""
    A = _np_attention(m["P"], m["beta"], x, m["ok"], m["kernel"], m["bias"])
    return sum(A[e] @ x @ m["U"][e].T for e in range(A.shape[0]))


def _np_N(y, W):
    norms = np.sqrt(np.einsum("id,de,ie->i", y, W, y))
    return y / norms[:, None]


def _np_tangent(x, v, W):
    return v - np.einsum("id,de,ie->i", x, W, v)[:, None] * x


def _np_layer(m, norm, x, tau):
    N = lambda y: _np_N(y, m["W"])  # noqa: E731
    return {
        "post": lambda: N(x + tau * _np_v(m, x)),
        "pre": lambda: x + tau * _np_v(m, N(x)),
        "peri": lambda: x + tau * N(_np_v(m, N(x))),
        "ngpt": lambda: N(x + tau * (N(_np_v(m, x)) - x)),
        "none": lambda: x + tau * _np_v(m, x),
    }[norm]()


def _np_velocity(m, norm, x):
    W, N = m["W"], (lambda y: _np_N(y, m["W"]))
    return {
        "post": lambda: _np_tangent(x, _np_v(m, x), W),
        "pre": lambda: _np_v(m, N(x)),
        "peri": lambda: N(_np_v(m, N(x))),
        "ngpt": lambda: _np_tangent(x, N(_np_v(m, x)), W),
        "none": lambda: _np_v(m, x),
    }[norm]()


def _problem(key, n, d, h, *, causal=False, window=None, mask=None, kernel="softmax",
             bias=None, norm="post", metric=True, groups=None, k=2):
    """A random model (factored with `groups` key groups when given), its NumPy
    description, and tokens off `E_W` (so that the placements differ)."""
    ks = jax.random.split(key, 6)
    U = np.asarray(0.7 * jax.random.normal(ks[0], (h, d, d)))
    W = np.asarray(random_spd(ks[1], d)) if metric else None
    opts = dict(W=W, beta=1.3, causal=causal, norm=norm, window=window, mask=mask,
                kernel=kernel, bias=bias)
    if groups is None:
        P = np.asarray(0.8 * jax.random.normal(ks[2], (h, d, d)))
        dyn = SAD(P, U, **opts)
    else:
        Q = np.asarray(jax.random.normal(ks[2], (h, k, d)))
        K = np.asarray(jax.random.normal(ks[3], (groups, k, d)))
        P = np.stack([Q[e].T @ K[e // (h // groups)] for e in range(h)])
        dyn = SAD.from_factors(Q, K, U, **opts)
    x = np.asarray(jax.random.normal(ks[4], (n, d)))
    m = dict(P=P, U=U, W=np.eye(d) if W is None else W, beta=1.3, kernel=kernel, bias=bias,
             ok=_np_allowed(n, causal, window, None if mask is None else np.asarray(mask)))
    return dyn, m, x


def _assert_matches(dyn, m, x, norm, tau=0.3):
    np.testing.assert_allclose(dyn.velocity(0.0, x), _np_velocity(m, norm, x), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(dyn.layer(0.0, x, tau), _np_layer(m, norm, x, tau), rtol=1e-10,
                               atol=1e-12)


# --- each variant against NumPy ------------------------------------------------


@pytest.mark.parametrize(("norm", "causal"), [("post", False), ("pre", True), ("peri", False),
                                              ("ngpt", True), ("none", False), ("post", True)])
def test_norm_placements_match_formulas(key, norm, causal):
    dyn, m, x = _problem(jax.random.fold_in(key, NORMS.index(norm)), 5, 4, 3, causal=causal,
                         norm=norm)
    _assert_matches(dyn, m, x, norm)
    # the placements differ from one another on tokens off E_W
    assert not np.allclose(dyn.layer(0.0, x, 0.3), SAD(m["P"], m["U"], W=m["W"], beta=1.3,
                           causal=causal, norm="pre" if norm == "post" else "post")
                           .layer(0.0, x, 0.3))


@pytest.mark.parametrize(("causal", "window", "masked"),
                         [(False, 2, False), (True, 3, False), (False, None, True),
                          (True, 2, True)])
def test_windows_and_masks_match_formulas(key, causal, window, masked):
    n = 6
    mask = ja.random_mask(jax.random.fold_in(key, 7), n, 0.4) if masked else None
    norm = "post" if causal else "pre"
    dyn, m, x = _problem(key, n, 3, 2, causal=causal, window=window, mask=mask, norm=norm)
    _assert_matches(dyn, m, x, norm)
    A = dyn.attention(0.0, x)
    assert np.all(np.asarray(A)[:, ~m["ok"]] == 0)  # exactly zero where not allowed
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-12)


@pytest.mark.parametrize(("kernel", "bias"), [("sigmoid", None), ("sigmoid", 0.7),
                                              ("exp", None)])
def test_sigmoid_and_exp_kernels_match_formulas(key, kernel, bias):
    n = 5
    mask = ja.random_mask(jax.random.fold_in(key, 3), n, 0.6)
    dyn, m, x = _problem(key, n, 3, 2, causal=True, mask=mask, kernel=kernel, bias=bias,
                         norm="none", metric=False)
    _assert_matches(dyn, m, x, "none")
    dense, mf, _ = _problem(key, n, 3, 2, kernel=kernel, bias=bias, norm="ngpt")
    _assert_matches(dense, mf, x, "ngpt")
    if kernel == "exp":  # paper 001's unnormalised weights: exp(β x_iᵀ P x_j) / n
        s = 1.3 * np.einsum("id,hde,je->hij", x, mf["P"], x)
        np.testing.assert_allclose(dense.attention(0.0, x), np.exp(s) / n, rtol=1e-12)


@pytest.mark.parametrize("groups", [1, 2])  # multi-query, grouped-query
def test_shared_keys_match_formulas(key, groups):
    dyn, m, x = _problem(key, 5, 6, 4, groups=groups, norm="peri", window=3)
    _assert_matches(dyn, m, x, "peri")
    assert dyn.num_key_value_heads == groups and dyn.num_heads == 4
    np.testing.assert_allclose(dyn.query_key(0.0), m["P"], rtol=1e-12)


def test_isolated_token_attends_to_itself_only(key):
    # A mask that keeps nothing: the diagonal is forced on, so attention is the
    # identity and each token moves by Σ_η U_η x_i (no 0/0, no NaN gradient).
    dyn, m, x = _problem(key, 4, 3, 2, mask=np.zeros((4, 4), bool), metric=False, norm="none")
    np.testing.assert_array_equal(dyn.attention(0.0, x), np.broadcast_to(np.eye(4), (2, 4, 4)))
    np.testing.assert_allclose(dyn.raw_update(0.0, x), x @ m["U"].sum(0).T, rtol=1e-12)
    g = jax.grad(lambda P: jnp.sum(SAD(P, m["U"], mask=dyn.mask).raw_update(0.0, x)))(m["P"])
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g) == 0)


def test_random_mask(key):
    mask = ja.random_mask(key, 40, 0.3)
    assert mask.shape == (40, 40) and mask.dtype == bool and bool(jnp.all(jnp.diag(mask)))
    off = np.asarray(mask)[~np.eye(40, dtype=bool)]
    assert 0.2 < off.mean() < 0.4
    np.testing.assert_array_equal(ja.random_mask(key, 5, 0.0), np.eye(5, dtype=bool))
    assert bool(jnp.all(ja.random_mask(key, 5, 1.0)))
    masks = jax.vmap(lambda k, p: ja.random_mask(k, 6, p))(jax.random.split(key, 3),
                                                          jnp.array([0.0, 0.5, 1.0]))
    assert masks.shape == (3, 6, 6) and int(masks[0].sum()) == 6 and bool(masks[2].all())


# --- flows: the layers' τ → 0 limits -------------------------------------------


@eqx.filter_jit
def _layers(dyn, x0, tau, num):
    """`num` layers of step `tau` (both traced: one compilation for every τ)."""
    return jax.lax.fori_loop(0, num, lambda k, x: dyn.layer(k * tau, x, tau), x0)


@eqx.filter_jit
def _rk4(dyn, x0, T, num=2000):
    """The flow of `dyn.velocity` by classical RK4 with a fine step (error ~1e-13)."""
    dt = T / num

    def step(k, x):
        t, f = k * dt, dyn.velocity
        k1 = f(t, x)
        k2 = f(t + dt / 2, x + dt / 2 * k1)
        k3 = f(t + dt / 2, x + dt / 2 * k2)
        k4 = f(t + dt, x + dt * k3)
        return x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    return jax.lax.fori_loop(0, num, step, x0)


@pytest.mark.parametrize("norm", NORMS)
def test_layers_converge_to_velocity_first_order(key, norm):
    n, d, T = 5, 3, 1.0
    dyn, _, x = _problem(key, n, d, 2, norm=norm, causal=norm in ("pre", "ngpt"), window=4)
    x0 = ja.normalize(x, dyn.W)  # the runners' initial condition
    exact = _rk4(dyn, x0, T)
    taus = np.array([0.04, 0.02, 0.01, 0.005])
    errs = [float(jnp.abs(_layers(dyn, x0, jnp.asarray(tau), jnp.asarray(round(T / tau)))
                          - exact).max()) for tau in taus]
    order = np.polyfit(np.log(taus), np.log(errs), 1)[0]
    print(f"{norm}: errors {errs}, fitted order {order:.3f}")
    assert abs(order - 1) < 0.2
    drift = float(ja.manifold_drift(exact, dyn.W))
    assert (drift < 1e-8) == dyn.stays_on_manifold


def test_runners_and_metrics_take_unnormalised_states(key):
    dyn, m, x = _problem(key, 5, 3, 2, norm="pre", window=2, metric=False)
    ys = ja.run_layers(dyn, x, 4, 0.5)
    x0 = ja.normalize(x)  # run_layers starts from N_W(x0), then leaves E_W
    np.testing.assert_allclose(ys[0], x0, rtol=1e-12)
    np.testing.assert_allclose(ys[1], _np_layer(m, "pre", np.asarray(x0), 0.5), rtol=1e-10)
    assert float(ja.manifold_drift(ys[-1])) > 1e-2
    scale = jnp.exp(jax.random.normal(key, (5, 5, 1)))  # misalignment sees directions only
    np.testing.assert_allclose(ja.misalignment(ys * scale), ja.misalignment(ys), rtol=1e-12)
    # the flow off E_W: solve_flow without its retraction (pre/peri/none leave E_W)
    flow = ja.solve_flow(dyn, x, jnp.array([0.0, 0.5]), on_manifold=dyn.stays_on_manifold,
                         rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(flow[-1], _rk4(dyn, x0, 0.5), rtol=1e-7, atol=1e-9)
    assert float(ja.manifold_drift(flow[-1])) > 1e-3


def test_jit_vmap_over_masks_and_tokens(key):
    dyn, m, x = _problem(key, 5, 3, 2, norm="peri", causal=True)
    masks = jax.vmap(lambda k: ja.random_mask(k, 5, 0.5))(jax.random.split(key, 3))
    xs = jnp.stack([x, 2 * x, -x])

    @jax.jit
    def layer(mask, x):
        dyn = SAD(m["P"], m["U"], W=m["W"], beta=1.3, causal=True, norm="peri", mask=mask)
        return dyn.layer(0.0, x, 0.2)

    out = jax.vmap(layer)(masks, xs)
    for b in range(3):
        mb = dict(m, ok=_np_allowed(5, True, None, np.asarray(masks[b])))
        np.testing.assert_allclose(out[b], _np_layer(mb, "peri", np.asarray(xs[b]), 0.2),
                                   rtol=1e-10)


# --- gradients -----------------------------------------------------------------

VARIANTS = [  # each placement, with one attention variant each
    dict(norm="post", window=2, causal=True), dict(norm="pre", kernel="sigmoid"),
    dict(norm="peri", groups=2), dict(norm="ngpt", kernel="exp"), dict(norm="none", masked=True),
]


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_gradients_match_finite_differences(key, variant):
    variant = dict(variant)
    mask = ja.random_mask(jax.random.fold_in(key, 5), 5, 0.5) if variant.pop("masked", 0) else None
    groups = variant.pop("groups", None)
    dyn, m, x = _problem(key, 5, 4, 2, mask=mask, groups=groups, **variant)
    params, static = eqx.partition(dyn, eqx.is_inexact_array)

    def loss(params, x):
        d = eqx.combine(params, static)
        for k in range(3):
            x = d.layer(k * 0.2, x, 0.2)
        return ja.misalignment(x) + jnp.sum(d.velocity(0.0, x) ** 2)

    g = jax.grad(loss, argnums=(0, 1))(params, x)
    for j in range(2):
        v = jax.tree.map(lambda a: jax.random.normal(jax.random.fold_in(key, j), a.shape),
                         (params, x))
        step = lambda s: jax.tree.map(lambda a, b: a + s * b, (params, x), v)  # noqa: E731
        h = 1e-6
        fd = (loss(*step(h)) - loss(*step(-h))) / (2 * h)
        ad = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(v)))
        print(f"autodiff {float(ad):.10e}, finite difference {float(fd):.10e}")
        assert abs(ad - fd) <= 1e-6 * abs(fd)


# --- the default is today's model ----------------------------------------------


def _module_before():
    root = Path(__file__).resolve().parents[2]
    try:
        src = subprocess.run(["git", "show", f"{BEFORE}:jaxattn/_dynamics.py"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history (commit {BEFORE})")
    path = Path(ja.__file__).parent  # loaded as a sibling, so its relative imports resolve
    spec = importlib.util.spec_from_loader("jaxattn._dynamics_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__, mod.__file__ = "jaxattn", str(path / "_dynamics_before.py")
    sys.modules[spec.name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


@pytest.mark.parametrize(("causal", "factored"), [(False, False), (True, False), (False, True)])
def test_default_is_bit_identical_to_before(key, causal, factored):
    old = _module_before().SelfAttentionDynamics
    ks = jax.random.split(key, 4)
    U, W = jax.random.normal(ks[0], (3, 4, 4)), random_spd(ks[1], 4)
    x = jax.random.normal(ks[2], (6, 4))
    if factored:
        Q, K = jax.random.normal(ks[3], (2, 3, 2, 4))
        new_dyn, old_dyn = (c.from_factors(Q, K, U, W, 0.9, causal) for c in (SAD, old))
    else:
        P = jax.random.normal(ks[3], (3, 4, 4))
        new_dyn, old_dyn = (c(P, U, W, 0.9, causal) for c in (SAD, old))
    for name, args in [("layer", (0.0, x, 0.1)), ("velocity", (0.0, x))]:
        new_fn, old_fn = getattr(new_dyn, name), getattr(old_dyn, name)
        assert str(jax.make_jaxpr(new_fn)(*args)) == str(jax.make_jaxpr(old_fn)(*args))
        np.testing.assert_array_equal(new_fn(*args), old_fn(*args))


# --- refusals ------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(norm="layer"), ValueError, "`norm` must be one of 'post'"),
    (dict(norm=None), ValueError, "`norm` must be one of"),
    (dict(kernel="relu"), ValueError, "`kernel` must be one of 'softmax', 'sigmoid', 'exp'"),
    (dict(window=0), ValueError, "`window` must be a whole number ≥ 1"),
    (dict(window=2.5), ValueError, "`window` must be a whole number"),
    (dict(mask=np.ones((4, 4))), TypeError, "boolean .* pass mask.astype"),
    (dict(mask=np.ones((4, 3), bool)), ValueError, r"\(n, n\) array, got shape \(4, 3\)"),
    (dict(bias=0.5), ValueError, "needs kernel='sigmoid'"),
    (dict(kernel="sigmoid", bias=np.inf), ValueError, "`bias` must be finite"),
])
def test_refusals(kwargs, error, match):
    P = U = jnp.zeros((2, 3, 3))
    with pytest.raises(error, match=match):
        SAD(P, U, **kwargs)


def test_refusals_at_use_and_for_factors():
    U = jnp.zeros((4, 3, 3))
    with pytest.raises(ValueError, match="g=3 groups, which must divide the h=4 heads"):
        SAD.from_factors(jnp.ones((4, 2, 3)), jnp.ones((3, 2, 3)), U)
    with pytest.raises(ValueError, match="`K` \\(h, k, d\\) or \\(g, k, d\\)"):
        SAD.from_factors(jnp.ones((4, 2, 3)), jnp.ones((2, 1, 3)), U)
    dyn = SAD(U, U, mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match=r"n=5 tokens: pass a \(5, 5\) boolean mask"):
        dyn.layer(0.0, jnp.ones((5, 3)), 0.1)
    with pytest.raises(ValueError, match="keep-probability"):
        ja.random_mask(jax.random.PRNGKey(0), 4, 1.5)
    with pytest.raises(ValueError, match="`n` must be a whole number ≥ 1"):
        ja.random_mask(jax.random.PRNGKey(0), 0, 0.5)
