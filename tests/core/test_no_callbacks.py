"""On concrete inputs the programs of `solve_flow` and `run_layers` hold no host
callback (JAX's persistent cache keeps no program that holds one): the checks run on
the host, with the same messages as the in-program checks of traced inputs."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest
from _helpers import random_dynamics, random_tokens

import jaxattn as ja
from jaxattn._strategy import xla

#: The custom calls of JAX's host callbacks (pure_callback, io_callback, debug).
CALLBACK_TARGETS = ("xla_python_cpu_callback", "xla_ffi_python_cpu_callback",
                    "xla_python_gpu_callback", "xla_ffi_python_gpu_callback")
STEPS = "the flow solver reached `max_steps` before the last save time"


def lowered_text(monkeypatch, module, name, run) -> list[str]:
    """The StableHLO text of every call `run()` makes of the jitted `module.name`."""
    jitted, texts = getattr(module, name), []

    def recording(*args, **kwargs):
        texts.append(jitted.lower(*args, **kwargs).as_text())
        return jitted(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    run()
    assert texts, f"{name} was not called"
    return texts


def holds_callback(text: str) -> bool:
    return any(target in text for target in CALLBACK_TARGETS)


@pytest.fixture
def system(key):
    k1, k2 = jax.random.split(key)
    return random_dynamics(k1, h=2, d=3), random_tokens(k2, 5, 3, batch=(2,))


# diffrax's checks of `SaveAt(ts)` multiply the save times by a direction computed in
# the program (`jnp.where(t0 < t1, 1, -1)`), so their predicate is traced whatever `ts`
# is, and `eqx.error_if` leaves a host callback: concrete inputs are solved by the loop
# of diffeqsolve without its checks (`_strategy.stepping.stepped`).
@pytest.mark.parametrize("options", [
    {},
    {"solver": ja.RK4(), "dt0": 0.05, "stepsize_controller": dfx.ConstantStepSize()},
    {"solution": True},
    {"strategy": "fused"},
    {"solver": dfx.Kvaerno3()},
    {"solution": True, "event": lambda t, x: t > 0.5},  # a boolean event
], ids=["adaptive", "constant", "solution", "fused", "implicit", "event"])
def test_solve_flow_program_holds_no_callback(monkeypatch, system, options):
    dyn, x0 = system
    ts = jnp.linspace(0.0, 1.0, 4)
    texts = lowered_text(monkeypatch, xla, "solve_batched",
                         lambda: ja.solve_flow(dyn, x0, ts, **options))
    assert not any(map(holds_callback, texts))


CONSTANT = {"stepsize_controller": dfx.ConstantStepSize()}
HOST_RUNS = {
    "adaptive": {},
    "on-grid": {"solver": ja.RK4(), "dt0": 0.05, **CONSTANT},
    "off-grid": {"solver": ja.RK4(), "dt0": 0.07, **CONSTANT},  # saves interpolated
    "fused": {"strategy": "fused"},
    # an implicit solver's root finder takes the controller's tolerances, as in diffeqsolve
    "implicit": {"solver": dfx.Kvaerno3()},
    "implicit-constant": {"solver": dfx.Kvaerno3(root_finder=dfx.VeryChord(
        rtol=1e-6, atol=1e-8, norm=optx.max_norm)), "dt0": 0.05, **CONSTANT},
}


@pytest.mark.parametrize("name", [  # implicit, adaptive: over ~3 s warm (slow tier)
    pytest.param(n, marks=pytest.mark.slow) if n.startswith("implicit") or n == "adaptive"
    else n for n in HOST_RUNS])
def test_host_program_agrees_with_the_checked_program(system, name):
    """Concrete inputs run diffeqsolve's loop without its checks, traced ones diffrax's
    solve with them: two programs, the same steps and the same tokens to rounding."""
    options = HOST_RUNS[name]
    dyn, x0 = system
    ts = jnp.linspace(0.0, 2.0, 9)
    host = ja.solve_flow(dyn, x0, ts, solution=True, **options)
    inside = jax.jit(lambda x: ja.solve_flow(dyn, x, ts, solution=True, **options))(x0)
    assert host.success.all() and inside.success.all()
    for count in host.stats:  # accepted and rejected steps
        np.testing.assert_array_equal(host.stats[count], inside.stats[count])
    np.testing.assert_allclose(host.ys, inside.ys, rtol=0, atol=1e-12)


#: Boolean events (diffrax stops at the end of the step after which one holds), by when
#: they hold: `mid` the largest misalignment of the systems halfway (each system stops
#: at its own step).
EVENTS = {"time": lambda mid: lambda t, x: t > 0.7,
          "tokens": lambda mid: lambda t, x: ja.misalignment(x) < mid,
          "start": lambda mid: lambda t, x: t >= 0.0,
          "never": lambda mid: lambda t, x: t < 0.0}


@pytest.mark.slow  # warm: 3-6 s each (make test stays the fast loop)
@pytest.mark.parametrize("solver", [dfx.Tsit5(), dfx.Kvaerno3()], ids=["explicit", "implicit"])
@pytest.mark.parametrize("when", EVENTS)
def test_host_boolean_event_agrees_with_diffrax(system, when, solver):
    """A boolean event on concrete inputs runs `stepped`, in a user's jit diffrax's
    diffeqsolve with the same event: the same stop, steps, times and tokens."""
    dyn, x0 = system
    ts = jnp.linspace(0.0, 2.0, 9)
    mid = ja.misalignment(ja.solve_flow(dyn, x0, ts, solver=solver)[:, 4]).max() \
        if when == "tokens" else None  # a solve only the tokens' event reads
    options = dict(solver=solver, solution=True, event=EVENTS[when](mid))
    host = ja.solve_flow(dyn, x0, ts, **options)
    inside = jax.jit(lambda x: ja.solve_flow(dyn, x, ts, **options))(x0)
    assert host.success.all() and inside.success.all()
    stopped = np.asarray(host.event)
    np.testing.assert_array_equal(stopped, when != "never")
    np.testing.assert_array_equal(stopped, inside.event)
    np.testing.assert_array_equal(host.result == dfx.RESULTS.event_occurred, stopped)
    for count in host.stats:
        np.testing.assert_array_equal(host.stats[count], inside.stats[count])
    np.testing.assert_array_equal(host.ts, inside.ts)  # inf after the stop
    np.testing.assert_array_equal(host.t1, inside.t1)
    reached = np.isfinite(np.asarray(host.ts))
    if when == "start":
        assert not reached.any() and (np.asarray(host.t1) == 0).all()
    elif when != "never":  # stopped between the save times
        assert reached[:, 1].all() if when == "time" else reached.any()
        assert not reached[:, -1].any()
    np.testing.assert_allclose(host.ys, inside.ys, rtol=0, atol=1e-12)
    np.testing.assert_allclose(host.y1, inside.y1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["adaptive", "off-grid"])
def test_max_steps_counts_every_step_of_the_run(system, name):
    """The step budget is the whole run's, as for one diffrax solve; the run stops at it."""
    options = HOST_RUNS[name]
    dyn, x0 = system
    ts = jnp.linspace(0.0, 2.0, 9)
    stats = ja.solve_flow(dyn, x0, ts, solution=True, **options).stats
    steps = int(np.max(stats["num_steps"]))
    assert ja.solve_flow(dyn, x0, ts, max_steps=steps, throw=False, **options).success.all()
    with pytest.raises(ja.SimulationError, match=STEPS.replace("`", ".")):
        ja.solve_flow(dyn, x0, ts, max_steps=steps - 1, **options)


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
def test_implicit_solver_without_tolerances_under_constant_steps_is_one_line(system, traced):
    dyn, x0 = system
    ts = jnp.linspace(0.0, 1.0, 4)
    options = {"solver": dfx.Kvaerno3(), "dt0": 0.1, **CONSTANT}
    run = (lambda: jax.jit(lambda x: ja.solve_flow(dyn, x, ts, **options))(x0)) if traced \
        else (lambda: ja.solve_flow(dyn, x0, ts, **options))
    with pytest.raises(ValueError, match="implicit solver under constant steps") as info:
        run()
    assert "\n" not in str(info.value)


