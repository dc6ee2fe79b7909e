"""The experiment machinery: exact span coordinates, integration in pieces, configs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments import (
    EXPERIMENTS,
    command_line,
    experiment_config,
    thm32_gradient,
    thm41_sphere,
    thm51_causal,
    thm52_symmetric,
)
from jaxattn.experiments import paper as _paper
from jaxattn.experiments.pieces import flow_path, layer_path


@pytest.mark.slow
def test_span_coordinates_reproduce_the_full_model(key):
    """thm51-causal integrates Y with x = Y X₀; compare with the model on S^{d−1}."""
    n, d, h = 4, 9, 2
    weights = _paper.causal_weights(key, d, h)
    x0 = ja.normalize(jax.random.uniform(jax.random.fold_in(key, 1), (n, d), minval=-1))
    ts = jnp.linspace(0.0, 3.0, 7)
    full = ja.solve_flow(_paper.causal_dynamics(weights), x0, ts, rtol=1e-10, atol=1e-12)
    reduced, G = _paper.span_dynamics(weights, x0)
    ys = ja.solve_flow(reduced, jnp.eye(n), ts, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ys @ ja.normalize(x0), full, atol=1e-8)
    np.testing.assert_allclose(_paper.span_misalignment(ys, G), ja.misalignment(full), atol=1e-8)
    layers_full = ja.run_layers(_paper.causal_dynamics(weights), x0, 12, 0.25)
    layers = ja.run_layers(reduced, jnp.eye(n), 12, 0.25)
    np.testing.assert_allclose(layers @ ja.normalize(x0), layers_full, atol=1e-12)


def test_pieces_match_one_call(key):
    dyn = _paper.sphere_dynamics(key)
    x0 = _paper.hemisphere_tokens(jax.random.fold_in(key, 1), 5, 3)
    ts, ys = flow_path(dyn, x0, 2.0, 40, progress=False, desc="", rtol=1e-10, atol=1e-12)
    ref = ja.solve_flow(dyn, x0, jnp.asarray(ts), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ys, ref, atol=1e-8)  # the solver restarts at piece boundaries
    tl, yl = layer_path(dyn, x0, 2.0, 0.05, progress=False, desc="")
    np.testing.assert_allclose(yl, ja.run_layers(dyn, x0, 40, 0.05), atol=1e-13)
    np.testing.assert_allclose(tl, 0.05 * np.arange(41))


def test_config_resolution_and_the_command_that_repeats_it():
    exp = EXPERIMENTS["thm51-causal"]
    config = experiment_config(exp, {"tokens": 7, "discrete": True, "horizon": 3}, seed=5)
    assert config["tokens"] == 7 and config["horizon"] == 3.0 and config["seed"] == 5
    cmd = command_line(config, exp)
    assert cmd == "jaxattn run thm51-causal --seed 5 --tokens 7 --horizon 3.0 --discrete"
    for bad, match in [({"tokens": "x"}, "integer"), ({"tokens": 2.5}, "integer"),
                       ({"horizon": -1.0}, "> 0"), ({"horizon": float("nan")}, "finite"),
                       ({"heads": 0}, "≥ 1"), ({"colour": 1}, "no parameter --colour"),
                       ({"discrete": "yes"}, "true or false")]:
        with pytest.raises(ValueError, match=match):
            experiment_config(exp, bad, seed=0)
    with pytest.raises(ValueError, match="seed"):
        experiment_config(exp, {}, seed=-1)


def test_every_experiment_declares_a_theorem_and_defaults():
    mine = ["thm41-sphere", "thm51-causal", "thm52-symmetric", "thm32-gradient"]
    assert set(mine) <= set(EXPERIMENTS)  # other commands may register more
    for name in mine:
        exp = EXPERIMENTS[name]
        names = [p.name for p in exp.all_params()]
        assert len(names) == len(set(names))
        assert {"discrete", "tau", "horizon", "saves", "tokens"} <= set(names)
        assert exp.theorem in ja.theory.THEOREMS


@pytest.mark.parametrize("module", [thm32_gradient, thm41_sphere, thm51_causal, thm52_symmetric])
def test_setup_draws_one_instance_per_key_and_vmaps(module):
    """`setup(key, config)` is what `jaxattn run` draws from `PRNGKey(seed)` and what a
    sweep vmaps over its instances' keys: the batched draw is each key's draw."""
    exp = next(e for e in EXPERIMENTS.values() if type(e).__module__ == module.__name__)
    small = {"tokens": 4, "dim": 5, "samples": 1} if module is thm51_causal else {"tokens": 4}
    config = experiment_config(exp, small, seed=2) | {"beta": 1.0}
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    x_batch = jax.vmap(lambda k: exp.setup(k, config)[1])(keys)
    for k, x in zip(keys, x_batch):
        np.testing.assert_array_equal(x, exp.setup(k, config)[1])
    assert x_batch.shape[-2] == 4 and not np.array_equal(x_batch[0], x_batch[1])


@pytest.mark.parametrize("name", ["thm41-sphere", "thm52-symmetric", "thm32-gradient"])
def test_theorem_setup_and_measures_are_single_programs(name):
    """The frame draws an instance as one program (seed and floats traced: the same
    instance as `setup`, to rounding) and measures a run as one program holding no host
    callback (which the persistent cache refuses), the floats traced there too but a
    member's `measured_static`: a new β or seed is the same program, with the values
    of the measures computed at that β."""
    import equinox as eqx

    from jaxattn.experiments import get_experiment
    from jaxattn.experiments.theorem import _measured, _parts, _setup
    from jaxattn.theory import predict

    with jax.enable_x64(True):
        experiment = get_experiment(name)
        config = experiment.config(seed=3)
        dyn, x0 = _setup(experiment, np.asarray(config.seed), *_parts(experiment, config))
        ref_dyn, ref_x0 = experiment.setup(jax.random.PRNGKey(3), config)
        arrays = [jax.tree.leaves(eqx.filter(t, eqx.is_array))
                  for t in ((dyn, x0), (ref_dyn, ref_x0))]
        assert len(arrays[0]) == len(arrays[1])
        for a, b in zip(*arrays):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
        ts = np.linspace(0.0, 1.0, 5)
        ys = jnp.stack([x0] * 5)
        test = predict(dyn, x0).test
        floats, static = _parts(experiment, config, experiment.measured_static)
        for flow in (True, False):
            lowered = _measured.lower(experiment, static, floats, dyn, test, x0, ts, ys,
                                      flow=flow)
            assert "callback" not in lowered.as_text()
        beta = {} if "beta" in experiment.measured_static else {"beta": 2 * config.beta}
        for other in (config, experiment.config(seed=4, **beta)):
            floats, rest = _parts(experiment, other, experiment.measured_static)
            assert rest == static and floats.keys() == _parts(
                experiment, config, experiment.measured_static)[0].keys()
            out = _measured(experiment, rest, floats, dyn, test, x0, ts, ys, flow=True)
            direct = experiment.measures(other, dyn, test, x0, ts, ys)
            assert set(direct) <= set(out)
            for k, v in direct.items():
                np.testing.assert_allclose(out[k], v, rtol=1e-13, err_msg=k)
        assert eqx.is_array(out["E"]) and out["E"].shape == (5,)


def test_conjecture_bipartite_kick_panel_shows_the_decay_not_the_whole_check():
    """The kicked distances of a long check are drawn up to twice the last layer above
    the floor (`figures.resolution`, 3.6e-15 in float64), the label naming the layers
    below it; a distance above the floor to the end keeps the whole check."""
    from jaxattn._artifacts import figures
    from jaxattn.experiments.conjecture_bipartite import _kick_axis

    plt = figures.pyplot()
    fast = np.concatenate([10.0 ** -np.arange(17.0), np.zeros(384)])  # 1e-14 at layer 14
    _, ax = plt.subplots()
    assert _kick_axis(ax, [fast / 10, fast]) == "layer (all below the floor from layer 15 to 400)"
    assert ax.get_xlim() == (-0.5, 28)
    _, ax = plt.subplots()
    slow = np.geomspace(1.0, 1e-3, 401)
    before = ax.get_xlim()
    assert _kick_axis(ax, [fast, slow]) == "layer"
    assert ax.get_xlim() == before
    plt.close("all")


def test_conjecture_bipartite_without_a_valid_restart_kicks_nothing(tmp_path):
    """With no valid restart (no true fixed point) the verdict said "→ nan among 0 valid
    restarts" and the figure kicked restart 0 as the "best stable weights"; now the line
    says so, no kick is drawn, and the traces' best is over the valid restarts only."""
    from jaxattn.experiments import EXPERIMENTS

    study = EXPERIMENTS["conjecture-bipartite"]
    config = study.defaults()
    trace = np.log(np.array([[2.0, 3.0], [0.5, 0.01]]))  # the invalid restart dips lowest
    found = {"trace": trace, "violation": 0.0, "rho": np.array([0.5, 0.01]),
             "rho0": np.array([2.0, 3.0]), "valid": np.array([True, False]),
             "residual": np.zeros(2), "dist_small": np.geomspace(1e-3, 1e-12, 5),
             "dist_large": np.geomspace(1e-1, 1e-12, 5), "absorbed": True,
             "U": np.diag([2.0, 1.0, 0.5])[None]}
    none = found | {"valid": np.array([False, False]), "dist_small": np.full(5, np.nan),
                    "dist_large": np.full(5, np.nan), "absorbed": False}
    assert "→ 0.5 among 1 valid restarts" in study.judge_setting(config, found, 1)[1]
    # the filter asks v = e₁ to be an eigenvector of ΣU; the line says whether it is the top
    assert "v is the principal eigenvector" in study.judge_setting(config, found, 1)[1]
    middle = found | {"U": np.diag([1.0, 2.0, 0.5])[None]}
    assert "v is NOT the principal" in study.judge_setting(config, middle, 1)[1]
    # one rule for both kicks (the small one needed 1e-6, the larger one only not to grow:
    # a small kick shrinking 20-fold read "NOT absorbed" beside a larger one "absorbed")
    assert "small kick absorbed (1.0e-03 → 1.0e-12), larger one absorbed" in \
        study.judge_setting(config, found, 1)[1]
    slow = found | {"dist_small": np.geomspace(1e-3, 5e-5, 5),
                    "dist_large": np.geomspace(1e-1, 3.5e-3, 5)}
    assert ("small kick shrinking, not yet absorbed (1.0e-03 → 5.0e-05), larger one shrinking"
            in study.judge_setting(config, slow, 1)[1])
    grows = found | {"dist_large": np.geomspace(1e-1, 1.5, 5)}
    assert "larger one escapes (0.1 → 1.5)" in study.judge_setting(config, grows, 1)[1]
    line = study.judge_setting(config, none, 3)[1]
    assert "no valid restart of 2" in line and "nothing to kick" in line, line
    data = {f"h{h}_{k}": v for h, f in ((1, found), (2, found), (3, none)) for k, v in f.items()}
    paths = study.draw(config, data, tmp_path)
    assert paths and all(p.exists() for p in paths)


@pytest.mark.parametrize("horizon", [9.2, 8.0])
def test_thm32_judges_the_speed_it_compares(tmp_path, horizon):
    """Theorem 3.2's test compares the speed with the field that makes it
    (`max |ẋ| ≤ tol · max |v|`); the run's trend is judged on that same relative speed,
    so its line and its kind agree (at T = 9.2 the line said "not yet converged" of
    the absolute speed 1.1e-4 beside the kind `agrees`)."""
    import json

    from jaxattn.experiments import run_experiment

    folder, _ = run_experiment("thm32-gradient", {"horizon": horizon, "saves": int(10 * horizon)},
                               out=tmp_path / "run", progress=False, log=lambda *_: None)
    summary = json.loads((folder / "summary.json").read_text())
    reached = summary["numbers"]["final_relative_speed"] <= ja.metrics.CONSENSUS_TOL
    assert (summary["verdict_kind"] == "agrees") is reached, summary
    assert ("relative speed max |ẋ| / max |v| = " in summary["verdict"]) and (
        ("not yet converged" in summary["verdict"]) is not reached), summary["verdict"]
