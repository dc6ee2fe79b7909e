"""Stochastic dynamics: `noise=` in `ja.solve_flow` and `ja.run_layers` (`jaxattn._noise`),
and the noisy transformer's thresholds (`ja.theory.noisy_threshold`, `noisy_beta_star`)."""

import math

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn._noise import brownian_path, noisy_layer

NOISES = (ja.TokenNoise, ja.ValueNoise)
# The second noise repeats the first's program with another diffusion: slow (CI runs it).
SECOND_SLOW = [NOISES[0], pytest.param(NOISES[1], marks=pytest.mark.slow)]


def _model(key, d=3, scale=1.0, norm="post"):
    return ja.random_dynamics(key, 2, d, scale=scale, norm=norm)


def _free(d, h=1):
    """The interaction off: `U = 0`, so tokens only diffuse."""
    return ja.SelfAttentionDynamics(jnp.zeros((h, d, d)), jnp.zeros((h, d, d)))


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("Noise", SECOND_SLOW)
def test_same_key_same_path_and_batch_members(Noise, key):
    k1, k2, k3 = jax.random.split(key, 3)
    dyn, x0 = _model(k1), jax.random.normal(k2, (3, 5, 3))
    ts = jnp.linspace(0.0, 0.4, 3)
    flow = lambda x, k: ja.solve_flow(dyn, x, ts, noise=Noise(0.7), key=k, dt0=0.02)  # noqa: E731
    layers = lambda x, k: ja.run_layers(dyn, x, 6, 0.1, noise=Noise(0.7), key=k)  # noqa: E731
    for run in (flow, layers):
        a, b = run(x0, k3), run(x0, k3)
        np.testing.assert_array_equal(a, b)
        other = run(x0, jax.random.fold_in(k3, 1))
        assert float(jnp.max(jnp.abs(other - a))) > 1e-3  # the key matters
        one = run(x0[2], jax.random.split(k3, 3)[2])
        np.testing.assert_allclose(a[2], one, rtol=0, atol=1e-13)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_noise_none_is_the_deterministic_run(norm, key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1, norm=norm), jax.random.normal(k2, (2, 4, 3))
    ts = jnp.linspace(0.0, 0.5, 3)
    manifold = dyn.stays_on_manifold
    np.testing.assert_array_equal(
        ja.solve_flow(dyn, x0, ts, noise=None, on_manifold=manifold),
        ja.solve_flow(dyn, x0, ts, on_manifold=manifold))
    np.testing.assert_array_equal(ja.run_layers(dyn, x0, 5, 0.1, noise=None),
                                  ja.run_layers(dyn, x0, 5, 0.1))
    # σ = 0: the deterministic run with the same solver and steps, to rounding.
    for Noise in NOISES:
        quiet = ja.solve_flow(dyn, x0, ts, noise=Noise(0.0), key=k2, solver=dfx.Heun(),
                              dt0=0.05, on_manifold=manifold)
        plain = ja.solve_flow(dyn, x0, ts, solver=dfx.Heun(), dt0=0.05, on_manifold=manifold,
                              stepsize_controller=dfx.ConstantStepSize())
        np.testing.assert_allclose(quiet, plain, rtol=0, atol=1e-13)
        np.testing.assert_allclose(ja.run_layers(dyn, x0, 5, 0.1, noise=Noise(0.0), key=k2),
                                   ja.run_layers(dyn, x0, 5, 0.1), rtol=0, atol=1e-13)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("d", [2, 3])
def test_free_brownian_motion_on_the_sphere(d, key):
    """`E⟨x(t), x(0)⟩ = exp(−(d − 1) σ² t / 2)` for Brownian motion on `S^{d−1}`,
    within 4 standard errors; tokens of 100 systems are independent samples."""
    sigma, T = 0.8, 0.5
    x0 = ja.sample_ellipsoid(key, 2000, d).reshape(100, 20, d)
    ys = ja.solve_flow(_free(d), x0, jnp.array([0.0, T]), noise=ja.TokenNoise(sigma),
                       key=jax.random.fold_in(key, 1), dt0=0.01)
    c = np.asarray(jnp.sum(ys[:, -1] * x0, axis=-1)).ravel()
    exact = math.exp(-(d - 1) * sigma**2 * T / 2)
    assert abs(c.mean() - exact) < 4 * c.std(ddof=1) / math.sqrt(c.size)
    assert np.allclose(np.linalg.norm(ys, axis=-1), 1, atol=1e-12)