def test_equiangular_solution_holds_no_callback(monkeypatch):
    from jaxattn.theory import _equiangular

    ts = jnp.linspace(0.0, 2.0, 5)
    texts = lowered_text(monkeypatch, _equiangular, "_solve",
                         lambda: ja.theory.equiangular_solution(0.2, 4, 1.0, ts, norm="pre"))
    assert not any(map(holds_callback, texts))


def test_equiangular_solution_keeps_its_errors():
    """Out of steps: diffrax's message, checked on the host (or in a user's jit)."""
    ts = jnp.linspace(0.0, 2.0, 5)
    solve = ja.theory.equiangular_solution
    for run in (lambda: solve(0.2, 4, 1.0, ts, max_steps=2),
                lambda: eqx.filter_jit(lambda t: solve(0.2, 4, 1.0, t, max_steps=2).gap)(ts)):
        with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver steps"):
            run()
    with pytest.raises(ValueError, match="`ts` must be nondecreasing"):
        solve(0.2, 4, 1.0, ts[::-1])
    with pytest.raises(Exception, match="saveat.ts must be increasing"):
        jax.jit(lambda t: solve(0.2, 4, 1.0, t).gap)(ts[::-1])


def test_run_layers_program_holds_no_callback(monkeypatch, system):
    dyn, x0 = system
    texts = lowered_text(monkeypatch, xla, "layers_program",
                         lambda: ja.run_layers(dyn, x0, 6, 0.1, observe=ja.misalignment))
    assert not any(map(holds_callback, texts))


