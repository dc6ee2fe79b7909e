"""The fused ensemble path (`strategy="fused"`, `jaxattn._ensemble`) against the general
one: same results to rounding over random shapes, heads, metrics, masks and
schedules; observe, statuses, gradients, vmap; the automatic choice."""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import random_spd, random_tokens

import jaxattn as ja
from jaxattn._ensemble import batch_last
from jaxattn._flow import solve_flow_unchecked
from jaxattn._stacked import models_last
from jaxattn._strategy import FUSED_MAX_FLOPS, choose_strategy, fused_applies

CONSTANT_STEPS = dfx.ConstantStepSize()


def _wobble(t, P0):
    return P0 * (1.0 + 0.3 * jnp.sin(2.0 * t))


def _model(key, h, d, *, W, causal, schedule):
    kP, kU, kW = jax.random.split(key, 3)
    P = 0.7 * jax.random.normal(kP, (h, d, d))
    U = 0.7 * jax.random.normal(kU, (h, d, d))
    if schedule == "piecewise":
        P = ja.PiecewiseConstant(jnp.stack([P, -P, 0.5 * P]), dt=0.1)
    elif schedule == "callable":
        P = ja.Schedule(_wobble, P)
    Wm = random_spd(kW, d) if W else None
    return ja.SelfAttentionDynamics(P, U, W=Wm, causal=causal, beta=1.3)


# (n, d, h, batch, W, causal, schedule): distinct sizes so that a swapped axis fails.
CASES = [
    (5, 3, 2, (7,), False, False, "constant"),
    (4, 2, 3, (2, 3), True, True, "piecewise"),
    (6, 4, 1, (5,), True, False, "callable"),
]


@pytest.mark.parametrize(("n", "d", "h", "batch", "W", "causal", "schedule"), CASES)
def test_fused_layers_equal_general(key, n, d, h, batch, W, causal, schedule):
    dyn = _model(key, h, d, W=W, causal=causal, schedule=schedule)
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d, dyn.W, batch=batch)
    general = ja.run_layers(dyn, x0, 9, 0.1, strategy="general")
    fused = ja.run_layers(dyn, x0, 9, 0.1, strategy="fused")
    assert fused.shape == general.shape == batch + (10, n, d)
    np.testing.assert_allclose(fused, general, rtol=0, atol=1e-12)
    if schedule != "constant":
        return
    observe = lambda x: (ja.misalignment(x, dyn.W), x[0])  # noqa: E731
    E, first = ja.run_layers(dyn, x0, 9, 0.1, observe=observe, strategy="fused")
    np.testing.assert_allclose(E, ja.misalignment(general, dyn.W), atol=1e-12)
    np.testing.assert_allclose(first, general[..., 0, :], atol=1e-12)


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
@pytest.mark.parametrize(("solver", "n", "d", "h", "batch", "W", "causal", "schedule"),
                         [(ja.RK4(), *CASES[0]), (dfx.Euler(), *CASES[1])], ids=["rk4", "euler"])
def test_fused_fixed_step_flow_equals_general(key, solver, n, d, h, batch, W, causal, schedule):
    dyn = _model(key, h, d, W=W, causal=causal, schedule=schedule)
    x0 = random_tokens(jax.random.fold_in(key, 2), n, d, dyn.W, batch=batch)
    ts = jnp.array([0.0, 0.13, 0.5, 0.71])  # save times between steps: the interpolant
    kw = dict(solver=solver, dt0=0.05, stepsize_controller=CONSTANT_STEPS, throw=False)
    general = ja.solve_flow(dyn, x0, ts, strategy="general", **kw)
    fused = ja.solve_flow(dyn, x0, ts, **kw)  # "auto" fuses constant steps
    np.testing.assert_allclose(fused.ys, general.ys, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fused.success, general.success)
    np.testing.assert_array_equal(fused.num_steps, general.num_steps)
    assert fused.success.shape == batch and bool(jnp.all(fused.success))


