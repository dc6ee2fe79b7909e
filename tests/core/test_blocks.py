"""Attention in key blocks (`block_size=`, `jaxattn._blocks`) against the dense path:
every kernel, mask, head layout, norm and metric; gradients (custom VJP) against the
dense gradient and finite differences; memory; tokens split over devices."""

import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from _helpers import random_spd, run_on_forced_devices

import jaxattn as ja
from jaxattn import _dynamics

N, D = 23, 4  # 23 tokens in blocks of 4 keys: the last block is padding
MASKS = ({}, {"causal": True}, {"window": 5}, {"mask": True},
         {"causal": True, "window": 3, "mask": True})


def _tokens(dtype, n=N, d=D, key=1):
    x = jax.random.normal(jax.random.PRNGKey(key), (n, d), dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _model(form, kernel, opts, dtype, block_size, n=N, d=D, **extra):
    opts = dict(opts)
    if opts.pop("mask", False):
        opts["mask"] = ja.random_mask(jax.random.PRNGKey(3), n, 0.4)
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    U = jax.random.normal(k[0], (4, d, d), dtype) / d
    common = dict(beta=3.0, kernel=kernel, block_size=block_size, **opts, **extra)
    if form == "P":
        return ja.SelfAttentionDynamics(jax.random.normal(k[1], (4, d, d), dtype) / d, U,
                                        **common)
    Q = jax.random.normal(k[2], (4, 2, d), dtype) / 2  # four heads, two key groups
    K = jax.random.normal(k[3], (2, 2, d), dtype) / 2
    return ja.SelfAttentionDynamics.from_factors(Q, K, U, **common)


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel", ["softmax", "sigmoid", "exp"])
def test_blocks_equal_dense_for_every_mask_and_head_layout(kernel):
    x64, x32 = _tokens(jnp.float64), _tokens(jnp.float32)
    for opts in MASKS:
        for form in ("P", "QK"):
            dense = _model(form, kernel, opts, jnp.float64, None).raw_update(0.0, x64)
            blocks = _model(form, kernel, opts, jnp.float64, 4).raw_update(0.0, x64)
            assert _rel(dense, blocks) < 1e-12, (opts, form)
            dense = _model(form, kernel, opts, jnp.float32, None).raw_update(0.0, x32)
            blocks = _model(form, kernel, opts, jnp.float32, 4).raw_update(0.0, x32)
            assert _rel(dense, blocks) < 1e-6, (opts, form)


@pytest.mark.parametrize("norm", _dynamics.NORMS)
def test_blocks_equal_dense_for_every_norm_with_a_metric(norm):
    W = random_spd(jax.random.PRNGKey(5), D).astype(jnp.float64)
    x = _tokens(jnp.float64)
    dense = _model("P", "softmax", {"causal": True}, jnp.float64, None, W=W, norm=norm)
    blocks = _model("P", "softmax", {"causal": True}, jnp.float64, 5, W=W, norm=norm)
    assert _rel(dense.layer(0.0, x, 0.3), blocks.layer(0.0, x, 0.3)) < 1e-12
    assert _rel(dense.velocity(0.0, x), blocks.velocity(0.0, x)) < 1e-12


@pytest.mark.parametrize("kernel", [  # softmax, sigmoid: warm over ~3 s (the slow tests)
    *(pytest.param(k, marks=pytest.mark.slow) for k in ("softmax", "sigmoid")), "exp"])
def test_blocked_gradient_equals_dense_and_finite_differences(kernel):
    x = _tokens(jnp.float64)
    opts = {"causal": True, "window": 6}
    extra = {"bias": -1.5} if kernel == "sigmoid" else {}

    def loss(model, x):
        return jnp.sum(jnp.sin(3 * model.layer(0.0, x, 0.5)))

    dense, blocks = (_model("QK", kernel, opts, jnp.float64, b, **extra) for b in (None, 4))
    g_dense = eqx.filter_grad(loss)(dense, x)
    g_blocks = eqx.filter_grad(loss)(blocks, x)
    for a, b in zip(jax.tree.leaves(g_dense), jax.tree.leaves(g_blocks)):
        assert _rel(a, b) < 1e-11
    gx = jax.grad(loss, argnums=1)(blocks, x)
    assert _rel(jax.grad(loss, argnums=1)(dense, x), gx) < 1e-11
    # a directional finite difference, central, in float64
    u = jax.random.normal(jax.random.PRNGKey(9), x.shape, jnp.float64)
    h = 1e-6
    fd = (loss(blocks, x + h * u) - loss(blocks, x - h * u)) / (2 * h)
    assert abs(float(fd - jnp.sum(gx * u))) < 1e-7 * max(1.0, abs(float(fd)))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_run_layers_and_solve_flow_with_blocks_equal_dense():
    x = jnp.stack([_tokens(jnp.float64, key=k) for k in (1, 2)])
    dense, blocks = (_model("P", "softmax", {}, jnp.float64, b) for b in (None, 8))
    assert _rel(ja.run_layers(dense, x, 4, 0.2), ja.run_layers(blocks, x, 4, 0.2)) < 1e-12
    ts = jnp.linspace(0.0, 1.0, 3)
    assert _rel(ja.solve_flow(dense, x, ts), ja.solve_flow(blocks, x, ts)) < 1e-10

    def loss(model):
        return jnp.sum(ja.run_layers(model, x[0], 3, 0.2)[-1] ** 3)

    ga, gb = eqx.filter_grad(loss)(dense), eqx.filter_grad(loss)(blocks)
    assert _rel(ga.P.value, gb.P.value) < 1e-11


@pytest.mark.slow  # 15 s: reverse mode through diffrax's solve and the blocks' VJP
def test_blocked_gradient_through_solve_flow_equals_dense():
    x = _tokens(jnp.float64)
    ts = jnp.linspace(0.0, 1.0, 3)
    dense, blocks = (_model("P", "softmax", {}, jnp.float64, b) for b in (None, 8))

    def flow_loss(model):
        return jnp.sum(ja.solve_flow(model, x, ts, rtol=1e-10, atol=1e-10)[-1] ** 3)

    ga, gb = eqx.filter_grad(flow_loss)(dense), eqx.filter_grad(flow_loss)(blocks)
    assert _rel(ga.P.value, gb.P.value) < 1e-9


def test_blocked_layer_and_gradient_never_hold_the_n_by_n_scores():
    n = 20_000
    model = ja.random_dynamics(jax.random.PRNGKey(0), 1, 3, dtype=jnp.float32)
    x = jax.ShapeDtypeStruct((n, 3), jnp.float32)
    assert model.blocked(n)  # the default chooses blocks at this size
    scores = n * n * 4
    layer = jax.jit(lambda x: model.layer(0.0, x, 0.1)).lower(x).compile()
    grad = jax.jit(jax.grad(lambda x: jnp.sum(model.layer(0.0, x, 0.1) ** 2))).lower(x)
    for compiled in (layer, grad.compile()):
        assert compiled.memory_analysis().temp_size_in_bytes < scores / 20


def test_block_size_is_checked_and_the_fused_path_refuses_it():
    U = jnp.eye(3)[None]
    with pytest.raises(ValueError, match="block_size"):
        ja.SelfAttentionDynamics(U, U, block_size=-1)
    assert not ja.SelfAttentionDynamics(U, U, block_size=0).blocked(10**6)  # dense, forced
    model = ja.SelfAttentionDynamics(U, U, block_size=4)
    x = jnp.ones((3, 5, 3))
    with pytest.raises(ValueError, match=r"strategy=ja.Vmap\(\) \('general'"):
        ja.run_layers(model, x, 1, 0.1, strategy="fused")
    assert not ja.SelfAttentionDynamics(U, U).blocked(8)
    assert ja.SelfAttentionDynamics(U, U).blocked(4096)


def test_shard_is_checked():
    model = _model("P", "softmax", {}, jnp.float32, 4)
    x = _tokens(jnp.float32)
    with pytest.raises(ValueError, match="`shard` must be one of"):
        ja.run_layers(model, x, 1, 0.1, shard="heads")
    one = ja.run_layers(model, x, 1, 0.1, shard="tokens")  # one device: the ring of one
    assert _rel(ja.run_layers(model, x, 1, 0.1), one) < 1e-6


@pytest.mark.slow
def test_tokens_split_over_devices_equal_one_device():
    script = textwrap.dedent("""
        import json, jax, jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)
        import jaxattn as ja
        n, d = 64, 3
        x = jax.random.normal(jax.random.PRNGKey(1), (n, d))
        mask = ja.random_mask(jax.random.PRNGKey(3), n, 0.3)
        errs = {}
        for name, opts in [("full", {}), ("causal", dict(causal=True)),
                           ("window", dict(window=7)), ("mask", dict(mask=mask)),
                           ("sigmoid", dict(kernel="sigmoid")), ("exp", dict(kernel="exp"))]:
            dyn = ja.random_dynamics(jax.random.PRNGKey(0), 2, d, beta=2.0, block_size=8,
                                     **opts)
            one = ja.run_layers(dyn, x, 3, 0.2)
            four = ja.run_layers(dyn, x, 3, 0.2, devices=4, shard="tokens")
            errs[name] = float(jnp.abs(one - four).max())
        ts = jnp.linspace(0.0, 1.0, 3)
        dyn = ja.random_dynamics(jax.random.PRNGKey(0), 2, d, beta=2.0, causal=True)
        flow = ja.solve_flow(dyn, x, ts, devices=4, shard="tokens")
        errs["flow"] = float(jnp.abs(ja.solve_flow(dyn, x, ts) - flow).max())
        spec = str(four.sharding.spec)
        try:
            ja.run_layers(dyn, x[:62], 1, 0.1, devices=4, shard="tokens")
            refused = ""
        except ValueError as e:
            refused = str(e)
        print(json.dumps({"devices": len(jax.devices()), "errs": errs, "spec": spec,
                          "refused": refused}))
    """)
    res = run_on_forced_devices(script, timeout=300)
    assert max(res["errs"].values()) < 1e-12, res["errs"]
    assert "tokens" in res["spec"]  # the result stays split by tokens
    assert "multiple of 4" in res["refused"]


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize("kernel", ["softmax", "usa", "sigmoid"])
def test_forward_mode_through_the_blocks_equals_the_dense_jvp(kernel):
    x = _tokens(jnp.float64, n=13)
    dense = _model("P", kernel, {"causal": True}, jnp.float64, 0, n=13)
    blocks = _model("P", kernel, {"causal": True}, jnp.float64, 4, n=13).with_forward_mode()
    v = jax.random.normal(jax.random.PRNGKey(8), x.shape)
    _, t_dense = jax.jvp(lambda y: dense.velocity(0.0, y), (x,), (v,))
    _, t_blocks = jax.jvp(lambda y: blocks.velocity(0.0, y), (x,), (v,))
    assert _rel(t_blocks, t_dense) < 1e-12
    # reverse mode through the same sweep, and the custom VJP of the default model
    g = [jax.grad(lambda y: jnp.sum(m.velocity(0.0, y) ** 2))(x) for m in
         (dense, blocks, _model("P", kernel, {"causal": True}, jnp.float64, 4, n=13))]
    assert _rel(g[1], g[0]) < 1e-12 and _rel(g[2], g[0]) < 1e-12


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_implicit_solvers_run_on_the_blocked_path():
    """Kvaerno3's Newton steps take Jacobian–vector products: `solve_flow` gives the
    blocks a forward mode (a custom VJP alone raised a TypeError here)."""
    import diffrax as dfx

    eye = jnp.eye(2)[None]
    x0 = ja.sample_ellipsoid(jax.random.PRNGKey(0), 40, 2)
    ts = jnp.linspace(0.0, 1.0, 3)
    runs = [ja.solve_flow(ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa",
                                                   block_size=size), x0, ts,
                          solver=dfx.Kvaerno3(), rtol=1e-8, atol=1e-10) for size in (0, 8)]
    assert _rel(runs[1], runs[0]) < 1e-12
    reference = ja.solve_flow(ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa"), x0,
                              ts, rtol=1e-11, atol=1e-13)
    assert float(jnp.max(jnp.abs(runs[1] - reference))) < 1e-6


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_an_implicit_solver_takes_a_matrix_free_root_finder_on_the_blocked_path():
    """Newton with GMRES (no Jacobian materialised: what a large n needs,
    docs/limits.md) gives the dense default root finder's solution in blocks."""
    import diffrax as dfx

    eye = jnp.eye(2)[None]
    x0 = ja.sample_ellipsoid(jax.random.PRNGKey(0), 40, 2)
    ts = jnp.linspace(0.0, 1.0, 3)
    free = matrix_free_kvaerno3(rtol=1e-9, atol=1e-11, restart=30)
    blocked = ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa", block_size=8)
    ys = ja.solve_flow(blocked, x0, ts, solver=free, rtol=1e-8, atol=1e-10)
    dense = ja.solve_flow(ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa"), x0, ts,
                          solver=dfx.Kvaerno3(), rtol=1e-8, atol=1e-10)
    assert _rel(ys, dense) < 1e-7