def test_traced_inputs_keep_the_checks_in_the_program(monkeypatch, system):
    """Inside a user's `jit` the checks stay in the program (and so do callbacks)."""
    dyn, x0 = system
    ts = jnp.linspace(0.0, 1.0, 4)
    texts = []
    jitted = xla.solve_batched

    def recording(*args, **kwargs):
        texts.append(jax.make_jaxpr(lambda: jitted(*args, **kwargs))())
        return jitted(*args, **kwargs)

    monkeypatch.setattr(xla, "solve_batched", recording)
    jax.jit(lambda x: ja.solve_flow(dyn, x, ts))(x0)
    assert "callback" in str(texts[0])


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
@pytest.mark.parametrize("ts, message", [
    (np.array([0.0, 2.0, 1.0]), "`ts` must be nondecreasing"),
    (np.array([0.0, np.inf]), "`ts` must be finite"),
])
def test_bad_ts_raise_the_same_message(system, traced, ts, message):
    dyn, x0 = system
    if traced and not np.all(np.isfinite(ts)):
        pytest.skip("the host check of finite `ts` needs concrete `ts`")
    run = (lambda: jax.jit(lambda t: ja.solve_flow(dyn, x0, t))(jnp.asarray(ts))) if traced \
        else (lambda: ja.solve_flow(dyn, x0, ts))
    with pytest.raises(Exception, match="saveat.ts must be increasing" if traced
                       else message):
        run()


@pytest.mark.parametrize("traced", [False, True], ids=["concrete", "traced"])
def test_out_of_steps_raises_the_same_message(system, traced):
    dyn, x0 = system
    ts = jnp.linspace(0.0, 5.0, 3)
    run = (lambda: eqx.filter_jit(lambda x: ja.solve_flow(dyn, x, ts, max_steps=2))(x0)) if traced \
        else (lambda: ja.solve_flow(dyn, x0, ts, max_steps=2))
    # inside a user's jit the in-program check raises diffrax's own message
    error, message = ((Exception, "maximum number of solver steps") if traced
                      else (ja.SimulationError, STEPS.replace("`", ".")))
    with pytest.raises(error, match=message):
        run()



