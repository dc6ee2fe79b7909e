"""strategy="kernel": the whole run as one Pallas kernel (`jaxattn._pallas`), checked in
interpret mode against the fused XLA path, and lowered for CUDA on this machine.

Kernels in interpret mode compile slowly on the CPU (every lane operation is an XLA
op), so the systems here are tiny and of distinct sizes (n = 3 tokens in R², one or
two heads, batch 5); the grid of variants is marked slow."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_tokens

import jaxattn as ja
from jaxattn._layers import run_layers_unchecked
from jaxattn._pallas import KernelConfig, use_kernel_config
from jaxattn._strategy import pallas_kernel

ROOT = Path(__file__).resolve().parents[2]
N, D, B, L = 3, 2, 5, 4


def _model(key, h=1, **kw):
    return ja.random_dynamics(key, h, D, **kw)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _both(dyn, x0, layers=L, **kw):
    return [ja.run_layers(dyn, x0, layers, 0.3, strategy=s, **kw) for s in ("kernel", "fused")]


def test_layers_equal_fused_float64(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1, h=2), random_tokens(k2, N, D, batch=(B,))
    a, b = _both(dyn, x0)
    assert a.shape == (B, L + 1, N, D)
    assert _rel(a, b) < 1e-12


def test_layers_equal_fused_float32_with_observe(key):
    k1, k2 = jax.random.split(key)
    with jax.enable_x64(False):
        dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,)).astype(jnp.float32)
        a, b = _both(dyn, x0, observe=ja.misalignment)
        assert a.dtype == jnp.float32 and a.shape == (B, L + 1)
        assert _rel(a, b) < 1e-5


def test_noise_draws_the_same_paths(key):
    """The kernel's threefry draws are `jax.random`'s: the same paths as the fused
    path, not only the same law (float64, a raw key and a typed one)."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    for noise_key in (key, jax.random.key(7)):
        a, b = _both(dyn, x0, noise=ja.TokenNoise(0.4), key=noise_key)
        assert _rel(a, b) < 1e-12
    other = ja.run_layers(dyn, x0, L, 0.3, strategy="kernel", noise=ja.TokenNoise(0.4),
                          key=jax.random.key(8))
    assert _rel(other, a) > 1e-3  # another key, another path


def test_stacked_models_and_one_system(key):
    k1, k2 = jax.random.split(key)
    dyns = eqx.filter_vmap(lambda k: _model(k))(jax.random.split(k1, 2))
    x0 = random_tokens(k2, N, D, batch=(2, 3))
    a, b = _both(dyns, x0)
    assert a.shape == (2, 3, L + 1, N, D) and _rel(a, b) < 1e-12
    a, b = _both(_model(k1), x0[0, 0])
    assert a.shape == (L + 1, N, D) and _rel(a, b) < 1e-12


@pytest.mark.parametrize("solver", [dfx.Euler(), dfx.Heun(), ja.RK4()],
                         ids=["Euler", "Heun", "RK4"])
