"""A run that stops on its values raises one line first: `ja.SimulationError` with
jaxattn's own message and the fix, the same for sharded and unsharded runs, and
after a cached compile (equinox's error then printed an unrelated earlier call's
"inside JIT" stack)."""

import textwrap
import traceback

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_dynamics, random_tokens, run_on_forced_devices

import jaxattn as ja
from jaxattn import _validate
from jaxattn.cli import main

ZERO = ("an initial token is zero (or all its entries are below the smallest normal "
        "float), so it has no direction to project onto the ellipsoid; every token needs a "
        "nonzero entry.")
NAN = "the initial tokens contain NaN or inf; pass finite tokens."
STEPS = ("the flow solver reached `max_steps` before the last save time: raise "
         "`max_steps`, shorten the horizon, or pass `throw=False` for a per-sample "
         "`success` (weights of a schedule that turn NaN or inf mid-run end the same "
         "way: every step there is rejected).")
OVERFLOW = _validate.NONFINITE.removeprefix("jaxattn: ")
TS = jnp.array([0.0, 1.0])


def _tokens(key, bad):
    x0 = np.array(random_tokens(key, 4, 3, batch=(2,)))
    if bad is not None:
        x0[1, 2] = bad
    return x0


def _failure(call) -> tuple[BaseException, list[str]]:
    """The error `call()` raises and its traceback's lines, as Python prints them."""
    with pytest.raises(ja.SimulationError) as info:
        jax.block_until_ready(call())
    lines = "".join(traceback.format_exception(info.value)).splitlines()
    return info.value, lines


def _assert_one_line_first(error, lines, message):
    assert str(error).splitlines()[0] == message
    assert lines[-1] == f"jaxattn.SimulationError: {message}"
    assert len(lines) < 16, "\n".join(lines)  # no equinox stack, no debugging advice
    text = "\n".join(lines)
    assert "inside of JIT" not in text and "EQX_ON_ERROR" not in text
    # still what the checks raised before: code catching either keeps working
    assert isinstance(error, ValueError) and isinstance(error, eqx.EquinoxRuntimeError)


@pytest.mark.parametrize("bad, message", [(0.0, ZERO), (np.nan, NAN), (np.inf, NAN)])
@pytest.mark.parametrize("entry", ["run_layers", "solve_flow"])
def test_bad_tokens_raise_one_line(key, entry, bad, message):
    dyn = random_dynamics(key)
    x0 = _tokens(key, bad)
    if entry == "run_layers":
        error, lines = _failure(lambda: ja.run_layers(dyn, x0, 3, 0.1))
    else:
        error, lines = _failure(lambda: ja.solve_flow(dyn, x0, TS))
    _assert_one_line_first(error, lines, message)


def test_overflowing_weights_raise_one_line(key):
    P = np.array(jax.random.normal(key, (2, 3, 3)))
    huge = ja.SelfAttentionDynamics(P, np.full((2, 3, 3), 1e308))  # finite, overflows
    error, lines = _failure(lambda: ja.run_layers(huge, _tokens(key, None), 2, 1.0))
    _assert_one_line_first(error, lines, OVERFLOW)


def test_nan_weights_raise_one_line(key):
    P = np.array(jax.random.normal(key, (2, 3, 3)))
    P[0, 1, 1] = np.nan  # NaN weights known only inside the run (a schedule)
    scheduled = ja.SelfAttentionDynamics(ja.Schedule(lambda t, p: p, jnp.asarray(P)),
                                         np.broadcast_to(np.eye(3), (2, 3, 3)))
    error, lines = _failure(lambda: ja.solve_flow(scheduled, _tokens(key, None), TS))
    _assert_one_line_first(error, lines, OVERFLOW)


def test_out_of_steps_raises_one_line(key):
    dyn = random_dynamics(key, scale=2.0)
    error, lines = _failure(lambda: ja.solve_flow(dyn, _tokens(key, None), jnp.array([0.0, 20.0]),
                                                  max_steps=2))
    _assert_one_line_first(error, lines, STEPS)


def _compile_first(dyn, x0):
    return ja.run_layers(dyn, x0, 3, 0.1)  # the call that compiles the program


def test_after_a_cached_compile_the_error_names_no_earlier_call(key):
    dyn = random_dynamics(key)
    jax.block_until_ready(_compile_first(dyn, _tokens(key, None)))
    error, lines = _failure(lambda: ja.run_layers(dyn, _tokens(key, 0.0), 3, 0.1))
    _assert_one_line_first(error, lines, ZERO)
    assert not any("_compile_first" in line for line in lines), "\n".join(lines)