def test_fused_flow_reports_each_failed_system(key):
    dyn = _model(key, 2, 3, W=False, causal=False, schedule="constant")
    x0 = random_tokens(key, 4, 3, batch=(5,)).at[3, 1].set(jnp.nan)
    kw = dict(solver=ja.RK4(), dt0=0.1, stepsize_controller=CONSTANT_STEPS)
    ts = jnp.array([0.0, 1.0])
    # Unchecked, so that the NaN token reaches the solve (the checked entry refuses it).
    fused = solve_flow_unchecked(dyn, x0, ts, strategy="fused", **kw)
    np.testing.assert_array_equal(fused.success, [True, True, True, False, True])
    assert bool(jnp.all(jnp.isfinite(fused.ys[fused.success])))


def _fd_check(loss, arg, seed, eps=1e-6):
    """Central finite differences of `loss` along a random direction."""
    v = jax.random.normal(jax.random.PRNGKey(seed), arg.shape)
    fd = (loss(arg + eps * v) - loss(arg - eps * v)) / (2 * eps)
    return float(jnp.vdot(jax.grad(loss)(arg), v)), float(fd)


def test_fused_layer_gradient_matches_finite_differences(key):
    dyn = _model(key, 2, 3, W=True, causal=True, schedule="constant")
    x0 = random_tokens(jax.random.fold_in(key, 3), 5, 3, dyn.W, batch=(4,))
    U = dyn.U.value

    def layers(P):
        d = ja.SelfAttentionDynamics(P, U, W=dyn.W, causal=True, beta=1.3)
        return ja.run_layers(d, x0, 4, 0.2, observe=ja.misalignment, strategy="fused")[:, -1].sum()

    g, fd = _fd_check(layers, dyn.query_key(0.0), 0)
    assert abs(g - fd) <= 1e-6 * max(1.0, abs(fd)), (g, fd)


@pytest.mark.slow  # compiles the gradient of a diffrax solve twice
def test_fused_flow_gradient_matches_finite_differences_and_general(key):
    dyn = _model(key, 2, 3, W=True, causal=False, schedule="callable")
    x0 = random_tokens(jax.random.fold_in(key, 4), 5, 3, dyn.W, batch=(4,))

    def flow(x, strategy="fused"):
        ys = ja.solve_flow(dyn, x, jnp.array([0.0, 0.6]), solver=ja.RK4(), dt0=0.1,
                           stepsize_controller=CONSTANT_STEPS, max_steps=8, strategy=strategy)
        return ja.misalignment(ys[:, -1]).sum()

    g, fd = _fd_check(flow, x0, 1)
    assert abs(g - fd) <= 1e-6 * max(1.0, abs(fd)), (g, fd)
    np.testing.assert_allclose(jax.grad(flow)(x0), jax.grad(flow)(x0, "general"), atol=1e-11)


@pytest.mark.slow  # the default run covers the fused path; this adds an outer vmap
def test_fused_under_vmap_over_stacked_models(key):
    """A sweep's shape: models vmapped, each over its own batch, the batch fused."""
    h, d, n = 2, 3, 4
    Ps = jax.random.normal(key, (3, h, d, d))
    U = jnp.broadcast_to(jnp.eye(d), (h, d, d))
    x0 = random_tokens(jax.random.fold_in(key, 1), n, d, batch=(6,))
    stacked = eqx.filter_vmap(lambda P: ja.SelfAttentionDynamics(P, U))(Ps)
    out = eqx.filter_vmap(lambda m: ja.run_layers(m, x0, 5, 0.3, strategy="fused"))(stacked)
    for b in range(3):
        one = ja.run_layers(ja.SelfAttentionDynamics(Ps[b], U), x0, 5, 0.3, strategy="general")
        np.testing.assert_allclose(out[b], one, atol=1e-12)


def test_auto_strategy_choice(key):
    small = _model(key, 2, 3, W=False, causal=False, schedule="constant")
    assert choose_strategy(small, (1000, 10, 3), "auto") == ja.BatchLast()
    assert choose_strategy(small, (10, 3), "auto") == ja.Vmap()  # one sequence
    assert choose_strategy(small, (1, 10, 3), "auto") == ja.Vmap()
    assert choose_strategy(small, (10, 3), "fused") == ja.BatchLast()
    big = _model(key, 8, 64, W=False, causal=False, schedule="constant")
    assert not fused_applies(big, (16, 64, 64))
    assert 4 * 2 * 10 * 9 + 4 * 2 * 100 * 3 <= FUSED_MAX_FLOPS
    with pytest.raises(ValueError, match="strategy"):
        choose_strategy(small, (4, 10, 3), "fastest")
    with pytest.raises(ValueError, match="strategy"):
        ja.run_layers(small, jnp.ones((2, 4, 3)), 2, strategy="vmap")


