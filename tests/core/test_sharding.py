"""`devices=`: the work is split across devices (the compiled loops carry only the
per-device share of the batch), results and gradients equal the unsharded run,
and bad input raises at once instead of stalling the devices.

Each test runs a script in a subprocess with four forced CPU devices."""

import textwrap

import pytest
from _helpers import ULPS_APART_SOURCE, run_on_forced_devices

_PRELUDE = ULPS_APART_SOURCE + textwrap.dedent(
    """
    import json, re, time
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import jaxattn as ja
    from jaxattn import _layers
    from jaxattn._strategy import xla as _xla
    from jaxattn.explore import _search
    from jaxattn.experiments import paper as _paper
    from jaxattn.models import _loop

    def loop_shapes(txt):
        # the array shapes carried by every compiled while loop (scan, diffrax)
        return [re.findall(r"[a-z]+\\d+\\[[\\d,]*\\]", line.split(" while(")[0])
                for line in txt.splitlines() if " while(" in line]

    def spy(module, name, record):
        # compile the program the entry point really calls; keep its loops' shapes
        orig = getattr(module, name)
        def wrapped(*args, **kwargs):
            if name not in record:  # the first call: the sharded one
                txt = orig.lower(*args, **kwargs).compile().compiled.as_text()
                record[name] = loop_shapes(txt)
            return orig(*args, **kwargs)
        setattr(module, name, wrapped)

    key = jax.random.PRNGKey(3)
    P = jax.random.normal(key, (2, 3, 3))
    dyn = ja.SelfAttentionDynamics(P, jnp.broadcast_to(jnp.eye(3), (2, 3, 3)), causal=True)
    xb = jax.vmap(lambda k: ja.sample_ellipsoid(k, 5, 3))(jax.random.split(key, 12))
    ts = jnp.linspace(0.0, 2.0, 5)
    res = {"devices": len(jax.devices())}
    """
)

_SPLIT = _PRELUDE + textwrap.dedent(
    """
    shapes = {}
    spy(_xla, "layers_program", shapes)
    spy(_xla, "solve_batched", shapes)
    spy(_loop, "loop_program", shapes)
    spy(_search, "_run_chunk", shapes)

    # simulators: 12 sequences (5 tokens, d = 3) on 4 devices, 3 per device
    res["layers_ulps"] = ulps_apart(ja.run_layers(dyn, xb, 10, 0.2, devices=4),
                                    _layers.run_layers(dyn, xb, 10, 0.2))
    flow = ja.solve_flow(dyn, xb, ts, devices=4)
    res["flow_err"] = float(np.abs(flow - ja.solve_flow(dyn, xb, ts)).max())
    out = ja.solve_flow(dyn, xb, ts, devices=4, throw=False)
    res["flow_result"] = [list(out.success.shape), bool(np.all(out.success))]

    # gradients through sharded runs (traced inputs: checks inside the program)
    def grads(run, devices):
        g = jax.grad(lambda x, d: run(d, x, devices).sum(), argnums=(0, 1))(xb, dyn)
        return [np.asarray(a) for a in jax.tree.leaves(g)]
    layers = lambda d, x, dev: ja.run_layers(d, x, 10, 0.2, observe=ja.misalignment,
                                             devices=dev)
    solve = lambda d, x, dev: ja.misalignment(ja.solve_flow(d, x, ts, devices=dev))
    res["grad_layers_err"] = max(float(np.abs(a - b).max())
                                 for a, b in zip(grads(layers, 4), grads(layers, None)))
    res["grad_flow_err"] = max(float(np.abs(a - b).max())
                               for a, b in zip(grads(solve, 4), grads(solve, None)))

    # models.loop: 6 prompts of 7 tokens (padded to 8), 2 per device
    cfg = {"model_type": "gpt2", "n_layer": 3, "n_embd": 40, "n_head": 5,
           "vocab_size": 53, "n_positions": 24}
    model = ja.models.init(cfg, key)
    ids = np.asarray(jax.random.randint(key, (6, 7), 0, 53))
    E1, s1 = ja.models.loop(model, ids, passes=2, save_states=[0, 4], devices=4)
    E0, s0 = ja.models.loop(model, ids, passes=2, save_states=[0, 4])
    res["loop_shape"] = list(E1.shape)
    res["loop_ulps"] = max(ulps_apart(E1, E0), ulps_apart(s1, s0))
    hs = ja.models.hidden_states(model, ids, devices=4)
    res["hidden_ulps"] = ulps_apart(hs, ja.models.hidden_states(model, ids))

    # exploration: 6 restarts (padded to 8), 2 per device
    sphere = _paper.sphere_dynamics(key)
    for model_kind in ("layers", "flow"):
        kw = dict(init=jax.random.fold_in(key, 1), n=4, restarts=6, steps=4,
                  horizon=1.0, model=model_kind, tau=0.1, saves=5)
        a = ja.explore.slow_consensus(sphere, **kw, devices=4)
        b = ja.explore.slow_consensus(sphere, **kw)
        res[f"explore_{model_kind}"] = [
            list(a.trace.shape), list(a.x0s.shape),
            float(np.abs(a.trace - b.trace).max()), float(np.abs(a.x0s - b.x0s).max()),
        ]
    res["shapes"] = shapes
    print(json.dumps(res))
    """
)