def test_explore_surfaces_the_same_error(key):
    dyn = random_dynamics(key)
    x0 = np.array(random_tokens(key, 4, 3))
    x0[2] = 0.0
    error, lines = _failure(lambda: ja.explore.consensus_objective(dyn, x0, horizon=1.0,
                                                                   model="layers", tau=0.5))
    _assert_one_line_first(error, lines, ZERO)


def test_surface_errors_passes_other_errors_and_is_idempotent():
    def bug():
        raise RuntimeError("a bug, not a value check")

    wrapped = _validate.surface_errors(bug)
    assert _validate.surface_errors(wrapped) is wrapped
    with pytest.raises(RuntimeError, match="a bug") as info:
        wrapped()
    assert type(info.value) is RuntimeError


def test_runtime_message_reads_every_form():
    eqx_text = ("Above is the stack outside of JIT. Below is the stack inside of JIT:\n"
                "  File \"x.py\", line 1, in f\n\nequinox.EquinoxRuntimeError: jaxattn: boom; "
                "fix it.\n\n-------------------\n\nAn error occurred ...")
    jit_text = ("INTERNAL: CpuCallback error ...\n_EquinoxRuntimeError: jaxattn: boom; fix it."
                "\n\n\n--------------------\nAn error occurred ...")
    assert _validate.runtime_message(eqx.EquinoxRuntimeError(eqx_text)) == "boom; fix it."
    assert _validate.runtime_message(jax.errors.JaxRuntimeError(jit_text)) == "boom; fix it."
    assert _validate.runtime_message(eqx.EquinoxRuntimeError("jaxattn: boom")) == "boom"
    assert _validate.runtime_message(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED")) is None
    assert _validate.runtime_message(ValueError("no")) is None


def test_the_cli_prints_the_one_line(monkeypatch, capsys):
    from jaxattn.cli import demo

    for error in (ja.SimulationError(NAN),
                  eqx.EquinoxRuntimeError(f"stack\nequinox.EquinoxRuntimeError: jaxattn: {NAN}"
                                          "\n\n---- advice")):
        def fails(args, error=error):
            raise error

        monkeypatch.setattr(demo, "_demo", fails)
        assert main(["demo"]) == 2
        err = capsys.readouterr().err
        assert err == f"jaxattn demo: error: the computation stopped: {NAN}\n"


_SHARDED = textwrap.dedent(
    """
    import json, traceback
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxattn as ja

    key = jax.random.PRNGKey(3)
    P, U = jax.random.normal(key, (2, 2, 3, 3))
    dyn = ja.SelfAttentionDynamics(P, U)
    huge = ja.SelfAttentionDynamics(P, jnp.full((2, 3, 3), 1e308))
    x0 = np.array(jax.vmap(lambda k: ja.sample_ellipsoid(k, 4, 3))(jax.random.split(key, 4)))
    zero, nan = x0.copy(), x0.copy()
    zero[1, 2], nan[3, 0] = 0.0, np.nan
    ts = jnp.array([0.0, 20.0])
    calls = {
        "zero": lambda: ja.run_layers(dyn, zero, 3, 0.1, devices=2),
        "nan": lambda: ja.solve_flow(dyn, nan, ts, devices=2),
        "overflow": lambda: ja.run_layers(huge, x0, 2, 1.0, devices=2),
        "steps": lambda: ja.solve_flow(dyn, x0, ts, max_steps=2, devices=2),
    }
    res = {"devices": len(jax.devices())}
    for name, call in calls.items():
        try:
            jax.block_until_ready(call())
            res[name] = None
        except Exception as e:
            lines = "".join(traceback.format_exception(e)).splitlines()
            res[name] = [type(e).__name__, str(e).splitlines()[0], lines[-1], len(lines)]
    print(json.dumps(res))
    """
)


@pytest.mark.slow  # a fresh JAX on 4 forced devices, four sharded programs
def test_sharded_runs_raise_the_same_one_line():
    res = run_on_forced_devices(_SHARDED, timeout=300)
    for name, message in (("zero", ZERO), ("nan", NAN), ("overflow", OVERFLOW),
                          ("steps", STEPS)):
        kind, first, last, count = res[name]
        assert kind == "SimulationError" and first == message, res[name]
        assert last == f"jaxattn.SimulationError: {message}" and count < 16, res[name]
