"""Bad input gets a clear error naming the problem, never NaN output."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_dynamics, random_tokens

import jaxattn as ja

EYE = jnp.broadcast_to(jnp.eye(3), (2, 3, 3))
EYE32 = np.broadcast_to(np.eye(3, dtype=np.float32), (2, 3, 3))
ZERO32 = np.zeros((2, 3, 3), np.float32)


@pytest.mark.parametrize(
    "P, U, match",
    [
        (jnp.zeros((2, 3, 4)), EYE, r"`P` must be \(h, d, d\)"),
        (jnp.zeros((3, 3, 3)), EYE, r"\(2, 3, 3\)"),
        (jnp.zeros((2, 3, 3)), jnp.zeros((2, 3, 4)), r"`U` must be \(h, d, d\)"),
        (jnp.zeros((3, 3)), EYE, r"got \(3, 3\)"),
    ],
)
def test_weight_shapes(P, U, match):
    with pytest.raises(ValueError, match=match):
        ja.SelfAttentionDynamics(P, U)


def test_factor_shapes():
    with pytest.raises(ValueError, match=r"`Q` must be \(h, k, d\) and `K`"):
        ja.SelfAttentionDynamics.from_factors(jnp.zeros((2, 4, 3)), jnp.zeros((2, 5, 3)), EYE)
    with pytest.raises(ValueError, match="either `P`"):
        ja.SelfAttentionDynamics(None, EYE)


@pytest.mark.parametrize(
    "W, match",
    [
        (jnp.eye(4), r"d=3"),
        (jnp.array([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]]), "symmetric"),
        (jnp.diag(jnp.array([1.0, -1.0, 1.0])), "positive definite"),
        (jnp.zeros((3, 3)), "positive definite"),
        (jnp.full((3, 3), jnp.nan), "NaN"),
        (jnp.ones(3), "square"),
    ],
)
def test_bad_metric(W, match):
    with pytest.raises(ValueError, match=match):
        ja.SelfAttentionDynamics(jnp.zeros((2, 3, 3)), EYE, W=W)
    if W.ndim == 2:  # the manifold's maps check their metric too
        with pytest.raises(ValueError, match=match):
            ja.normalize(jnp.ones((2, 3)), W)
        with pytest.raises(ValueError, match=match):
            ja.w_norm(jnp.ones((2, 3)), W)
        with pytest.raises(ValueError, match=match):  # before: traced, unchecked, NaN
            ja.sample_ellipsoid(jax.random.PRNGKey(0), 2, 3, W)


@pytest.mark.parametrize("row, match", [(0.0, "is zero"), (jnp.nan, "NaN or inf")])
def test_normalize_refuses_rows_without_a_direction(row, match):
    """Concrete rows are checked (no silent NaN); traced ones are documented NaN."""
    x = jnp.ones((2, 3)).at[1].set(row)
    with pytest.raises(ValueError, match=f"^normalize: .*{match}"):
        ja.normalize(x)
    assert np.isnan(jax.jit(ja.normalize)(x)[1]).all()


@pytest.mark.parametrize("beta", [jnp.nan, jnp.inf, -jnp.inf])
def test_bad_beta(beta):
    with pytest.raises(ValueError, match="beta"):
        ja.SelfAttentionDynamics(jnp.zeros((2, 3, 3)), EYE, beta=beta)


def test_beta_must_be_finite_in_the_model_dtype():
    """β = 1e40 is finite in float64 but inf in float32: refused there, no NumPy warning."""
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match="`beta` = 1e\\+40 overflows float32"):
            ja.SelfAttentionDynamics(ZERO32, EYE32, beta=1e40)
    assert float(ja.SelfAttentionDynamics(jnp.zeros((2, 3, 3)), EYE, beta=1e40).beta) == 1e40


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", ["P", "U", "Q"])
def test_nonfinite_weights_are_refused(where, bad):
    W = np.array(np.broadcast_to(np.eye(3), (2, 3, 3)))
    W[1, 0, 2] = bad
    ok = np.ones((2, 3, 3))
    with pytest.raises(ValueError, match=f"^`{where}` contains NaN or inf"):
        if where == "Q":
            ja.SelfAttentionDynamics.from_factors(W, ok, ok)
        else:
            ja.SelfAttentionDynamics(*((W, ok) if where == "P" else (ok, W)))
    with pytest.raises(ValueError, match="`Constant value` contains NaN or inf"):
        ja.Constant(W)
    with pytest.raises(ValueError, match="`PiecewiseConstant values` contains NaN or inf"):
        ja.PiecewiseConstant(np.stack([ok, W]), 0.1)


@pytest.mark.slow
def test_traced_nonfinite_weights_raise_not_clipped(key):
    """Weights known only inside jit, or given by a Schedule: an inf in P would be
    clipped to a finite logit; it makes the run raise instead."""
    x0 = random_tokens(key, 4, 3)
    P = np.array(jax.random.normal(key, (2, 3, 3)))

    @jax.jit
    def run(P):
        return ja.run_layers(ja.SelfAttentionDynamics(P, EYE), x0, 3, 0.1)

    assert bool(jnp.all(jnp.isfinite(run(P))))
    P[0, 1, 1] = np.inf
    with pytest.raises(Exception, match="NaN or inf"):
        jax.block_until_ready(run(P))
    scheduled = ja.SelfAttentionDynamics(ja.Schedule(lambda t, p: p, jnp.asarray(P)), EYE)
    with pytest.raises(Exception, match="NaN or inf"):
        jax.block_until_ready(ja.solve_flow(scheduled, x0, jnp.array([0.0, 1.0])))
    res = ja.solve_flow(scheduled, x0[None], jnp.array([0.0, 1.0]), throw=False)
    assert not bool(res.success[0])


def test_complex_schedule_is_refused():
    with pytest.raises(TypeError, match="`P` schedule must return real weights"):
        ja.SelfAttentionDynamics(lambda t: (1 + 1j) * jnp.ones((2, 3, 3)), EYE)


@pytest.mark.parametrize("shape", [(1, 0, 0), (0, 3, 3)])
def test_empty_model_is_refused(shape):
    with pytest.raises(ValueError, match="at least one head and d ≥ 1"):
        ja.SelfAttentionDynamics(jnp.zeros(shape), jnp.zeros(shape))


def test_empty_batch_gives_empty_results(key):
    dyn = random_dynamics(key, 2, 3)
    ts = jnp.linspace(0.0, 1.0, 4)
    x0 = jnp.zeros((0, 2, 5, 3))
    assert ja.run_layers(dyn, x0, 3, 0.1).shape == (0, 2, 4, 5, 3)
    assert ja.solve_flow(dyn, x0, ts).shape == (0, 2, 4, 5, 3)
    res = ja.solve_flow(dyn, x0, ts, throw=False)
    assert res.ys.shape == (0, 2, 4, 5, 3) and res.success.shape == res.num_steps.shape == (0, 2)
    # with noise too, as the noisy layers (the noisy flow refused an empty batch)
    noisy = dict(noise=ja.TokenNoise(0.1), key=key)
    assert ja.run_layers(dyn, x0, 3, 0.1, **noisy).shape == (0, 2, 4, 5, 3)
    assert ja.solve_flow(dyn, x0, ts, **noisy).shape == (0, 2, 4, 5, 3)


def test_spectrum_of_nan_is_refused():
    with pytest.raises(Exception, match="`Omega` contains NaN or inf"):
        ja.spectral.spectrum(jnp.full((3, 3), jnp.nan)).case.block_until_ready()


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e38])
def test_tiny_and_huge_float32_tokens_are_valid(key, scale):
    """The zero test is scale-aware and N_W rescales before squaring: tokens of any
    normal size are accepted and give the run of the unit tokens."""
    with jax.enable_x64(False):
        dyn = random_dynamics(key, 2, 3)
        x0 = np.asarray(random_tokens(key, 4, 3), np.float32)
        big = jnp.asarray(scale * x0.astype(np.float64), jnp.float32)
        ts = jnp.array([0.0, 1.0])
        np.testing.assert_allclose(ja.run_layers(dyn, big, 3, 0.1), ja.run_layers(dyn, x0, 3, 0.1),
                                   atol=1e-6)
        np.testing.assert_allclose(ja.solve_flow(dyn, big, ts), ja.solve_flow(dyn, x0, ts),
                                   atol=1e-5)
        with pytest.raises(Exception, match="zero"):  # subnormal: flushed to zero on CPUs
            jax.block_until_ready(ja.run_layers(dyn, jnp.asarray(x0 * 1e-40), 3, 0.1))


def test_metric_positive_definite_is_relative():
    """An SPD W with a large but representable spread of eigenvalues is accepted; one
    whose smallest eigenvalue is below float32's rounding of W is refused there only."""
    with jax.enable_x64(False):
        W = jnp.diag(jnp.array([1e6, 1.0, 1.0], jnp.float32))
        dyn = ja.SelfAttentionDynamics(ZERO32, EYE32, W=W)
        x = ja.run_layers(dyn, jnp.ones((4, 3)), 2, 0.1)
        np.testing.assert_allclose(ja.w_norm(x, W), 1.0, rtol=1e-6)
        with pytest.raises(ValueError, match="positive definite"):
            ja.SelfAttentionDynamics(ZERO32, EYE32, W=np.diag(np.float32([1e8, 1, 1])))
    ja.SelfAttentionDynamics(jnp.zeros((2, 3, 3)), EYE, W=jnp.diag(jnp.array([1e8, 1, 1.0])))


