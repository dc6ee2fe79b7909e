"""The execution strategies as a family: members passed as `strategy=`, the string
shorthands, capabilities instead of names, and the family's abstract/final rule."""

import dataclasses

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_tokens

import jaxattn as ja
from jaxattn._pallas import use_kernel_config
from jaxattn._strategy import BUILTIN, STRATEGIES, as_strategy, choose_strategy


def _model(key, n=5, d=3):
    return ja.random_dynamics(key, 2, d)


def test_shorthands_name_the_members():
    assert STRATEGIES == ("auto", "general", "fused", "kernel")
    assert as_strategy("general") == ja.Vmap() and as_strategy("fused") == ja.BatchLast()
    assert as_strategy("kernel") == ja.PallasKernel()
    assert as_strategy("auto") is None
    with use_kernel_config(block=2, num_warps=1):
        assert as_strategy("kernel") == ja.PallasKernel(block=2, num_warps=1)
    for name, cls in BUILTIN.items():
        assert cls.name == name and issubclass(cls, ja.AbstractStrategy)
    with pytest.raises(ValueError, match="ja.AbstractStrategy"):
        as_strategy(ja.Softmax())


def test_members_run_as_their_shorthands(key):
    """A member passed as `strategy=` is its shorthand: the same program, bit for bit."""
    dyn, x0 = _model(key), random_tokens(key, 5, 3, batch=(7,))
    for member, name in ((ja.Vmap(), "general"), (ja.BatchLast(), "fused")):
        np.testing.assert_array_equal(ja.run_layers(dyn, x0, 4, 0.1, strategy=member),
                                      ja.run_layers(dyn, x0, 4, 0.1, strategy=name))
        kw = dict(solver=dfx.Heun(), dt0=0.1, stepsize_controller=dfx.ConstantStepSize())
        ts = jnp.linspace(0.0, 0.5, 3)
        np.testing.assert_array_equal(ja.solve_flow(dyn, x0, ts, strategy=member, **kw),
                                      ja.solve_flow(dyn, x0, ts, strategy=name, **kw))


def test_kernel_member_carries_its_layout(key):
    dyn, x0 = _model(key), random_tokens(key, 5, 3, batch=(3,))
    member = ja.PallasKernel(block=2, num_warps=1)
    with use_kernel_config(block=2, num_warps=1):
        by_name = ja.run_layers(dyn, x0, 2, 0.1, strategy="kernel")
    np.testing.assert_array_equal(ja.run_layers(dyn, x0, 2, 0.1, strategy=member), by_name)
    np.testing.assert_allclose(by_name, ja.run_layers(dyn, x0, 2, 0.1, strategy="general"),
                               atol=1e-12)
    with pytest.raises(ValueError, match="power of two"):
        ja.PallasKernel(block=48)
    with pytest.raises(ValueError, match="power of two"):
        dataclasses.replace(member, block=3)


def test_auto_picks_by_capability(key):
    dyn = _model(key)
    assert choose_strategy(dyn, (7, 5, 3)) == ja.BatchLast()
    assert choose_strategy(dyn, (7, 5, 3), shard="tokens") == ja.Vmap()
    assert choose_strategy(dyn, (7, 5, 3), "fused", shard="tokens") == ja.Vmap()
    # flows: constant steps of explicit solvers fuse, adaptive ones run per system
    tsit = dict(solver=dfx.Tsit5(), controller=dfx.PIDController(rtol=1e-6, atol=1e-8))
    assert choose_strategy(dyn, (7, 5, 3), **tsit) == ja.Vmap()
    assert choose_strategy(dyn, (7, 5, 3), solver=dfx.Heun(),
                           controller=dfx.ConstantStepSize()) == ja.BatchLast()
    blocked = ja.random_dynamics(key, 2, 3, block_size=2)
    assert choose_strategy(blocked, (7, 5, 3)) == ja.Vmap()
    for member in (ja.BatchLast(), ja.PallasKernel()):
        with pytest.raises(ValueError, match="runs dense attention"):
            choose_strategy(blocked, (7, 5, 3), member)


def test_capabilities_refuse_by_what_a_member_runs(key):
    dyn, x0 = _model(key), random_tokens(key, 5, 3, batch=(2,))
    with pytest.raises(ValueError, match="not differentiable"):
        jax.grad(lambda x: ja.run_layers(dyn, x, 2, strategy=ja.PallasKernel()).sum())(x0)
    with pytest.raises(ValueError, match="runs on one device"):
        ja.run_layers(dyn, x0, 2, strategy=ja.PallasKernel(), devices=1)
    ts = jnp.linspace(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="noisy flow runs on the general path"):
        ja.solve_flow(dyn, x0, ts, noise=ja.TokenNoise(0.1), key=key, strategy=ja.BatchLast())
    with pytest.raises(ValueError, match="stops each sample on its own"):
        ja.solve_flow(dyn, x0, ts, solution=True, event=lambda t, x: t - 0.5,
                      strategy=ja.BatchLast())


def test_the_base_is_abstract():
    with pytest.raises(TypeError):
        ja.AbstractStrategy()


@pytest.mark.parametrize("traced", [  # traced: warm over ~3 s (the slow tests)
    False, pytest.param(True, marks=pytest.mark.slow)], ids=["concrete", "traced"])
def test_fused_solution_is_the_general_one(key, traced):
    """`solution=True` on the fused path gives each system the chunk's times and counts
    (it used to fail broadcasting the save times `(T,)` to the chunk `(T, B)`)."""
    dyn = ja.random_dynamics(key, 2, 3)
    x0 = random_tokens(jax.random.fold_in(key, 1), 5, 3, batch=(2,))
    ts = jnp.linspace(0.0, 1.0, 5)
    kw = dict(solver=ja.RK4(), dt0=0.05, stepsize_controller=dfx.ConstantStepSize(),
              solution=True)

    def run(strategy):
        solve = lambda x: ja.solve_flow(dyn, x, ts, strategy=strategy, **kw)  # noqa: E731
        return (jax.jit(solve) if traced else solve)(x0)

    fused, general = run("fused"), run("general")
    assert fused.ts.shape == general.ts.shape == (2, 5)
    np.testing.assert_array_equal(fused.ts, general.ts)
    np.testing.assert_array_equal(fused.stats["num_steps"], general.stats["num_steps"])
    np.testing.assert_allclose(fused.ys, general.ys, rtol=0, atol=1e-12)