def test_progress_shows_a_bar_only_when_asked(system, capsys):
    """`progress=True` draws diffrax's bar; the tokens agree with a run without it (a
    different program: diffrax's solve against its loop without checks) to rounding."""
    dyn, x0 = system
    ts = jnp.linspace(0.0, 1.0, 4)
    shown = ja.solve_flow(dyn, x0, ts, progress=True)
    assert "100.00%" in capsys.readouterr().err
    np.testing.assert_allclose(shown, ja.solve_flow(dyn, x0, ts), rtol=0, atol=1e-12)
    assert "100.00%" not in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [
    ({"progress": "yes"}, "`progress` must be True or False"),
    ({"progress": True, "strategy": "kernel", "solver": ja.RK4(), "dt0": 0.25,
      "stepsize_controller": dfx.ConstantStepSize()}, "no progress bar"),
])
def test_bad_progress_is_refused(system, bad, message):
    dyn, x0 = system
    with pytest.raises((TypeError, ValueError), match=message):
        ja.solve_flow(dyn, x0, jnp.linspace(0.0, 1.0, 4), **bad)


def test_hemisphere_of_concrete_tokens_calls_no_callback(monkeypatch, system):
    """`ja.metrics.hemisphere` (what `ja.theory.predict` asks of Theorem 4.1's domain) decides
    concrete tokens on the host, with the answer a traced call gets through its
    callback."""
    from jaxattn.metrics import _hemisphere

    _, x0 = system
    traced = jax.jit(ja.metrics.hemisphere)(x0)
    monkeypatch.setattr(_hemisphere.jax, "pure_callback", None)  # any call fails
    here = ja.metrics.hemisphere(x0)
    np.testing.assert_array_equal(here.inside, traced.inside)
    np.testing.assert_allclose(here.margin, traced.margin, rtol=1e-12)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_new_beta_tau_sigma_horizon_or_seed_compiles_nothing(key, compiles):
    """The values a study varies are traced: after a first run, a new β, τ, σ, horizon
    or seed runs the same programs (`solve_flow`, `run_layers`, with and without noise)."""
    x0 = random_tokens(key, 5, 3, batch=(2,))

    def run(beta=1.0, T=1.0, tau=0.1, sigma=0.1, seed=0):
        dyn = random_dynamics(jax.random.PRNGKey(seed), beta=beta)
        noise = {"noise": ja.TokenNoise(sigma), "key": jax.random.PRNGKey(seed)}
        ja.solve_flow(dyn, x0, jnp.linspace(0.0, T, 5))
        ja.solve_flow(dyn, x0, jnp.linspace(0.0, T, 5), dt0=0.05, **noise)
        ja.run_layers(dyn, x0, 7, tau)
        ja.run_layers(dyn, x0, 7, tau, **noise)

    run()
    first = compiles[0]
    assert first > 0  # the counter sees programs
    for change in ({"beta": 2.0}, {"T": 3.0}, {"tau": 0.2}, {"sigma": 0.3}, {"seed": 5}):
        compiles[0] = 0
        run(**change)
        assert compiles[0] == 0, change


def test_spectrum_of_a_concrete_matrix_holds_no_callback(monkeypatch):
    """`ja.spectral.spectrum` checks a concrete `Ω` on the host (the eig is LAPACK, no
    callback); a NaN `Ω` keeps its one-line error."""
    from jaxattn.spectral import _spectrum

    Omega = np.diag([3.0, -2.0, 0.5])
    texts = lowered_text(monkeypatch, _spectrum, "_spectrum",
                         lambda: ja.spectral.spectrum(Omega))
    assert not any(map(holds_callback, texts))
    with pytest.raises(ja.SimulationError, match="`Omega` contains NaN or inf"):
        ja.spectral.spectrum(Omega * np.nan)