def test_stationary_law_is_uniform(key):
    """Long runs of free noisy layers: mean ≈ 0 and second moment ≈ I/d (4 SE)."""
    d = 3
    x0 = jnp.broadcast_to(jnp.eye(d)[0], (100, 20, d))  # all at one point: far from uniform
    ys = ja.run_layers(_free(d), x0, 60, 0.1, noise=ja.TokenNoise(1.0), key=key)
    x = np.asarray(ys[:, -1]).reshape(-1, d)
    se = np.sqrt(1 / d / x.shape[0])
    assert np.all(np.abs(x.mean(0)) < 4 * se)
    outer = x[:, :, None] * x[:, None, :]
    se2 = outer.std(0, ddof=1) / math.sqrt(x.shape[0])
    assert np.all(np.abs(outer.mean(0) - np.eye(d) / d) < 4 * se2)


def _layers_on_path(dyn, noise, x0, W, T):
    """The noisy layers of step `T / L`, their `ξ` the increments of the Brownian path's
    values `W` at the `L + 1` layer times."""
    L = W.shape[0] - 1
    tau = T / L

    def step(x, k_xi):
        k, xi = k_xi
        return noisy_layer(dyn, noise, k * tau, x, tau, xi), None

    xis = (W[1:] - W[:-1]) / math.sqrt(tau)
    return jax.lax.scan(step, ja.normalize(x0), (jnp.arange(L, dtype=x0.dtype), xis))[0]


@pytest.mark.slow  # warm: over ~5 s (make test stays the fast loop)
@pytest.mark.parametrize("Noise", NOISES)
def test_layers_converge_strongly_to_the_sde(Noise, key):
    """Same Brownian path: the layers' error against a fine solve falls at least like
    τ^0.4 over three halvings (measured ≈ 0.5, docs/noise.md)."""
    T, n, d, paths = 0.5, 4, 3, 8
    dyn = _model(key, d, scale=0.5)
    noise = Noise(0.6)
    Ls = (8, 16, 32, 64)
    errors = np.zeros(len(Ls))
    layers = jax.jit(_layers_on_path, static_argnums=(4,))
    # The path read once at the finest layers' times (every coarser time among them):
    # the layers' programs hold no path, so no host callback of its checks, and XLA's
    # persistent cache keeps them.
    times = jnp.arange(Ls[-1] + 1) * (T / Ls[-1])
    for p in range(paths):
        kp = jax.random.fold_in(key, p)
        x0 = jax.random.normal(jax.random.fold_in(kp, 1), (n, d))
        ref = ja.solve_flow(dyn, x0, jnp.array([0.0, T]), noise=noise, key=kp,
                            dt0=T / 1024, max_steps=2048)[-1]
        W = jax.vmap(brownian_path(noise, kp, 0.0, T, n, d, x0.dtype).evaluate)(times)
        for i, L in enumerate(Ls):
            W_L = W[::Ls[-1] // L]
            errors[i] += float(jnp.sum((layers(dyn, noise, x0, W_L, T) - ref) ** 2))
    errors = np.sqrt(errors / paths)
    slope = np.polyfit(np.log(T / np.array(Ls)), np.log(errors), 1)[0]
    print("strong errors", errors, "order", slope)
    assert slope >= 0.4


def test_layers_converge_weakly(key):
    """Free noisy layers: the bias of `E⟨x_L, x_0⟩` against the exact decay falls like
    τ (weak order ≈ 1, asserted ≥ 0.7) as τ halves."""
    d, sigma, T = 3, 1.0, 1.0
    exact = math.exp(-(d - 1) * sigma**2 * T / 2)
    x0 = jnp.broadcast_to(jnp.eye(d)[0], (400, 50, d))
    biases = []
    for L in (10, 20, 40):
        ys = ja.run_layers(_free(d), x0, L, T / L, noise=ja.TokenNoise(sigma), key=key,
                           observe=lambda x: x[:, 0])
        c = np.asarray(ys[:, -1]).ravel()
        se = c.std(ddof=1) / math.sqrt(c.size)
        biases.append(c.mean() - exact)
        assert abs(biases[-1]) > 4 * se  # resolved above the Monte Carlo error
    slope = np.polyfit(np.log([10, 20, 40]), np.log(np.abs(biases)), 1)[0]
    print("weak biases", biases, "order", -slope)
    assert -slope >= 0.7


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("Noise", SECOND_SLOW)
def test_gradient_on_a_fixed_path_matches_finite_differences(Noise, key):
    k1, k2, k3 = jax.random.split(key, 3)
    dyn, x0 = _model(k1, scale=0.5), jax.random.normal(k2, (4, 3))
    direction = jax.random.normal(k3, dyn.U.value.shape)
    weights = jax.random.normal(jax.random.fold_in(k3, 1), (4, 3))

    def loss(eps, run):
        model = ja.SelfAttentionDynamics(dyn.P.value, dyn.U.value + eps * direction)
        return jnp.sum(weights * run(model)[-1])

    flow = lambda m: ja.solve_flow(m, x0, jnp.array([0.0, 0.3]), noise=Noise(0.5),  # noqa: E731
                                   key=k3, dt0=0.01, max_steps=64)
    layers = lambda m: ja.run_layers(m, x0, 8, 0.05, noise=Noise(0.5), key=k3)  # noqa: E731
    for run in (flow, layers):
        g = jax.grad(loss)(0.0, run)
        h = 1e-5
        fd = (loss(h, run) - loss(-h, run)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


def test_noise_refuses_bad_calls(key):
    dyn, x0, ts = _model(key), jnp.ones((2, 3, 3)), jnp.array([0.0, 1.0])
    with pytest.raises(ValueError, match="key"):
        ja.run_layers(dyn, x0, 2, noise=ja.TokenNoise(1.0))
    with pytest.raises(ValueError, match="noise"):
        ja.run_layers(dyn, x0, 2, key=key)
    with pytest.raises(TypeError, match="TokenNoise"):
        ja.solve_flow(dyn, x0, ts, noise=0.5, key=key, dt0=0.1)
    with pytest.raises(ValueError, match="dt0"):
        ja.solve_flow(dyn, x0, jnp.zeros(2), noise=ja.TokenNoise(1.0), key=key)
    # steps below the Brownian tree's resolution read interpolated increments
    with pytest.raises(ValueError, match="below the Brownian path's resolution"):
        ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(1.0), key=key, dt0=1e-5)
    with pytest.raises(ValueError, match="horizon, which must then be"):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 0.01]), noise=ja.TokenNoise(1.0), key=key)
    with pytest.raises(ValueError, match="general"):
        ja.solve_flow(dyn, x0, ts, noise=ja.ValueNoise(1.0), key=key, dt0=0.1, strategy="fused")
    with pytest.raises(ValueError, match="sigma"):
        ja.TokenNoise(-1.0)
    with pytest.raises(ValueError, match="tokens"):
        ja.run_layers(dyn, x0, 2, noise=ja.TokenNoise(1.0), key=key, shard="tokens")