def test_auto_keeps_adaptive_solves_per_system(key):
    """`"auto"` never fuses an adaptive solve (that would share one step size);
    `"fused"` does, as the labelled shared-step mode."""
    dyn = _model(key, 2, 3, W=False, causal=False, schedule="constant")
    x0 = random_tokens(key, 4, 3, batch=(6,))
    ts = jnp.array([0.0, 2.0])
    auto = ja.solve_flow(dyn, x0, ts, throw=False)
    general = ja.solve_flow(dyn, x0, ts, throw=False, strategy="general")
    np.testing.assert_array_equal(auto.ys, general.ys)
    shared = ja.solve_flow(dyn, x0, ts, throw=False, strategy="fused")
    assert len(set(np.asarray(shared.num_steps).tolist())) == 1
    assert len(set(np.asarray(general.num_steps).tolist())) > 1
    np.testing.assert_allclose(shared.ys, general.ys, atol=1e-5)


def test_batch_last_falls_back_to_vmap_for_other_operations(key):
    """Operations without a batch-last rule (a gather, a loop) run through vmap."""
    x = jax.random.normal(key, (4, 3, 5))

    def fn(y, k):
        z = jnp.take(y, jnp.array([2, 0]), axis=0) * k  # a gather
        z = jax.lax.fori_loop(0, 2, lambda i, a: a * 0.5 + jnp.sort(a, axis=0), z)
        return jnp.einsum("ij,kj->ik", z, y, precision="highest"), jnp.cumsum(y, axis=1)

    got = batch_last(fn)(x, 1.5)
    want = jax.vmap(fn, in_axes=(-1, None), out_axes=-1)(x, 1.5)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # tests/core/test_precision.py reads the same from the lowered program
def test_fused_reduced_precision_matches_general(key):
    """bfloat16 products on the fused path round their operands as the general path
    does: the two agree far below the bfloat16 error itself."""
    with jax.enable_x64(False):
        kP, kU = jax.random.split(key)
        P = jax.random.normal(kP, (2, 3, 3), jnp.float32)
        U = jax.random.normal(kU, (2, 3, 3), jnp.float32)
        x0 = random_tokens(key, 6, 3, batch=(9,)).astype(jnp.float32)
        runs = {}
        for p in ("float32", "bfloat16"):
            dyn = ja.SelfAttentionDynamics(P, U, precision=p)
            runs[p] = [ja.run_layers(dyn, x0, 3, 0.2, strategy=s) for s in ("general", "fused")]
        for p in ("bfloat16",):
            err = float(jnp.abs(runs[p][0] - runs["float32"][0]).max())
            gap = float(jnp.abs(runs[p][1] - runs[p][0]).max())
            assert err > 1e-4 and gap < err / 20, (p, err, gap)
        assert float(jnp.abs(runs["float32"][1] - runs["float32"][0]).max()) < 1e-5


def test_fused_runs_in_chunks_equal_one_program(key, monkeypatch):
    """On the CPU a large batch runs in chunks of `CPU_CHUNK` systems (the last one
    padded): the same results, statuses and gradients as the general path."""
    import jaxattn._ensemble as ensemble

    monkeypatch.setattr(ensemble, "CPU_CHUNK", 3)
    dyn = _model(key, 2, 3, W=False, causal=True, schedule="constant")
    x0 = random_tokens(jax.random.fold_in(key, 5), 4, 3, batch=(7,))
    if jax.default_backend() == "cpu":
        assert ensemble.chunk_size() == 3 and ensemble.chunk_size(devices=2) is None
    layers = ja.run_layers(dyn, x0, 5, 0.2, observe=ja.misalignment, strategy="fused")
    np.testing.assert_allclose(layers, ja.run_layers(dyn, x0, 5, 0.2, observe=ja.misalignment,
                                                     strategy="general"), atol=1e-12)
    kw = dict(solver=ja.RK4(), dt0=0.1, stepsize_controller=CONSTANT_STEPS, throw=False)
    ts = jnp.array([0.0, 0.35])
    fused = ja.solve_flow(dyn, x0, ts, strategy="fused", **kw)
    general = ja.solve_flow(dyn, x0, ts, strategy="general", **kw)
    np.testing.assert_allclose(fused.ys, general.ys, atol=1e-12)
    np.testing.assert_array_equal(fused.num_steps, general.num_steps)
    assert fused.success.shape == (7,) and bool(jnp.all(fused.success))


