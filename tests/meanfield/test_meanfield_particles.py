"""`ja.meanfield.circle_particles`: the particle system on the circle with its field
summed in Fourier modes, against the pairwise sum (`SelfAttentionDynamics.velocity`,
`ja.solve_flow`), scipy's Bessel functions and finite differences."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ive

import jaxattn as ja
from jaxattn.meanfield._particles import coefficients

mf = ja.meanfield
EYE = jnp.eye(2)[None]


def points(key, n):
    """`n` points of the circle bunched about two angles (far from uniform)."""
    k1, k2 = jax.random.split(key)
    theta = jnp.where(jax.random.bernoulli(k1, 0.6, (n,)), 0.3, 2.5)
    theta = theta + 0.7 * jax.random.normal(k2, (n,))
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], -1)


def model(kernel, beta, kappa=1.0):
    return ja.SelfAttentionDynamics(EYE, kappa * EYE, beta=beta, kernel=kernel)


def coupling(kernel, beta, kappa):
    return mf.coupling_of(kappa, beta, kernel) if beta > 0 else kappa


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel, beta", [("exp", 0.0), ("exp", 1.0), ("exp", 6.0),
                                          ("usa", 1.0), ("usa", 30.0), ("softmax", 1.0),
                                          ("softmax", 30.0)])
def test_velocity_is_the_pairwise_sum(kernel, beta, key):
    x = points(key, 57)
    v = model(kernel, beta, 1.3).velocity(0.0, x)
    w = mf.circle_velocity(x, beta=beta, coupling=coupling(kernel, beta, 1.3), kernel=kernel)
    # the pairwise sum's rounding: ε times its terms' size, κ e^{β} (exp), κ (usa, softmax)
    scale = 1.3 * (np.exp(beta) if kernel == "exp" else 1.0)
    assert float(jnp.max(jnp.abs(v - w))) <= 50 * np.finfo(float).eps * scale


@pytest.mark.parametrize("beta", [0.0, 0.5, 3.0, 40.0])
def test_coefficients_are_bessel_functions(beta):
    m = mf.circle_modes(beta)
    b, a = coefficients(jnp.asarray(beta), m)
    k = np.arange(m + 1)
    np.testing.assert_allclose(a, ive(k, beta), rtol=0, atol=1e-15)
    np.testing.assert_allclose(b, ive(k[1:] - 1, beta) - ive(k[1:] + 1, beta), rtol=0,
                               atol=1e-15)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("beta", [0.5, 3.0, 40.0])
def test_modes_stop_where_the_dropped_terms_fall_below_rounding(beta, key):
    m = mf.circle_modes(beta)
    i = ive(np.arange(m + 200), beta)
    tail = lambda j: 2 * np.sum(i[j:])  # noqa: E731
    assert tail(m) <= np.finfo(float).eps * i[0] < tail(m - 1)
    assert mf.circle_modes(beta, jnp.float32) < m
    # what it drops is below rounding (in units of I_0(β), the size of the sum's terms);
    # half as many modes are not enough
    x = points(key, 40)
    full = mf.circle_velocity(x, beta=beta, modes=m + 30)

    def err(modes):
        v = mf.circle_velocity(x, beta=beta, modes=modes)
        return float(jnp.max(jnp.abs(v - full))) / (np.exp(beta) * i[0])

    assert err(m) < 20 * np.finfo(float).eps
    assert err(m // 2) > 1e-9


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel, beta, n", [("exp", 1.0, 500), ("softmax", 4.0, 200)])
def test_particles_are_solve_flows_particles(kernel, beta, n, key):
    """The same particle system, two algorithms: at tight tolerances they end within
    `1e-10` of each other (at the study's `rtol = 1e-9` within a few `1e-10`)."""
    x0 = points(key, n)
    ts = jnp.array([0.0, 0.5, 1.0])
    pairwise = ja.solve_flow(model(kernel, beta), x0, ts, rtol=1e-12, atol=1e-14)
    fourier = mf.circle_particles(x0, ts, beta=beta, coupling=coupling(kernel, beta, 1.0),
                                  kernel=kernel, rtol=1e-12, atol=1e-14)
    assert fourier.shape == (3, n, 2)
    assert float(jnp.max(jnp.abs(pairwise - fourier))) < 1e-10
    assert float(jnp.max(jnp.abs(fourier[-1] - x0))) > 0.05  # they moved


TS = jnp.array([0.0, 0.7])


def ending(x, beta, k, modes=mf.circle_modes(2.0)):
    return mf.circle_particles(x, TS, beta=beta, coupling=k, modes=modes, rtol=1e-12,
                               atol=1e-14)[-1]


def test_jit_and_vmap_compose(key):
    x0 = jax.vmap(lambda k: points(k, 30))(jax.random.split(key, 3))
    batch = jax.jit(jax.vmap(ending, in_axes=(0, None, None)))(x0, 2.0, 0.8)
    for i in range(3):
        np.testing.assert_allclose(batch[i], ending(x0[i], 2.0, 0.8), rtol=0, atol=1e-13)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_gradients_match_finite_differences(key):
    """In `β` (with `modes` given), `K` and the points (along the circle)."""
    x0 = points(key, 30)

    def loss(beta, k, x):
        return jnp.sum(ending(x, beta, k)[:, 0] * jnp.arange(30.0))

    grads = jax.grad(loss, argnums=(0, 1, 2))(2.0, 0.8, x0)
    h = 1e-5
    for i, (b, k) in enumerate(((h, 0.0), (0.0, h))):
        fd = (loss(2.0 + b, 0.8 + k, x0) - loss(2.0 - b, 0.8 - k, x0)) / (2 * h)
        assert float(grads[i]) == pytest.approx(float(fd), rel=1e-6)
    tangent = jnp.stack([-x0[:, 1], x0[:, 0]], -1) * jnp.linspace(-1, 1, 30)[:, None]
    fd = (loss(2.0, 0.8, x0 + h * tangent) - loss(2.0, 0.8, x0 - h * tangent)) / (2 * h)
    assert float(jnp.sum(grads[2] * tangent)) == pytest.approx(float(fd), rel=1e-6)


X = jnp.stack([jnp.cos(jnp.arange(5.0)), jnp.sin(jnp.arange(5.0))], -1)


@pytest.mark.parametrize("call, message", [
    (lambda: mf.circle_velocity(jnp.ones((4, 3)), beta=1.0), "must be (n, 2) points"),
    (lambda: mf.circle_velocity(X, beta=-1.0), "`beta` must be finite and ≥ 0"),
    (lambda: mf.circle_velocity(X, beta=1.0, kernel="sigmoid"), "`kernel` must be one of"),
    (lambda: mf.circle_velocity(X, beta=1.0, modes=0), "`modes` must be an integer ≥ 1"),
    (lambda: jax.grad(lambda b: mf.circle_velocity(X, beta=b)[0, 0])(1.0), "pass `modes=`"),
    (lambda: mf.circle_particles(X, [1.0, 0.0], beta=1.0), "nondecreasing finite times"),
    (lambda: mf.circle_particles(X, [0.0, 1.0], beta=1.0, solver=dfx.Euler()), "adaptive"),
    (lambda: mf.circle_modes(1e9), "more than 4096 Fourier modes"),
    # NaN and inf came back (e^β past float64's range), and circle_particles ran out of steps
    (lambda: mf.circle_velocity(X, beta=1000.0, modes=8), "past the range of the 'usa' kernel"),
    (lambda: mf.circle_particles(X, [0.0, 1.0], beta=720.0, kernel="exp", modes=8),
     "use kernel='softmax'"),
    (lambda: mf.circle_particles(X, [0.0, 1.0], beta=1.0, coupling="a"), "`coupling` must be"),
    (lambda: mf.circle_particles(X, [0.0, 1.0], beta=1.0, max_steps=0), "`max_steps` must be"),
])
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert message in str(info.value)


def test_float32_points_under_x64_stay_float32():
    """A float32 density or float32 points with x64 on (the tests' setting) met float64
    kernel multipliers: a scan's carry type error, and `fluctuation_distance` a
    tangent-dtype error. Both run in float32 and agree with float64 to its rounding."""
    x = X.astype(jnp.float32)
    v32, v64 = mf.circle_velocity(x, beta=1.0), mf.circle_velocity(X, beta=1.0)
    assert v32.dtype == jnp.float32
    np.testing.assert_allclose(v32, v64, atol=1e-6)
    grid = mf.Circle(16)
    mu0 = mf.uniform(grid) * (1 + 0.5 * grid.points[..., 0])
    d32, d64 = (mf.fluctuation_distance(grid, m, [0.0, 1.0], 10, beta=1.0, coupling=1.0)
                for m in (mu0.astype(jnp.float32), mu0))
    np.testing.assert_allclose(d32, d64, rtol=1e-5)


def test_vmap_checks_its_solves_on_the_host(monkeypatch, key):
    """Under `vmap` alone the checks of the points and of diffrax's result run on the
    host (no `error_if` program, which JAX's cache would refuse to keep), with diffrax's
    own message for a solve out of steps."""
    import equinox as eqx

    from jaxattn.meanfield import _particles

    x0 = jax.vmap(lambda k: points(k, 30))(jax.random.split(key, 2))
    run = jax.vmap(lambda x: mf.circle_particles(x, jnp.array([0.0, 1.0]), beta=2.0,
                                                  max_steps=steps))
    steps = 4096
    want = jax.jit(run)(x0)
    with monkeypatch.context() as patch:
        patch.setattr(eqx, "error_if", None)  # any call fails
        patch.setattr(type(_particles.dfx.RESULTS.successful), "error_if", None)
        np.testing.assert_allclose(run(x0), want, rtol=0, atol=1e-12)
        steps = 1
        for call in (lambda: run(x0), lambda: mf.circle_particles(
                x0[0], jnp.array([0.0, 1.0]), beta=2.0, max_steps=steps)):
            with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver steps"):
                call()
    # one line, a SimulationError (a ValueError too), naming what to change
    with pytest.raises(ja.SimulationError, match=r"^circle_particles: the maximum number of "
                                                 r"solver steps was reached: raise `max_steps`"):
        mf.circle_particles(x0[0], jnp.array([0.0, 1.0]), beta=2.0, max_steps=1)
    with pytest.raises(ValueError, match="`rtol` and `atol` are both 0"):  # was: out of steps
        mf.circle_particles(x0[0], jnp.array([0.0, 1.0]), beta=2.0, rtol=0.0, atol=0.0)