@pytest.mark.slow  # warm: over ~2 s (make test stays the fast loop)
def test_a_noisy_flow_takes_a_thousand_steps_by_default(key):
    dyn, x0, ts = _model(key), jnp.ones((2, 3, 3)), jnp.array([0.0, 1.0])
    default = ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(1.0), key=key)
    np.testing.assert_array_equal(default, ja.solve_flow(
        dyn, x0, ts, noise=ja.TokenNoise(1.0), key=key, dt0=1 / 1000))


def test_a_noisy_flow_takes_sde_solvers_only(key):
    """An ODE-only solver (`Tsit5`) with `noise=` is refused in one line (it failed 25
    frames deep in diffrax); `ja.RK4()`, marked Stratonovich, and the retraction around
    it, marked as its solver, run with no warning of an unmarked solver."""
    import warnings

    from jaxattn._strategy.solve import manifold_solver

    dyn, x0, ts = _model(key), jnp.ones((2, 3, 3)), jnp.array([0.0, 0.1])
    with pytest.raises(ValueError, match="`noise=` needs an SDE solver.*got Tsit5"):
        ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(1.0), key=key, solver=dfx.Tsit5())
    assert isinstance(manifold_solver(ja.RK4(), None), dfx.AbstractStratonovichSolver)
    assert isinstance(manifold_solver(dfx.Euler(), None), dfx.AbstractItoSolver)
    assert not isinstance(manifold_solver(dfx.Tsit5(), None), dfx.AbstractItoSolver
                          | dfx.AbstractStratonovichSolver)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not marked as converging")
        ys = ja.solve_flow(dyn, x0, ts, noise=ja.ValueNoise(0.5), key=key, dt0=0.05,
                           solver=ja.RK4())
    assert np.all(np.isfinite(ys))


def _bessel_series(nu, beta, terms=60):
    return sum((beta / 2) ** (2 * k + nu) / (math.factorial(k) * math.gamma(k + nu + 1))
               for k in range(terms))


@pytest.mark.parametrize("d", [2, 3, 5])
def test_noisy_threshold_and_beta_star_against_series(d):
    nu = d / 2
    for beta in (1e-8, 0.3, 1.0, 4.0):
        series = beta**nu / (2**nu * math.gamma(nu) * _bessel_series(nu, beta))
        assert math.isclose(ja.theory.noisy_threshold(beta, d), series, rel_tol=1e-12)
    assert math.isclose(ja.theory.noisy_threshold(1e-8, d), d / 2, rel_tol=1e-9)  # K_#(0⁺)
    b = ja.theory.noisy_beta_star(d)
    ratio = _bessel_series(nu + 1, b) / _bessel_series(nu, b)
    assert math.isclose(ratio, 1 / d, rel_tol=1e-12)
    with pytest.raises(ValueError, match="d"):
        ja.theory.noisy_threshold(1.0, 1)


