"""The dynamics' blocked attention with the Pallas flash kernel (`jaxattn._blocks`'s
`use_flash`): in interpret mode it equals the XLA key-block sweep, values and
gradients; a CUDA lowering on this CPU machine takes the kernel, and the CPU path
stays the XLA sweep alone."""

import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from _helpers import run_on_forced_devices

import jaxattn as ja
from jaxattn._blocks import FLASH_MAX_DIM, use_flash

N, D = 23, 3  # 23 tokens in blocks of 8 keys: padding in the last block


def _model(kernel, dtype=jnp.float64, d=D, **opts):
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    P = jax.random.normal(k[0], (2, d, d), dtype) / d
    U = jax.random.normal(k[1], (2, d, d), dtype) / d
    return ja.SelfAttentionDynamics(P, U, beta=3.0, kernel=kernel, block_size=8, **opts)


def _tokens(dtype=jnp.float64, d=D):
    x = jax.random.normal(jax.random.PRNGKey(1), (N, d), dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _velocity(dyn, x):
    return dyn.velocity(0.0, x)


def _grads(dyn, x, weights):
    return eqx.filter_grad(lambda dx: jnp.sum(_velocity(*dx) * weights))((dyn, x))


def _rel(a, b) -> float:
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _fresh(fn):
    """A new function object: JAX caches traces by function, and `use_flash` is read
    when a program is traced (as `use_kernel_config` is)."""
    return lambda *a: fn(*a)


def _uses_kernel(fn, *args) -> bool:
    return "pallas_call" in str(jax.make_jaxpr(_fresh(fn))(*args))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel,opts", [
    ("softmax", {}), ("softmax", {"causal": True}), ("usa", {"window": 5}),
    (ja.Sigmoid(bias=-1.0), {"causal": True}), ("exp", {})])
def test_flash_equals_the_xla_sweep(kernel, opts):
    """The velocity and its gradient (model and tokens) in float64, to 1e-12."""
    dyn, x = _model(kernel, **opts), _tokens()
    assert dyn.blocked(N, x.dtype)
    weights = jax.random.normal(jax.random.PRNGKey(2), (N, D))
    out = {}
    for mode in ("always", "never"):
        with use_flash(mode):
            assert _uses_kernel(_velocity, dyn, x) == (mode == "always")
            out[mode] = (jax.jit(_fresh(_velocity))(dyn, x), _grads(dyn, x, weights))
    assert _rel(out["always"][0], out["never"][0]) < 1e-12
    flash, sweep = (jax.tree.leaves(eqx.filter(out[m][1], eqx.is_inexact_array))
                    for m in ("always", "never"))
    assert len(flash) == len(sweep) >= 3
    for a, b in zip(flash, sweep):
        assert _rel(a, b) < 1e-12


def test_float32_layer_and_small_layout():
    """A float32 layer at a 16 × 16 layout: 1e-5 relative to the sweep."""
    with jax.enable_x64(False):
        dyn, x = _model("softmax", jnp.float32), _tokens(jnp.float32)
        runs = {}
        for mode in ("always", "never"):
            with use_flash(mode, block_q=16, block_k=16):
                runs[mode] = jax.jit(lambda d, y: d.layer(0.0, y, 0.1))(dyn, x)
        assert runs["always"].dtype == jnp.float32
        assert _rel(runs["always"], runs["never"]) < 1e-5


@pytest.mark.parametrize("kernel,opts", [("hardmax", {}), ("softmax", {"mask": True}),
                                         ("softmax", {"precision": "bfloat16"})])
def test_what_the_kernel_does_not_take_keeps_the_sweep(kernel, opts):
    if opts.pop("mask", False):
        opts["mask"] = ja.random_mask(jax.random.PRNGKey(3), N, 0.4)
    dyn, x = _model(kernel, **opts), _tokens()
    with use_flash("always"):
        assert not _uses_kernel(_velocity, dyn, x)


def _lowered(dyn, x, platform):
    return jax.jit(_fresh(_velocity)).trace(dyn, x).lower(lowering_platforms=(platform,)).as_text()