@pytest.mark.parametrize("tau", [0.0, -0.1, jnp.nan, jnp.inf])
def test_bad_tau(key, tau):
    dyn = random_dynamics(key, 2, 3)
    with pytest.raises(ValueError, match="tau"):
        ja.run_layers(dyn, random_tokens(key, 4, 3), 3, tau)


@pytest.mark.parametrize("tau, match", [(1e40, "overflows float32"), (1e-50, "is 0 in float32")])
def test_tau_must_be_representable_in_float32(key, tau, match):
    with jax.enable_x64(False):
        dyn = ja.SelfAttentionDynamics(ZERO32, EYE32)
        with pytest.raises(ValueError, match=f"`tau` = .* {match}"):
            ja.run_layers(dyn, np.ones((4, 3), np.float32), 3, tau)


@pytest.mark.parametrize("num_layers", [-1, 2.5, "3", True])
def test_bad_num_layers(key, num_layers):
    dyn = random_dynamics(key, 2, 3)
    with pytest.raises(ValueError, match="num_layers"):
        ja.run_layers(dyn, random_tokens(key, 4, 3), num_layers, 0.1)


@pytest.mark.parametrize("shape", [(3,), (4, 5), (2, 4, 2), (0, 3)])
def test_bad_token_shapes(key, shape):
    dyn = random_dynamics(key, 2, 3)
    expected = r"\(\.\.\., n, d\): n ≥ 1 tokens of the model's dimension d=3, got"
    with pytest.raises(ValueError, match=expected):
        ja.run_layers(dyn, jnp.ones(shape), 2, 0.1)
    with pytest.raises(ValueError, match=expected):
        ja.solve_flow(dyn, jnp.ones(shape), jnp.array([0.0, 1.0]))