@pytest.mark.slow  # a 4-device subprocess
def test_noisy_systems_split_over_devices_equal_one_device():
    from _helpers import run_on_forced_devices

    script = """
import json, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import jaxattn as ja
dyn = ja.random_dynamics(jax.random.PRNGKey(0), 2, 3, beta=2.0)
x = jax.random.normal(jax.random.PRNGKey(1), (6, 5, 3))
key = jax.random.PRNGKey(7)
errs = {}
for name, noise in [("token", ja.TokenNoise(0.4)), ("value", ja.ValueNoise(0.4))]:
    for strategy in ("general", "fused"):
        one = ja.run_layers(dyn, x, 4, 0.1, noise=noise, key=key, strategy=strategy)
        four = ja.run_layers(dyn, x, 4, 0.1, noise=noise, key=key, strategy=strategy,
                             devices=4)
        errs[f"layers {name} {strategy}"] = float(jnp.abs(one - four).max())
    ts = jnp.linspace(0.0, 0.5, 3)
    one = ja.solve_flow(dyn, x, ts, noise=noise, key=key, dt0=0.05)
    four = ja.solve_flow(dyn, x, ts, noise=noise, key=key, dt0=0.05, devices=4)
    errs[f"flow {name}"] = float(jnp.abs(one - four).max())
print(json.dumps({"devices": len(jax.devices()), "errs": errs}))
"""
    res = run_on_forced_devices(script, timeout=300)
    assert max(res["errs"].values()) < 1e-12, res["errs"]


def _noisy_flow_grad(dyn, x0, ts, key, strategy):
    return jax.grad(lambda s: jnp.sum(ja.solve_flow(
        dyn, x0, ts, noise=ja.TokenNoise(s), key=key, dt0=0.5, strategy=strategy)))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_the_member_the_kernels_gradient_refusal_names_runs_the_noisy_flow(key):
    """The refusal pointed to BatchLast, which runs no noisy flow; Vmap does."""
    dyn, x0, ts = _model(key), jnp.ones((2, 3, 3)), jnp.array([0.0, 1.0])
    assert np.isfinite(_noisy_flow_grad(dyn, x0, ts, key, ja.Vmap())(0.5))


def test_refusals_before_the_run_in_one_line(key):
    """Each was a JAX error many lines long, or a refusal after the run: a gradient
    through σ or τ on the kernel (JAX's "Linearization failed"), a traced `dt0`
    (ConcretizationTypeError), a σ that overflows the default float (inf, then the
    weights blamed), a step budget the constant steps exceed (found after 9 s), and a
    measure of more layers than the memory holds (it ran)."""
    dyn, x0, ts = _model(key), jnp.ones((2, 3, 3)), jnp.array([0.0, 1.0])

    def one_line(error, match, run):
        with pytest.raises(error, match=match) as info:
            run()
        assert "\n" not in str(info.value)

    kernel = "strategy='kernel' is not differentiable"
    one_line(ValueError, kernel, lambda: jax.grad(lambda s: jnp.sum(ja.run_layers(
        dyn, x0, 2, 0.1, noise=ja.TokenNoise(s), key=key, strategy="kernel")))(0.5))
    one_line(ValueError, kernel, lambda: jax.grad(lambda t: jnp.sum(ja.run_layers(
        dyn, x0, 2, t, strategy="kernel")))(0.1))
    one_line(ValueError, kernel + r".*strategy=ja.Vmap\(\)", lambda: _noisy_flow_grad(
        dyn, x0, ts, key, "kernel")(0.5))
    one_line(TypeError, "`dt0` must be a number known before the run", lambda: jax.jit(
        lambda h: ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(0.5), key=key, dt0=h))(0.01))
    one_line(TypeError, "`dt0` must be a number known before the run", lambda: jax.jit(
        lambda h: ja.solve_flow(dyn, x0, ts, dt0=h, solver=dfx.Euler()))(0.01))
    with jax.enable_x64(False):  # the library's default float
        one_line(ValueError, "`sigma` = 1e\\+200 overflows float32", lambda: ja.TokenNoise(1e200))
    one_line(ValueError, "takes 1000 steps of dt0 = 0.001 over the horizon, more than "
             "max_steps = 100", lambda: ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(0.1),
                                                       key=key, max_steps=100))
    one_line(ValueError, "a measure after each of 1000000000000 layers", lambda: ja.run_layers(
        dyn, x0, 10**12, 0.1, observe=ja.misalignment))