def _half_circle(n):
    """n tokens on the upper half circle: an O(1) field (uniform tokens barely move)."""
    theta = jnp.pi * jax.random.uniform(jax.random.PRNGKey(0), (n,), jnp.float64)
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


def _implicit_against_explicit(n, solver, t1):
    eye = jnp.eye(2)[None]
    dyn = ja.SelfAttentionDynamics(eye, eye, beta=4.0, kernel="usa")
    assert dyn.blocked(n)
    x0, ts = _half_circle(n), jnp.array([0.0, t1])
    ys = ja.solve_flow(dyn, x0, ts, solver=solver, rtol=1e-6, atol=1e-9)
    reference = ja.solve_flow(dyn, x0, ts, rtol=1e-10, atol=1e-12)
    moved = float(jnp.max(jnp.abs(reference[-1] - x0)))
    assert moved > 1e-3
    assert float(jnp.max(jnp.abs(ys - reference))) < 1e-3 * moved


@pytest.mark.slow
def test_implicit_solvers_at_the_size_where_blocks_take_over():
    """n = 600 (float64, one head: past `DENSE_LIMIT`), as `jaxattn run metastability
    --tokens 600` integrates it (past `JACOBIAN_LIMIT`, so `solve_flow` swaps
    diffrax's default root finder for Newton–GMRES), against an explicit solve."""
    import diffrax as dfx

    _implicit_against_explicit(600, dfx.Kvaerno3(), 0.1)


def matrix_free_kvaerno3(rtol=1e-6, atol=1e-9, restart=4):
    """Kvaerno3 with Newton–GMRES (GMRES ten times tighter than Newton), as
    docs/limits.md gives it for large n: GMRES builds its whole Krylov basis
    (`restart` products) before it checks convergence, so a short basis keeps an
    implicit step near a few dozen products."""
    import diffrax as dfx
    import lineax as lx
    import optimistix as optx

    return dfx.Kvaerno3(root_finder=optx.Newton(
        rtol=rtol, atol=atol, linear_solver=lx.GMRES(rtol=rtol / 10, atol=atol / 10,
                                                     restart=restart, stagnation_iters=30)))


@pytest.mark.slow
def test_implicit_solvers_at_five_thousand_tokens():
    """n = 5,000 (float64: 200 MB of dense weights, so blocks): a matrix-free Kvaerno3
    equals an explicit solve."""
    _implicit_against_explicit(5000, matrix_free_kvaerno3(), 0.03)