def test_fused_path_runs_the_dynamics_variants(key):
    """The fused path runs `dyn.layer` itself, so the variants (normalisation
    placement, window, mask, kernel) need nothing of their own."""
    kP, kU = jax.random.split(key)
    mask = jnp.eye(5, dtype=bool) | (jax.random.uniform(kU, (5, 5)) < 0.6)
    dyn = ja.SelfAttentionDynamics(jax.random.normal(kP, (2, 3, 3)),
                                   jax.random.normal(kU, (2, 3, 3)), norm="ngpt", window=3,
                                   mask=mask, kernel="sigmoid")
    x0 = random_tokens(key, 5, 3, batch=(4,))
    np.testing.assert_allclose(ja.run_layers(dyn, x0, 4, 0.2, strategy="fused"),
                               ja.run_layers(dyn, x0, 4, 0.2, strategy="general"), atol=1e-12)


# --- stacked models: one model per instance (jaxattn._stacked) ----------------------


def _stacked(key, models, h, d, *, W, causal, schedule):
    """`models` random models (a β and, with `W`, a metric each) built by
    `eqx.filter_vmap`, and the same models one by one."""
    def make(k):
        kb, kw, km = jax.random.split(k, 3)
        one = _model(km, h, d, W=False, causal=causal, schedule=schedule)
        Wm = random_spd(kw, d) if W else None
        return ja.SelfAttentionDynamics(one.P, one.U, W=Wm, causal=causal,
                                        beta=0.5 + jax.random.uniform(kb))

    keys = jax.random.split(key, models)
    return eqx.filter_vmap(make)(keys), [make(k) for k in keys]


# (models, systems per model, n, d, h, W, causal, schedule)
STACKED = [
    (4, (), 5, 3, 2, True, False, "constant"),
    (3, (2,), 4, 2, 3, False, True, "piecewise"),
    (2, (3,), 6, 4, 1, True, True, "callable"),
]


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize(("models", "systems", "n", "d", "h", "W", "causal", "schedule"),
                         STACKED)
def test_stacked_models_fused_equal_each_model_alone(key, models, systems, n, d, h, W,
                                                     causal, schedule):
    stacked, each = _stacked(key, models, h, d, W=W, causal=causal, schedule=schedule)
    x0 = random_tokens(jax.random.fold_in(key, 7), n, d, batch=(models,) + systems)
    observe = lambda x: (ja.misalignment(x), x[-1])  # noqa: E731
    fused = ja.run_layers(stacked, x0, 7, 0.15, strategy="fused")
    general = ja.run_layers(stacked, x0, 7, 0.15, strategy="general")
    auto = ja.run_layers(stacked, x0, 7, 0.15)
    E, last = ja.run_layers(stacked, x0, 7, 0.15, observe=observe, strategy="fused")
    assert fused.shape == (models,) + systems + (8, n, d)
    np.testing.assert_array_equal(auto, fused)  # "auto" takes the fused path
    np.testing.assert_allclose(fused, general, rtol=0, atol=1e-12)
    for m, dyn in enumerate(each):
        alone = ja.run_layers(dyn, x0[m], 7, 0.15, strategy="general")
        np.testing.assert_allclose(fused[m], alone, rtol=0, atol=1e-12)
        np.testing.assert_allclose(E[m], ja.misalignment(alone), rtol=0, atol=1e-12)
        np.testing.assert_allclose(last[m], alone[..., -1, :], rtol=0, atol=1e-12)