def test_flow_equal_fused(key, solver):
    """Constant steps of an explicit solver, saved on the step grid (float64)."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    ts = jnp.linspace(0.0, 1.0, 3)
    a, b = [ja.solve_flow(dyn, x0, ts, solver=solver, dt0=0.1, strategy=s,
                          stepsize_controller=dfx.ConstantStepSize())
            for s in ("kernel", "fused")]
    assert a.shape == (B, 3, N, D) and _rel(a, b) < 1e-12


def _subjaxprs(eqn):
    for p in eqn.params.values():
        for sub in p if isinstance(p, list | tuple) else [p]:
            sub = getattr(sub, "jaxpr", sub)
            if hasattr(sub, "eqns"):
                yield sub


def _count(jaxpr) -> int:
    return sum(1 + sum(_count(s) for s in _subjaxprs(e)) for e in jaxpr.eqns)


def _kernel_sizes(jaxpr) -> list[int]:
    """The equation counts of the Pallas kernels in a program."""
    sizes = []
    for e in jaxpr.eqns:
        if e.primitive.name == "pallas_call":
            sizes.append(_count(getattr(e.params["jaxpr"], "jaxpr", e.params["jaxpr"])))
        for s in _subjaxprs(e):
            sizes += _kernel_sizes(s)
    return sizes


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_flow_stages_as_a_loop_on_the_manifold(key, monkeypatch):
    """RK4's stages run as iterations of the kernel's loop (one velocity in its body,
    not four), each step retracted onto E_W as ManifoldSolver retracts: equal to the
    fused path in float64, and the kernel's body well under the unrolled step's."""
    k1, k2 = jax.random.split(key)
    base = _model(k1)
    dyn = ja.SelfAttentionDynamics(base.P(0.0), base.U(0.0), W=np.array([[2.0, 0.3],
                                                                           [0.3, 1.0]]))
    x0 = random_tokens(k2, N, D, batch=(B,)) @ jnp.linalg.inv(jnp.linalg.cholesky(dyn.W)).T
    ts = jnp.linspace(0.0, 0.6, 3)

    def flow(dyn, x0, strategy, ts=ts):
        return ja.solve_flow(dyn, x0, ts, solver=ja.RK4(), dt0=0.1, strategy=strategy,
                             stepsize_controller=dfx.ConstantStepSize())
    a, b = flow(dyn, x0, "kernel"), flow(dyn, x0, "fused")
    assert _rel(a, b) < 1e-12

    # The body at S1's shape (10 tokens in R³, 2 heads): one velocity and the stage's
    # selects against four velocities (traced, not run).
    big = ja.random_dynamics(k1, 2, 3)
    xs = random_tokens(k2, 10, 3, batch=(B,))

    def body_size(ts):
        run = lambda d, x: flow(d, x, "kernel", ts)  # noqa: E731
        return max(_kernel_sizes(jax.make_jaxpr(run)(big, xs).jaxpr))
    staged = body_size(ts)
    monkeypatch.setattr(pallas_kernel, "chained", lambda coeffs: False)
    # Other save times: a program the jitted run has not traced before.
    unrolled = body_size(jnp.linspace(0.0, 0.8, 3))
    assert staged < 0.4 * unrolled


def test_flow_stages_lower_for_cuda(key):
    """RK4's staged loop (its selects and floors on lanes) lowers to one Triton kernel."""
    from jaxattn._strategy.pallas_kernel import _flow_kernel
    from jaxattn._strategy.stepping import kernel_plan
    with jax.enable_x64(False):
        dyn = _model(key)
        x0 = random_tokens(key, N, D, batch=(B,)).astype(jnp.float32)
        plan = kernel_plan(jnp.linspace(0.0, 1.0, 2), ja.RK4(), dfx.ConstantStepSize(),
                            0.2, 100)

        def run(x):
            return _flow_kernel(dyn, x, *plan, False, KernelConfig(64, 2), False)[0]
        text = jax.jit(run).trace(x0).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_an_empty_batch_gives_the_empty_result(key):
    """No system: no kernel is launched, and the result is every member's empty one
    (a zero-size batch raised ZeroDivisionError inside JAX's reshape)."""
    dyn = _model(key)
    x0 = jnp.ones((0, N, D))
    layers = ja.run_layers(dyn, x0, 2, 0.3, strategy="kernel")
    assert layers.shape == ja.run_layers(dyn, x0, 2, 0.3, strategy="general").shape
    ts = jnp.linspace(0.0, 0.4, 3)
    flow = ja.solve_flow(dyn, x0, ts, solver=dfx.Euler(), dt0=0.1, strategy="kernel")
    assert flow.shape == (0, 3, N, D)
    with pytest.raises(ValueError, match="constant steps"):  # refused as for any batch
        ja.solve_flow(dyn, x0, ts, strategy="kernel")


def test_flow_refusals(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    ts = jnp.linspace(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="Euler and explicit Runge"):
        ja.solve_flow(dyn, x0, ts, solver=dfx.ImplicitEuler(), dt0=0.1, strategy="kernel")
    with pytest.raises(ValueError, match="constant steps"):
        ja.solve_flow(dyn, x0, ts, strategy="kernel")
    with pytest.raises(ValueError, match="step grid"):
        ja.solve_flow(dyn, x0, ts, solver=dfx.Euler(), dt0=0.3, strategy="kernel")
    with pytest.raises(ValueError, match="solution="):
        ja.solve_flow(dyn, x0, ts, solver=dfx.Euler(), dt0=0.1, strategy="kernel",
                      solution=True)


VARIANTS = [dict(norm=p) for p in ("pre", "peri", "ngpt", "none")] + [
    dict(kernel=k) for k in ("exp", "usa", "hardmax", "sigmoid")] + [
    dict(causal=True), dict(window=2), dict(mask=np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]], bool)),
    dict(W=np.array([[2.0, 0.3], [0.3, 1.0]])), dict(precision="bfloat16"),
    dict(precision="tensorfloat32")]