def test_velocity_wants_one_sequence(key):
    dyn = random_dynamics(key, 2, 3)
    with pytest.raises(ValueError, match="jax.vmap"):
        dyn.velocity(0.0, jnp.ones((2, 4, 3)))


@pytest.mark.parametrize("bad", ["zero", "nan", "inf"])
def test_bad_token_values_raise_not_nan(key, bad):
    dyn = random_dynamics(key, 2, 3)
    x0 = np.array(random_tokens(key, 4, 3, batch=(2,)))
    x0[1, 2] = {"zero": 0.0, "nan": np.nan, "inf": np.inf}[bad]
    match = "zero" if bad == "zero" else "NaN or inf"
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(ja.run_layers(dyn, x0, 3, 0.1))
    with pytest.raises(Exception, match=match):
        jax.block_until_ready(ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0])))


def test_bad_ts(key):
    dyn = random_dynamics(key, 2, 3)
    x0 = random_tokens(key, 4, 3)
    with pytest.raises(ValueError, match="nondecreasing"):
        ja.solve_flow(dyn, x0, jnp.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="1-D"):
        ja.solve_flow(dyn, x0, jnp.zeros((2, 2)))
    with pytest.raises(TypeError, match="diffrax solver"):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]), solver="tsit5")
    with pytest.raises(ValueError, match="`max_steps` must be a whole number ≥ 1"):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]), max_steps=0)
    huge = r"`max_steps` must be a whole number in \[1, 2147483647\]"  # was JAX's overflow
    with pytest.raises(ValueError, match=huge):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]), max_steps=10**12)


