"""Every public argument of the core entry points is type-checked by name: a wrong
type or value is refused in one line that names the argument, before any work."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja

D = 3


@pytest.fixture(scope="module")
def parts():
    dyn = ja.random_dynamics(jax.random.key(0), 2, D)
    x0 = ja.sample_ellipsoid(jax.random.key(1), 4, D)
    return dyn, dyn.P.value, dyn.U.value, x0, jnp.array([0.0, 0.5])


def _model(**kw):
    return lambda dyn, P, U, x0, ts: ja.SelfAttentionDynamics(P, U, **kw)


def _layers(*args, **kw):
    return lambda dyn, P, U, x0, ts: ja.run_layers(dyn, x0, *(args or (2, 0.1)), **kw)


def _flow(**kw):
    return lambda dyn, P, U, x0, ts: ja.solve_flow(dyn, x0, ts, **kw)


def _noisy(**kw):
    return lambda dyn, P, U, x0, ts: ja.run_layers(dyn, x0, 2, 0.1, **kw)


# (the argument named in the message, the call)
CASES = [
    ("P", lambda dyn, P, U, x0, ts: ja.SelfAttentionDynamics("P", U)),
    ("U", lambda dyn, P, U, x0, ts: ja.SelfAttentionDynamics(P, "U")),
    ("W", _model(W="I")),
    ("beta", _model(beta="1")),
    ("beta", _model(beta=True)),
    ("beta", _model(beta=None)),
    ("beta", _model(beta=1j)),
    ("causal", _model(causal="no")),
    ("norm", _model(norm=5)),
    ("window", _model(window=10**30)),
    ("window", _model(window=2.5)),
    ("window", _model(window="3")),
    ("mask", _model(mask="all")),
    ("kernel", _model(kernel=5)),
    ("precision", _model(precision=5)),
    ("bias", _model(kernel="sigmoid", bias="1")),
    ("block_size", _model(block_size="8")),
    ("dyn", lambda dyn, P, U, x0, ts: ja.run_layers("dyn", x0, 2, 0.1)),
    ("x0", lambda dyn, P, U, x0, ts: ja.run_layers(dyn, "abc", 2, 0.1)),
    ("num_layers", _layers("2", 0.1)),
    ("num_layers", _layers(2.5, 0.1)),
    ("tau", _layers(2, "0.1")),
    ("tau", _layers(2, None)),
    ("tau", _layers(2, True)),
    ("checkpoints", _layers(checkpoints="all")),
    ("observe", _layers(observe="E")),
    ("strategy", _layers(strategy=1)),
    ("shard", _layers(shard=1)),
    ("noise", _noisy(noise="token", key=jax.random.key(0))),
    ("key", _noisy(noise=ja.TokenNoise(0.1), key="k")),
    ("dyn", lambda dyn, P, U, x0, ts: ja.solve_flow("dyn", x0, ts)),
    ("ts", lambda dyn, P, U, x0, ts: ja.solve_flow(dyn, x0, "abc")),
    ("solver", _flow(solver="tsit5")),
    ("rtol", _flow(rtol="1e-3")),
    ("atol", _flow(atol=None)),
    ("max_steps", _flow(max_steps="10")),
    ("dt0", _flow(dt0="0.1")),
    ("adjoint", _flow(adjoint="backsolve")),
    ("stepsize_controller", _flow(stepsize_controller="pid")),
    ("on_manifold", _flow(on_manifold="no")),
    ("throw", _flow(throw="no")),
    ("strategy", _flow(strategy=1)),
    ("solution", _flow(solution="yes")),
    ("event", _flow(solution=True, event="E")),
    ("sigma", lambda *_: ja.TokenNoise("0.5")),
    ("sigma", lambda *_: ja.ValueNoise(None)),
    ("sigma", lambda *_: ja.TokenNoise(-1.0)),
    ("dyn", lambda dyn, P, U, x0, ts: ja.theory.classify("dyn")),
    ("times", lambda dyn, P, U, x0, ts: ja.theory.classify(dyn, times="abc")),
    ("times", lambda dyn, P, U, x0, ts: ja.theory.classify(dyn, times=[np.nan])),
    ("tol", lambda dyn, P, U, x0, ts: ja.theory.classify(dyn, tol="1e-3")),
    ("dyn", lambda dyn, P, U, x0, ts: ja.theory.predict("dyn", x0)),
    ("x0", lambda dyn, P, U, x0, ts: ja.theory.predict(dyn, "abc")),
    ("times", lambda dyn, P, U, x0, ts: ja.theory.predict(dyn, x0, times=[np.inf])),
]


@pytest.mark.parametrize("name, call", CASES, ids=[f"{n}-{i}" for i, (n, _) in
                                                   enumerate(CASES)])
def test_wrong_argument_is_refused_by_name(parts, name, call):
    with pytest.raises((TypeError, ValueError)) as info:
        call(*parts)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert f"`{name}`" in message or message.startswith(f"{name} "), message


def test_classify_names_non_finite_times(parts):
    with pytest.raises(ValueError, match="`times` must be finite, got nan at index 1"):
        ja.theory.classify(parts[0], times=[0.0, np.nan])


@pytest.mark.parametrize("when, event", [
    ("at the start", lambda t, x: jnp.nan),
    ("during the run", lambda t, x: jnp.sqrt(0.25 - t) - 1.0),
])
def test_event_returning_nan_is_named(parts, when, event):
    dyn, _, _, x0, _ = parts
    with pytest.raises(ValueError, match=f"the `event` function returned NaN or inf {when}"):
        ja.solve_flow(dyn, x0, jnp.array([0.0, 1.0]), solution=True, event=event)


def test_event_returning_nan_is_named_inside_jit(parts):
    dyn, _, _, x0, _ = parts
    run = jax.jit(lambda x: ja.solve_flow(dyn, x, jnp.array([0.0, 1.0]), solution=True,
                                          event=lambda t, y: jnp.sqrt(0.25 - t) - 1.0))
    with pytest.raises(Exception, match="the `event` function returned NaN or inf during"):
        run(x0)


def test_flags_and_numbers_still_accepted(parts):
    dyn, P, U, x0, ts = parts
    ja.SelfAttentionDynamics(P, U, beta=np.float32(2.0), causal=np.bool_(True), window=3)
    ja.TokenNoise(jnp.asarray(0.5))
    out = ja.solve_flow(dyn, x0, ts, throw=np.bool_(False), on_manifold=True,
                        adjoint=dfx.RecursiveCheckpointAdjoint())
    assert bool(jnp.all(out.success))