def test_checks_of_concrete_inputs_compile_nothing(compiles):
    """Conversions and checks of concrete inputs run on the host (NumPy, `device_put`,
    `eval_shape`): no one-op program per shape, which would cost JAX's tracing and lowering
    in every new process, cache or not (#42). Shapes no other test uses, so that an
    eager `jnp` call would compile here."""
    from jaxattn import _schedule, _validate

    x = np.random.default_rng(0).normal(size=(2, 11, 13))
    weights = _validate.as_float_array(x[:1, :, :11], "weights")
    assert isinstance(weights, jax.Array) and weights.dtype == jnp.result_type(float)
    assert _schedule.schedule_shape(_schedule.Constant(weights), "U") == (1, 11, 11)
    _validate.check_tokens_now(x)
    _validate.check_rows_now(x, "x", "here")
    assert not _validate.known_nonfinite(x)
    x[1, 4, 2] = np.nan
    assert _validate.known_nonfinite(x)
    with pytest.raises(ValueError, match="NaN or inf"):
        _validate.check_tokens_now(x)
    x[1, 4] = 0.0
    with pytest.raises(ValueError, match="zero"):
        _validate.check_rows_now(np.nan_to_num(x), "x", "here")
    assert compiles[0] == 0


@pytest.mark.parametrize("transform", ["vmap", "vmap of vmap", "vmap of grad"])
def test_checks_under_vmap_alone_run_on_the_host(monkeypatch, transform):
    """Under `vmap`s without `jit` the batching rule sees the values: a check runs on
    the host (no `eqx.error_if`, whose eager program JAX's cache refuses to keep) and
    raises the same message; inside `jit` it stays in the program (where `grad` drops
    the checks of values it does not return, as for any `eqx.error_if`)."""
    from jaxattn import _validate

    def f(x):
        return _validate.checked(x * 2.0, x > 0, "`x` must be > 0 here.")

    run = {"vmap": jax.vmap(f), "vmap of vmap": jax.vmap(jax.vmap(f)),
           "vmap of grad": jax.vmap(jax.grad(f))}[transform]
    shape = (2, 3) if transform == "vmap of vmap" else (3,)
    with monkeypatch.context() as patch:
        patch.setattr(_validate.eqx, "error_if", None)  # any call fails
        assert np.all(np.asarray(run(jnp.ones(shape))) == 2.0)
        with pytest.raises(ja.SimulationError, match="`x` must be > 0 here"):
            run(jnp.ones(shape).at[(1,) * len(shape)].set(-1.0))
    if transform != "vmap of grad":
        with pytest.raises(eqx.EquinoxRuntimeError, match="`x` must be > 0 here"):
            eqx.filter_jit(run)(jnp.ones(shape).at[(1,) * len(shape)].set(-1.0))


def test_vmapped_model_checks_its_beta_on_the_host(monkeypatch):
    """`SelfAttentionDynamics` built under `vmap` (one model per β) checks β on the host,
    with its one-line message, and inside `filter_jit` in the program."""
    from jaxattn import _validate

    eye = jnp.eye(3)[None]

    def build(b):
        return ja.SelfAttentionDynamics(eye, eye, beta=b)

    with monkeypatch.context() as patch:
        patch.setattr(_validate.eqx, "error_if", None)
        dyn = eqx.filter_vmap(build)(jnp.array([0.5, 1.5]))
        np.testing.assert_array_equal(dyn.beta, [0.5, 1.5])
        with pytest.raises(ja.SimulationError, match="`beta` must be finite"):
            eqx.filter_vmap(build)(jnp.array([0.5, jnp.nan]))
    with pytest.raises(eqx.EquinoxRuntimeError, match="`beta` must be finite"):
        eqx.filter_jit(eqx.filter_vmap(build))(jnp.array([0.5, jnp.nan]))