def test_stacked_models_fixed_step_flow_equals_each_model_alone(key):
    stacked, each = _stacked(key, 3, 2, 3, W=True, causal=False, schedule="piecewise")
    x0 = random_tokens(jax.random.fold_in(key, 8), 4, 3, batch=(3, 2))
    ts = jnp.array([0.0, 0.13, 0.4])
    kw = dict(solver=ja.RK4(), dt0=0.05, stepsize_controller=CONSTANT_STEPS, throw=False)
    fused = ja.solve_flow(stacked, x0, ts, **kw)
    assert fused.ys.shape == (3, 2, 3, 4, 3) and fused.success.shape == (3, 2)
    for m, dyn in enumerate(each):
        alone = ja.solve_flow(dyn, x0[m], ts, strategy="general", **kw)
        np.testing.assert_allclose(fused.ys[m], alone.ys, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(fused.num_steps[m], alone.num_steps)
    assert bool(jnp.all(fused.success))


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_stacked_model_gradient_equals_general(key):
    """`jax.grad` through the fused path into every model's own weights and β (the
    fused gradient against finite differences: the test above)."""
    stacked, _ = _stacked(key, 2, 2, 3, W=True, causal=True, schedule="constant")
    x0 = random_tokens(jax.random.fold_in(key, 9), 4, 3, batch=(2, 2))

    def loss(P, beta, strategy="fused"):
        dyn = eqx.tree_at(lambda m: (m.P.value, m.beta), stacked, (P, beta))
        E = ja.run_layers(dyn, x0, 3, 0.2, observe=ja.misalignment, strategy=strategy)
        return (E[..., -1] * jnp.arange(1.0, 3.0)[:, None]).sum()

    P, beta = stacked.P.value, stacked.beta
    grads = jax.grad(loss, argnums=(0, 1))(P, beta)
    want = jax.grad(loss, argnums=(0, 1))(P, beta, "general")
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
    assert float(jnp.abs(grads[1]).min()) > 0  # each β its own gradient


def test_stacked_model_shares_unbatched_leaves_and_refuses_mismatches(key):
    """β alone batched (a model leaf), the weights shared; tokens whose batch does not
    start with the models' are refused."""
    from jaxattn._stacked import first_model, model_batch

    dyn = _model(key, 2, 3, W=False, causal=False, schedule="constant")
    betas = jnp.array([0.5, 1.0, 4.0])
    stacked = eqx.tree_at(lambda m: m.beta, dyn, betas)
    assert model_batch(stacked) == (3,) and model_batch(dyn) == ()
    assert first_model(stacked).num_heads == 2 and first_model(stacked).dim == 3
    x0 = random_tokens(key, 4, 3, batch=(3, 5))
    out = ja.run_layers(stacked, x0, 3, 0.2)
    for m, b in enumerate(betas):
        one = eqx.tree_at(lambda d: d.beta, dyn, b)
        np.testing.assert_allclose(out[m], ja.run_layers(one, x0[m], 3, 0.2, strategy="general"),
                                   rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="stacked model"):
        ja.run_layers(stacked, x0[:2], 3, 0.2)
    with pytest.raises(ValueError, match="devices"):
        ja.run_layers(stacked, x0, 3, 0.2, devices=1)
    with pytest.raises(ValueError, match="batch axes"):
        ja.run_layers(eqx.tree_at(lambda m: m.U.value, stacked, jnp.ones((2, 2, 3, 3))), x0, 3,
                      0.2)


def test_sweep_chunk_runs_its_instances_fused_with_the_same_outcomes(monkeypatch):
    """A sweep chunk simulates its instances' stacked models once (the fused path under
    `"auto"`), with the verdicts and, to rounding, the numbers of the vmapped general
    path (the table it wrote before)."""
    import jaxattn._stacked as layers
    from jaxattn.experiments import experiment_config, get_experiment
    from jaxattn.sweep import _instances, sweep_params

    name = "thm52-symmetric"
    config = experiment_config(get_experiment(name), {"discrete": True, "horizon": 0.2,
                                                   "tau": 0.1, "tokens": 4}, 0) | {"beta": 1.5}
    spread = []
    monkeypatch.setattr(layers, "models_last", lambda *a: spread.append(a) or models_last(*a))
    runs = {}
    for strategy in ("general", "auto"):
        monkeypatch.setattr(_instances, "STRATEGY", strategy)
        runs[strategy] = _instances.simulate_chunk(name, config, sweep_params(name), range(3))
        assert bool(spread) == (strategy == "auto")  # only "auto" fused the instances
    for key, general in runs["general"].items():
        if general.dtype == bool:
            np.testing.assert_array_equal(runs["auto"][key], general, err_msg=key)
        else:
            np.testing.assert_allclose(runs["auto"][key], general, rtol=1e-10, atol=1e-13,
                                       err_msg=key)


def test_phase_diagram_blocks_of_per_system_models_equal_each_system_alone(key):
    """`phase-diagram` with a random key–query and value per system runs blocks of
    stacked models: the clustered pairs of each system counted alone agree."""
    from jaxattn.experiments import pair_density

    B, G, n, d, steps = 2, 6, 5, 2, 6
    x0 = jax.random.normal(key, (B, G, 1, n, d))
    draw = lambda k: pair_density.draw_weights(k, d, 1, key_query=3, value=2)  # noqa: E731
    P, U = jax.vmap(jax.vmap(draw))(jax.random.split(key, B * G).reshape(B, G, -1))
    betas, taus = jnp.array([0.5, 3.0]), jnp.array([0.1, 0.2])
    every = jnp.tile(jnp.arange(steps + 1), (B, 1))  # count after every layer
    counts, finite = pair_density.pair_counts(P, U, betas, taus, x0, every, "softmax", "post",
                                              False, 0.9)
    assert np.asarray(finite).tolist() == [True, True]
    observe = lambda x: pair_density.clustered_pairs(x, 0.9)  # noqa: E731
    want = np.zeros((B, steps + 1), np.int64)
    for b in range(B):
        for g in range(G):
            dyn = ja.SelfAttentionDynamics(P[b, g], U[b, g], beta=betas[b])
            want[b] += np.asarray(ja.run_layers(dyn, x0[b, g], steps, taus[b],
                                                observe=observe, strategy="general"))[0]
    np.testing.assert_array_equal(counts, want)


def test_auto_keeps_a_differentiated_run_on_the_general_path(key):
    """A fused run differentiated inside an outer scan was miscomputed by XLA's CPU
    scheduler (256+ systems: values off by ~0.1, different on each run); `"auto"`
    sends every differentiated run to the general path, so this loop of gradient
    steps sees the same values as the direct computation, twice over."""
    dyn = ja.SelfAttentionDynamics(0.5 * jax.random.normal(key, (2, 3, 3)),
                                   0.5 * jax.random.normal(key, (2, 3, 3)))
    x = ja.normalize(jax.random.normal(key, (256, 10, 3)))

    def loss(x):
        E = jax.vmap(lambda y: ja.misalignment(y[-1]))(ja.run_layers(dyn, x, 20, 0.1))
        return E.sum(), E

    @jax.jit
    def descend(x):
        def step(x, _):
            (_, E), g = jax.value_and_grad(loss, has_aux=True)(x)
            return ja.normalize(x + 0.01 * g), E
        return jax.lax.scan(step, x, None, length=3)[1]

    first, again = descend(x), descend(x)
    np.testing.assert_allclose(first[0], loss(x)[1], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(first, again)
    seen = []
    jax.grad(lambda x: seen.append(choose_strategy(dyn, x.shape, "auto", (dyn, x))) or 0.0)(x)
    assert seen == [ja.Vmap()] and choose_strategy(dyn, x.shape, "auto", (dyn, x)) == ja.BatchLast()


def test_phase_diagram_counts_report_nonfinite_tokens_per_beta_on_the_host_and_in_a_jit(key):
    """`pair_counts` reports, per β, whether a system's tokens left float64 (the map
    leaves that row blank; it stopped the whole run, every other β and placement
    lost), the same on the host and under a caller's `jit`."""
    from jaxattn.experiments import pair_density

    x0 = jax.random.normal(key, (2, 2, 1, 4, 2)).at[0, 1, 0, 0, 0].set(jnp.nan)
    P = U = jnp.broadcast_to(jnp.eye(2), (2, 2, 1, 2, 2))
    args = (P, U, jnp.array([1.0, 2.0]), jnp.array([0.1, 0.1]), x0, jnp.array([[0, 3]] * 2))
    for counts, finite in (
            pair_density.pair_counts(*args, "softmax", "post", False, 0.9),
            jax.jit(lambda x: pair_density.pair_counts(*args[:4], x, args[5], "softmax",
                                                       "post", False, 0.9))(x0)):
        assert np.asarray(finite).tolist() == [False, True] and counts.shape == (2, 2)