@pytest.mark.slow
@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: "-".join(
    f"{k}={v if isinstance(v, str | bool | int) else 'array'}" for k, v in o.items()))
def test_every_variant_equals_fused(key, options):
    """Every norm placement, attention kernel, mask, metric and precision (float64)."""
    k1, k2 = jax.random.split(key)
    base = _model(k1)
    dyn = ja.SelfAttentionDynamics(base.P(0.0), base.U(0.0), **options)
    # Hardmax's weights jump where two logits tie, and its layers bring tokens to such
    # ties: two programs 1e-16 apart after one layer pick different tokens in the next
    # (measured). So its two programs are compared over one layer from random tokens.
    layers = 1 if options.get("kernel") == "hardmax" else L
    a, b = _both(dyn, random_tokens(k2, N, D, batch=(B,)), layers)
    assert _rel(a, b) < 1e-12


@pytest.mark.slow
def test_value_noise_draws_the_same_paths(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    a, b = _both(dyn, x0, noise=ja.ValueNoise(0.3), key=key)
    assert _rel(a, b) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("noise", [ja.TokenNoise(0.5), ja.ValueNoise(0.5)],
                         ids=["token", "value"])
def test_noisy_flow_agrees_in_law(noise):
    """The noisy flow's kernel (its `ΔW` from each system's key) against diffrax's
    solves on Brownian trees: per system the squared distance of the final tokens from
    the noiseless flow's, its mean over 300 systems within 4 joint standard errors
    (and far from 0: the statistic sees the noise)."""
    dyn = ja.random_dynamics(jax.random.key(0), 1, D)
    x0 = random_tokens(jax.random.key(1), N, D, batch=(300,))
    ts = jnp.array([0.0, 1.0])
    still = ja.solve_flow(dyn, x0, ts, solver=noise.default_solver, dt0=0.1,
                          stepsize_controller=dfx.ConstantStepSize(), strategy="kernel")

    def spread(strategy):
        y = ja.solve_flow(dyn, x0, ts, dt0=0.1, noise=noise, key=jax.random.key(5),
                          strategy=strategy)
        r = np.asarray(jnp.sum((y[:, -1] - still[:, -1]) ** 2, axis=(-2, -1)))
        return r.mean(), r.std(ddof=1) / np.sqrt(r.size)

    kernel, general = spread("kernel"), spread("general")
    assert abs(kernel[0] - general[0]) < 4 * np.hypot(kernel[1], general[1])
    assert kernel[0] > 10 * kernel[1]


def test_block_padding(key):
    """A batch that is not a multiple of the block (the last block padded)."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    with use_kernel_config(block=2, num_warps=1):
        a = ja.run_layers(dyn, x0, L, 0.3, strategy="kernel")
    b = ja.run_layers(dyn, x0, L, 0.3, strategy="fused")
    assert _rel(a, b) < 1e-12


def test_refusals(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    blocked = ja.SelfAttentionDynamics(dyn.P(0.0), dyn.U(0.0), block_size=2)
    with pytest.raises(ValueError, match="runs dense attention"):
        ja.run_layers(blocked, x0, L, strategy="kernel")
    with pytest.raises(ValueError, match="one device"):
        ja.run_layers(dyn, x0, L, strategy="kernel", devices=1)
    with pytest.raises(ValueError, match="not differentiable"):
        jax.grad(lambda x: ja.run_layers(dyn, x, L, strategy="kernel").sum())(x0)
    with pytest.raises(ValueError, match="power of two"):
        KernelConfig(block=48)
    with pytest.raises(ValueError, match="`block` must be a power of two, got True"):
        ja.PallasKernel(block=True)  # a bool is no size (it counted as 1)
    with pytest.raises(ValueError, match="`num_warps` must be a power of two"):
        ja.PallasKernel(num_warps=3)
    with pytest.raises(ValueError, match="up to 32 .CUDA's 1024 threads a block., got 64"):
        ja.PallasKernel(num_warps=64)  # lowered, and could not launch


def test_numpy_integer_layout_is_taken():
    """A NumPy integer size is a size (it was refused as "not a power of two"), stored as
    an int; a NumPy bool is still refused."""
    member = ja.PallasKernel(block=np.int64(4), num_warps=np.int32(2))
    assert member == ja.PallasKernel(block=4, num_warps=2)
    assert type(member.block) is int and type(member.num_warps) is int
    config = KernelConfig(block=np.int64(8), num_warps=np.int64(4))
    assert config == KernelConfig(8, 4) and type(config.block) is int
    with use_kernel_config(block=np.int32(16)) as config:
        assert type(config.block) is int
    with pytest.raises(ValueError, match="`block` must be a power of two, got 3"):
        ja.PallasKernel(block=np.int64(3))
    with pytest.raises(ValueError, match="`block` must be a power of two"):
        KernelConfig(block=np.bool_(True))


def _scheduled(dyn, w):
    """`dyn` with its value weights a `ja.Schedule` closing over `w`."""
    return ja.SelfAttentionDynamics(ja.Schedule(lambda t: dyn.P(0.0) * w), dyn.U(0.0))


def test_closures_over_traced_values_run(key):
    """`observe` and a schedule closing over a value traced by `jit` or `vmap`: the value
    enters the kernel as an input (it was converted with NumPy: a TracerArrayConversionError)."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    ws = jnp.array([0.5, 2.0])

    def observed(w, strategy):
        return ja.run_layers(dyn, x0, 2, 0.3, observe=lambda x: jnp.sum(x * w),
                             strategy=strategy)

    def scheduled(w, strategy):
        return ja.run_layers(_scheduled(dyn, w), x0, 2, 0.3, observe=ja.misalignment,
                             strategy=strategy)

    for run, transform, w in ((observed, jax.jit, 1.5), (observed, jax.vmap, ws),
                              (scheduled, jax.jit, 1.5)):
        a, b = [transform(functools.partial(run, strategy=s))(w) for s in ("kernel", "fused")]
        assert a.shape == b.shape and _rel(a, b) < 1e-12, (run.__name__, transform.__name__)


@pytest.mark.slow  # six kernels traced and compiled: 8 s with the cores shared
def test_closures_over_traced_keys_run(key):
    """`observe` drawing from a key that `jit` traces (a typed key, or its raw words) or
    `vmap` maps: the typed key enters the kernel as its threefry words (it reached the
    draw as an opaque constant: "draws from one key per system"); another key
    implementation is refused by name."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))

    def observed(k, strategy):
        return ja.run_layers(dyn, x0, 2, 0.3, strategy=strategy, observe=lambda x: jnp.sum(
            x * jax.random.normal(k, x.shape, x.dtype)))

    typed = jax.random.key(3)
    for transform, k in ((jax.jit, typed), (jax.jit, jax.random.key_data(typed)),
                         (jax.vmap, jax.random.split(typed, 2))):
        a, b = [transform(functools.partial(observed, strategy=s))(k) for s in ("kernel", "fused")]
        assert a.shape == b.shape and _rel(a, b) < 1e-12, transform.__name__
    with pytest.raises(ValueError, match="threefry keys only, got key implementation 'rbg'"):
        jax.jit(functools.partial(observed, strategy="kernel"))(jax.random.key(3, impl="rbg"))


@pytest.mark.slow  # 21 s in a fresh clone: six runs compiled under vmap
def test_a_schedule_closing_over_a_vmapped_value_runs_on_every_member(key):
    """A schedule closing over the value `vmap` maps: every member's run equals the
    same runs one value at a time (the host check of "general" and "fused" could not
    read the traced result: ConcretizationTypeError)."""
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    ws = jnp.array([0.5, 2.0])
    ts = jnp.linspace(0.0, 0.2, 3)

    def layers(w, strategy):
        return ja.run_layers(_scheduled(dyn, w), x0, 2, 0.3, observe=ja.misalignment,
                             strategy=strategy)

    def flow(w, strategy):
        return ja.solve_flow(_scheduled(dyn, w), x0, ts, solver=ja.RK4(), dt0=0.1,
                             stepsize_controller=dfx.ConstantStepSize(), strategy=strategy)

    for run in (layers, flow):
        for strategy in ("general", "fused", "kernel"):
            mapped = jax.vmap(functools.partial(run, strategy=strategy))(ws)
            one = jnp.stack([run(w, strategy) for w in ws])
            assert _rel(mapped, one) < 1e-12, (run.__name__, strategy)


def test_closures_over_differentiated_values_are_refused(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))
    ts = jnp.linspace(0.0, 0.2, 3)
    runs = [lambda w: ja.run_layers(dyn, x0, 2, 0.3, observe=lambda x: jnp.sum(x * w),
                                    strategy="kernel"),
            lambda w: ja.run_layers(_scheduled(dyn, w), x0, 2, 0.3, strategy="kernel"),
            lambda w: ja.solve_flow(_scheduled(dyn, w), x0, ts, solver=ja.RK4(), dt0=0.1,
                                    stepsize_controller=dfx.ConstantStepSize(),
                                    strategy="kernel")]
    for run in runs:
        with pytest.raises(ValueError, match="strategy='kernel' is not differentiable"):
            jax.grad(lambda w: run(w).sum())(1.5)


def test_unsupported_operation_is_named(key):
    k1, k2 = jax.random.split(key)
    dyn, x0 = _model(k1), random_tokens(k2, N, D, batch=(B,))

    def observe(x):  # a sort has no lane rule
        return jnp.sort(x[:, 0])
    with pytest.raises(ValueError, match="no rule for the operation `sort`"):
        ja.run_layers(dyn, x0, L, observe=observe, strategy="kernel")


def test_a_piecewise_constant_stack_is_named(key):
    """The looped-transformer schedule indexes its stack by time: refused by its name."""
    k1, k2 = jax.random.split(key)
    Ps = jax.random.normal(k1, (3, 2, D, D))
    dyn = ja.SelfAttentionDynamics(ja.PiecewiseConstant(Ps, 0.2), Ps[0])
    with pytest.raises(ValueError, match="PiecewiseConstant schedule indexes its stack"):
        ja.run_layers(dyn, random_tokens(k2, N, D, batch=(B,)), L, strategy="kernel")


def test_auto_never_picks_the_kernel(key):
    from jaxattn._strategy import choose_strategy
    dyn = _model(key)
    assert choose_strategy(dyn, (B, N, D), "auto") == ja.BatchLast()


def _lowered_for_cuda(config: KernelConfig) -> str:
    with jax.enable_x64(False), use_kernel_config(**config.__dict__):
        dyn = _model(jax.random.PRNGKey(0))
        x0 = random_tokens(jax.random.PRNGKey(1), N, D, batch=(B,)).astype(jnp.float32)

        def run(x):
            return run_layers_unchecked(dyn, x, L, 0.3, strategy="kernel")
        return jax.jit(run).trace(x0).lower(lowering_platforms=("cuda",)).as_text()


def test_lowers_for_cuda():
    """Lowered for CUDA on this CPU-only machine: the compiled (Triton) kernel, not
    interpret mode (the platform is chosen at lowering)."""
    text = _lowered_for_cuda(KernelConfig(block=64, num_warps=2))
    assert "__gpu$xla.gpu.triton" in text


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_gpu_check_dry_run(tmp_path):
    """`benchmarks/gpu_check.py --dry-run`: every stage at tiny sizes in interpret
    mode, no stage with an error."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = data["stages"]
    assert stages["S1"]["rel_diff_kernel_vs_fused"] < 1e-5
    assert stages["SN"]["rel_diff_kernel_vs_fused"] < 1e-5
    assert stages["RK4"]["rel_diff_kernel_vs_fused"] < 1e-5
    for case in ("S1", "S1L", "RK4"):  # judged against float64, every system
        law = stages[case]["law"]
        assert law["agree"] and law["systems"] == data["stages"][case]["size"]["batch"], law
    assert stages["MF_flash"]["layouts"][0]["rel_diff_vs_blocked"] < 1e-5
    assert max(stages["MF_flash"]["grad_rel_diff_vs_blocked"]) < 1e-5
    assert stages["MF_wide"]["d"] == 20 and stages["MF_wide"]["median_s"] > 0
    assert not [k for k, v in stages.items() if "error" in v]