_ERRORS = _PRELUDE + textwrap.dedent(
    """
    def timed(fn):
        t = time.monotonic()
        try:
            fn()
            return ["none", "", 0.0]
        except Exception as e:
            return [type(e).__name__, str(e).splitlines()[0], time.monotonic() - t]

    # compile first, so the timings below measure the failure path only
    ja.run_layers(dyn, xb, 10, 0.2, devices=4).block_until_ready()
    ja.solve_flow(dyn, xb, ts, devices=4).block_until_ready()
    nan = xb.at[5, 2, 1].set(jnp.nan)
    zero = xb.at[7, 0].set(0.0)
    res["layers_nan"] = timed(lambda: ja.run_layers(dyn, nan, 10, 0.2, devices=4))
    res["flow_nan"] = timed(lambda: ja.solve_flow(dyn, nan, ts, devices=4))
    res["layers_zero"] = timed(lambda: ja.run_layers(dyn, zero, 10, 0.2, devices=4))
    res["flow_steps"] = timed(lambda: ja.solve_flow(dyn, xb, ts, max_steps=3, devices=4))
    huge = ja.SelfAttentionDynamics(P, jnp.full((2, 3, 3), 1e308), causal=True)
    res["layers_overflow"] = timed(lambda: ja.run_layers(huge, xb, 10, 0.2, devices=4))
    print(json.dumps(res))
    """
)


@pytest.fixture(scope="module")
def sharded():
    return run_on_forced_devices(_SPLIT, timeout=600)


def _local(loops, local: str | tuple, full: str | tuple) -> bool:
    """Some compiled loop carries the per-device batch `local` (one of its layouts), none
    the full batch `full` (in any of its layouts)."""
    local = (local,) if isinstance(local, str) else local
    full = (full,) if isinstance(full, str) else full
    flat = [s for shapes in loops for s in shapes]
    return bool(loops) and any(a in flat for a in local) and not any(b in flat for b in full)


@pytest.mark.slow  # a 4-device subprocess; sharded equality stays in test_core_options
def test_work_is_split_across_devices(sharded):
    shapes = sharded["shapes"]
    print({k: v[:2] for k, v in shapes.items()})
    # tokens (batch, n, d), or (n, batch, d) on the fused path: 12 sequences → 3 per device
    assert _local(shapes["layers_program"], ("f64[3,5,3]", "f64[5,3,3]"),
                  ("f64[12,5,3]", "f64[5,12,3]"))
    assert _local(shapes["solve_batched"], "f64[3,5,3]", "f64[12,5,3]")
    # hidden states (prompts, n, hidden): 8 padded prompts → 2 per device
    assert _local(shapes["loop_program"], "f32[2,7,40]", "f32[8,7,40]")
    # restarts (R, n, d): 8 padded restarts → 2 per device
    assert _local(shapes["_run_chunk"], "f64[2,4,3]", "f64[8,4,3]")