@pytest.mark.parametrize("adjoint", [dfx.BacksolveAdjoint(), dfx.DirectAdjoint(),
                                     dfx.ForwardMode()])
def test_adjoints_that_cannot_take_the_retraction_are_refused(key, adjoint):
    """They crashed inside diffrax (an augmented state in `scale_rows`; a `ManifoldSolver`
    without `scan_kind`, `ForwardMode` as `DirectAdjoint`)."""
    dyn = random_dynamics(key, 2, 3)
    x0 = random_tokens(key, 4, 3)
    with pytest.raises(ValueError, match="pass on_manifold=False"):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]), adjoint=adjoint)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_failed_full_solution_ends_where_the_run_stopped(key):
    """`solution=True, throw=False` out of steps said `t1 = ts[-1]` with every time saved
    and `y1` NaN outside jit; inside it (diffeqsolve) the stop time, inf, the last state."""
    import equinox as eqx

    dyn = random_dynamics(key, 2, 3, scale=3.0, beta=3.0)
    x0 = random_tokens(key, 4, 3, batch=(3,))
    ts = jnp.linspace(0.0, 10.0, 4)
    run = lambda x: ja.solve_flow(dyn, x, ts, solution=True, throw=False, max_steps=6)  # noqa: E731
    host, traced = run(x0), eqx.filter_jit(run)(x0)
    assert not host.success.any() and np.all(np.asarray(host.t1) < 10)
    np.testing.assert_allclose(host.t1, traced.t1, rtol=1e-12)
    np.testing.assert_allclose(host.y1, traced.y1, rtol=1e-10)
    assert np.isinf(host.ts[:, 1:]).all() and np.isfinite(host.y1).all()


@pytest.mark.slow  # runs a solver to its step limit
def test_out_of_steps(key):
    dyn = random_dynamics(key, 2, 3, scale=2.0)
    xb = random_tokens(key, 4, 3, batch=(3,))
    ts = jnp.array([0.0, 20.0])
    with pytest.raises(Exception, match="max_steps"):
        jax.block_until_ready(ja.solve_flow(dyn, xb, ts, max_steps=3))
    res = ja.solve_flow(dyn, xb, ts, max_steps=3, throw=False)
    assert res.success.shape == (3,) and not res.success.any()
    # the save the run did not reach is not a token (it held x0); as diffeqsolve's, in jit
    np.testing.assert_allclose(res.ys[:, 0], xb, rtol=1e-6)
    assert not np.isfinite(res.ys[:, 1]).any()
    traced = jax.jit(lambda x: ja.solve_flow(dyn, x, ts, max_steps=3, throw=False))(xb)
    assert not np.isfinite(traced.ys[:, 1]).any()
    ok = ja.solve_flow(dyn, xb, ts, throw=False)
    assert ok.success.all() and ok.ys.shape == (3, 2, 4, 3)
    dfx_ok = ja.solve_flow(dyn, xb, ts, solver=dfx.Dopri5(), throw=False)
    np.testing.assert_allclose(dfx_ok.ys, ok.ys, atol=1e-4)


# --- schedules ----------------------------------------------------------------------


@pytest.mark.parametrize("dt", [0.0, -1.0, jnp.nan, jnp.inf, -jnp.inf, 1e-320])
def test_piecewise_constant_bad_dt(dt):
    """dt = 1e-320 is positive in float64 but 0 in the weights' float32."""
    with pytest.raises(ValueError, match="`dt` must"):
        ja.PiecewiseConstant(jnp.zeros((3, 2, 3, 3), jnp.float32), dt)


def test_piecewise_constant_of_no_pieces_is_refused():
    """An empty stack failed at t = 0 only, with an index error."""
    with pytest.raises(ValueError, match=r"with L ≥ 1 pieces, got \(0, 2, 3, 3\)"):
        ja.PiecewiseConstant(jnp.zeros((0, 2, 3, 3)), 0.1)
    with pytest.raises(TypeError, match="`periodic` must be True or False"):  # was taken
        ja.PiecewiseConstant(jnp.ones((2, 2, 3, 3)), 0.1, periodic="x")