def test_cuda_lowering_takes_the_kernel_and_the_cpu_keeps_the_sweep():
    with jax.enable_x64(False):
        dyn, x = _model("softmax", jnp.float32), _tokens(jnp.float32)
        with use_flash("cuda"):
            cuda = _lowered(dyn, x, "cuda")
            cpu = _lowered(dyn, x, "cpu")
            tpu = _lowered(dyn, x, "tpu")  # a TPU takes XLA's sweep: no Triton kernel there
        assert "__gpu$xla.gpu.triton" in cuda
        assert "triton" not in cpu and "triton" not in tpu
        # Past FLASH_MAX_DIM the kernel's unrolled coordinates lose to XLA's products.
        wide = _model("softmax", jnp.float32, d=FLASH_MAX_DIM + 1)
        with use_flash("cuda"):
            assert "triton" not in _lowered(wide, _tokens(jnp.float32, FLASH_MAX_DIM + 1),
                                            "cuda")
        # "auto" (the default): on a host without a GPU the XLA sweep alone is traced.
        on_gpu = jax.default_backend() == "gpu"
        assert _uses_kernel(_velocity, dyn, x) == on_gpu
        assert ("platform_index" in str(jax.make_jaxpr(_fresh(_velocity))(dyn, x))) == on_gpu


def test_use_flash_refuses_unknown_settings():
    with pytest.raises(ValueError, match="mode"), use_flash("gpu"):
        pass
    with pytest.raises(ValueError, match="block_m"), use_flash(block_m=8):
        pass


def test_the_ring_of_one_device_takes_the_kernel_where_blocks_do():
    """`shard="tokens"` on one device (a ring of one): `"cuda"` traces the kernel beside
    the sweep (chosen at lowering: the CPU runs the sweep), `"always"` runs it (in
    interpret mode); both equal the unsplit run."""
    dyn, x = _model("softmax", causal=True), _tokens()
    one = ja.run_layers(dyn, x, 2, 0.1)

    def ring(y):
        return ja.run_layers(dyn, y, 2, 0.1, shard="tokens")
    for mode in ("cuda", "always"):
        with use_flash(mode, block_q=16, block_k=16):
            text = str(jax.make_jaxpr(_fresh(ring))(x))
            assert "pallas_call" in text
            assert _rel(jax.jit(_fresh(ring))(x), one) < 1e-12
    with jax.enable_x64(False):  # lowered for CUDA on this CPU: the compiled kernel
        dyn, x = _model("softmax", jnp.float32, causal=True), _tokens(jnp.float32)
        mesh = jax.sharding.Mesh(jax.devices()[:1], ("tokens",))
        with use_flash("cuda"):
            assert "__gpu$xla.gpu.triton" in _lowered(dyn.on_tokens(mesh), x, "cuda")


@pytest.mark.slow  # 4 forced devices, the kernel in interpret mode: about a minute
def test_the_ring_runs_the_kernel_on_each_device():
    """Tokens split over 4 devices, every share attended by the flash kernel and merged
    by log-normalisers: the layers and the velocity's gradient (model and tokens)
    equal one device's XLA sweep in float64, with causal and window masks (shares a
    query sees in part, or not at all) and a pointwise kernel."""
    script = textwrap.dedent("""
        import json, jax, jax.numpy as jnp, equinox as eqx
        jax.config.update("jax_enable_x64", True)
        import jaxattn as ja
        from jaxattn._batch import on_tokens
        from jaxattn._blocks import use_flash
        n, d = 64, 3
        x = jax.random.normal(jax.random.PRNGKey(1), (n, d))
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        w = jax.random.normal(jax.random.PRNGKey(2), (n, d))

        def grads(dyn, y):
            g = eqx.filter_grad(lambda m: jnp.sum(m[0].velocity(0.0, m[1]) * w))((dyn, y))
            return jax.tree.leaves(eqx.filter(g, eqx.is_inexact_array))

        res = {"devices": len(jax.devices())}
        for name, opts in [("causal", dict(causal=True)), ("window", dict(window=7)),
                           ("exp", dict(kernel="exp"))]:
            dyn = ja.random_dynamics(jax.random.PRNGKey(0), 2, d, beta=2.0, block_size=8,
                                     **opts)
            one, g1 = ja.run_layers(dyn, x, 2, 0.2), grads(dyn, x)
            with use_flash("always", block_q=16, block_k=16):
                four = ja.run_layers(dyn, x, 2, 0.2, devices=4, shard="tokens")
                ring, xs = on_tokens(dyn, x, 4)
                text = str(jax.make_jaxpr(lambda y: ring.velocity(0.0, y))(xs))
                g4 = grads(ring, xs)
            res[name] = {"layers": float(jnp.abs(one - four).max() / jnp.abs(one).max()),
                         "grads": max(float(jnp.abs(a - b).max() / jnp.abs(b).max())
                                      for a, b in zip(g4, g1)),
                         "leaves": len(g4), "kernels": text.count("pallas_call")}
        print(json.dumps(res))
    """)
    res = run_on_forced_devices(script, timeout=400)
    for name in ("causal", "window", "exp"):
        r = res[name]
        assert r["layers"] < 1e-12 and r["grads"] < 1e-12, (name, r)
        assert r["leaves"] >= 3 and r["kernels"] >= 1, (name, r)