@pytest.mark.slow
def test_sharded_results_equal_unsharded(sharded):
    # two programs (4 devices against 1) agree to rounding, not to the bit
    assert sharded["layers_ulps"] <= 4, sharded
    assert sharded["flow_err"] < 1e-12
    assert sharded["flow_result"] == [[12], True]
    assert sharded["loop_shape"] == [6, 7] and sharded["loop_ulps"] <= 4, sharded
    assert sharded["hidden_ulps"] <= 4, sharded


@pytest.mark.slow
def test_sharded_gradients_equal_unsharded(sharded):
    assert sharded["grad_layers_err"] < 1e-12
    assert sharded["grad_flow_err"] < 1e-10


@pytest.mark.slow
def test_sharded_restarts_equal_unsharded(sharded):
    for kind in ("layers", "flow"):
        trace_shape, x0s_shape, trace_err, x0s_err = sharded[f"explore_{kind}"]
        assert trace_shape == [5, 6] and x0s_shape == [6, 4, 3]
        assert trace_err < 1e-12 and x0s_err < 1e-12


@pytest.mark.slow
def test_bad_input_in_a_sharded_batch_raises_at_once():
    res = run_on_forced_devices(_ERRORS, timeout=180)
    for case in ("layers_nan", "flow_nan"):
        kind, message, seconds = res[case]
        assert kind == "SimulationError" and "contain NaN or inf" in message, res[case]
        assert seconds < 5, res[case]
    kind, message, _ = res["layers_zero"]
    assert kind == "SimulationError" and "initial token is zero" in message
    kind, message, seconds = res["flow_steps"]
    assert kind == "SimulationError" and "max_steps" in message and seconds < 30
    kind, message, seconds = res["layers_overflow"]
    assert kind == "SimulationError" and "NaN or inf during the run" in message
    assert seconds < 30


_BLOCKS = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jaxattn._batch import as_mesh
    from jaxattn.experiments import pair_density, variants

    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(11))
    drawn = variants.draw_batch(keys, size=(5, 3), heads=2, masks=("full", "causal"),
                                window=2, keep=0.3)
    betas = jnp.asarray([0.5, 4.0])

    def study(mesh):
        out = variants.run_program(*drawn, betas, num_layers=6, tau=0.25, norm="post",
                                   kernel="softmax", mesh=mesh)
        return [np.asarray(a) for a in out]

    cfg = dict(betas=3, beta_min=0.5, beta_max=4.0, systems=6, tokens=5, dim=3,
               key_query=1, value=1, exp_kernel=False, horizon=2.0, step=0.1,
               raw_step=False, times=4, threshold=0.99)
    cfg = type("Cfg", (dict,), {"__getattr__": dict.__getitem__})(cfg)
    x0, P, U = pair_density.draw_systems(jax.random.PRNGKey(3), cfg)
    at = jnp.asarray(np.tile([0, 3, 7, 12], (3, 1)), jnp.int32)
    taus = jnp.full((3,), 0.1)

    def pairs(mesh):
        counts, finite = pair_density.pair_counts(
            P, U, jnp.asarray([0.5, 1.0, 4.0]), taus, x0, at, "softmax", "post", False,
            0.99, mesh=mesh)
        assert np.asarray(finite).all()
        return np.asarray(counts)

    one, many = study(None), [study(as_mesh(k)) for k in (2, 3, 4)]
    print(json.dumps({
        "devices": jax.device_count(),
        "study_bitwise": [all(a.tobytes() == b.tobytes() for a, b in zip(one, m))
                          for m in many],
        "study_shape": list(one[0].shape),
        "pairs_equal": [bool(np.array_equal(pairs(None), pairs(as_mesh(k))))
                        for k in (2, 3, 4)],
        "pairs_total": int(pairs(None).sum()),
    }))
    """
)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_block_programs_give_the_same_bits_on_any_number_of_devices():
    """The batched studies' programs (`variants.run_program`, `pair_counts`) split
    their blocks over 2, 3 or 4 devices (`_batch.map_blocks`) with the bits of one
    device: what `--distributed` runs equal one process's byte for byte."""
    res = run_on_forced_devices(_BLOCKS, timeout=240)
    assert res["study_bitwise"] == [True, True, True], res
    assert res["study_shape"] == [2, 2, 11, 7]
    assert res["pairs_equal"] == [True, True, True] and res["pairs_total"] > 0, res