def test_piecewise_constant_traced_bad_dt(key):
    stack = jax.random.normal(key, (3, 2, 3, 3))  # not zeros: XLA would fold the slice away
    weights = jax.jit(lambda dt: ja.PiecewiseConstant(stack, dt)(0.5))
    assert weights(1.0).shape == (2, 3, 3)
    with pytest.raises(Exception, match="dt"):
        jax.block_until_ready(weights(0.0))


def test_piecewise_constant_index_does_not_overflow():
    """Times far past 2^31 layers pick layer ⌊t/dt⌋ mod L (periodic) or the last."""
    stack = jnp.arange(5.0)[:, None, None, None] * jnp.ones((5, 1, 2, 2))
    looped = ja.PiecewiseConstant(stack, 1.0)
    held = ja.PiecewiseConstant(stack, 1.0, periodic=False)
    for t, k in [(1e12, 0), (2.0**31 + 2, 0), (2.0**40 + 3, 4), (3e15 + 2, 2)]:
        assert int(jax.jit(lambda s: looped.index(s))(t)) == k, t
        assert float(looped(t)[0, 0, 0]) == k
        assert int(held.index(t)) == 4
    assert int(held.index(-1e12)) == 0 and int(looped.index(-1.0)) == 4
    with jax.enable_x64(False):  # float32: 2^40 + 1 is still a whole number there
        small = ja.PiecewiseConstant(jnp.zeros((5, 1, 2, 2), jnp.float32), 1.0)
        assert int(jax.jit(lambda s: small.index(s))(jnp.float32(2.0**40))) == 2**40 % 5
        assert int(small.index(jnp.float32(2.0**40) * 3)) == (3 * 2**40) % 5


@pytest.mark.parametrize("bad", [0.0, np.nan])
def test_host_checks_raise_what_the_checks_in_jit_surface_as(key, bad):
    """A sharded run checks on the host (the tokens before it, the outputs after it):
    the same `ja.SimulationError`, message and all, as the unsharded run's checks."""
    from jaxattn import _validate

    dyn = random_dynamics(key, 2, 3)
    x0 = np.array(random_tokens(key, 4, 3, batch=(2,)))
    x0[1, 2] = bad
    with pytest.raises(ja.SimulationError) as in_jit:
        ja.run_layers(dyn, x0, 3, 0.1)
    with pytest.raises(ja.SimulationError) as on_host:
        _validate.check_tokens_now(jnp.asarray(x0))
    assert str(on_host.value) == str(in_jit.value)
    huge = ja.SelfAttentionDynamics(np.ones((2, 3, 3)), np.full((2, 3, 3), 1e308))
    with pytest.raises(ja.SimulationError) as in_jit:
        ja.run_layers(huge, random_tokens(key, 4, 3, batch=(2,)), 2, 1.0)
    with pytest.raises(ja.SimulationError) as on_host:
        _validate.raise_unless(jnp.array([True, False]), _validate.NONFINITE)
    assert str(on_host.value) == str(in_jit.value)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_tree_at_sets_beta_to_a_python_float(key):
    """`eqx.tree_at(lambda m: m.beta, dyn, 2.0)`, the obvious idiom, failed deep in the
    scores ("'float' object has no attribute 'astype'"); it is `dataclasses.replace`'s
    model now."""
    import dataclasses

    import equinox as eqx

    dyn = random_dynamics(key, 2, 3)
    x0 = random_tokens(key, 4, 3)
    moved = eqx.tree_at(lambda m: m.beta, dyn, 2.0)
    np.testing.assert_array_equal(ja.run_layers(moved, x0, 3, 0.1),
                                  ja.run_layers(dataclasses.replace(dyn, beta=2.0), x0, 3, 0.1))
    ts = jnp.array([0.0, 0.5])
    np.testing.assert_allclose(ja.solve_flow(moved, x0, ts),
                               ja.solve_flow(dataclasses.replace(dyn, beta=2.0), x0, ts),
                               rtol=1e-12, atol=1e-14)
