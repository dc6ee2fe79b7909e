"""The `ja.explore` studies (`adversarial-tokens`, `adversarial-weights`,
`conjecture-bipartite`, `conjecture-multihead`): their verdicts, refusals, saved
arrays and panels."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.experiments import EXPERIMENTS, experiment_config, run_experiment

TS = np.linspace(0.0, 10.0, 101)


def _multihead(dist, complete=True):
    data = {}
    for h in (2, 3):
        data |= {f"h{h}_value": np.asarray(dist[10]), f"h{h}_dist_long": np.asarray(dist[-1]),
                 f"h{h}_speed_end": np.asarray(1e-3), f"h{h}_baseline": np.full(3, 0.01),
                 f"h{h}_gap": np.asarray(0.05), f"h{h}_margin": np.asarray(0.02),
                 f"h{h}_ts": TS, f"h{h}_dist": dist, f"h{h}_long_complete": np.asarray(complete)}
    return data


def test_an_objective_below_the_resolution_of_e_is_no_gain():
    """E(T) 2.6e-31 against 2.9e-32 read "×9.07": both rounding noise (float64's
    resolution of E for 10 tokens in R³ is 4.5e-31)."""
    exp = EXPERIMENTS["adversarial-tokens"]
    found = {"value": 2.6e-31, "baseline": np.full(2, 2.9e-32), "E_long": np.exp(-3 * TS)[None],
             "ts_long": TS, "in_domain": True, "x0": np.ones((10, 3)) / np.sqrt(3),
             "min_inner": 0.5}
    kind, line = exp.judge_setting(exp.config(), found, "sphere")
    assert "no gain measured" in line and "×" not in line
    kind, line = exp.judge_setting(exp.config(),
                                   found | {"value": 0.3, "baseline": np.full(2, 0.1)}, "sphere")
    assert "(×3)" in line


def test_conjecture_multihead_exit_follows_its_line():
    """`judge_setting` returned kind None: every run agreed (exit 0), a candidate
    counterexample too, and a run still approaching v₁ read "→ converges"."""
    exp = EXPERIMENTS["conjecture-multihead"]
    config = experiment_config(exp, {}, seed=0)
    slow = exp.verdict(config, _multihead(0.05 * np.exp(-0.3 * TS)))
    assert not slow.ok and "--long" in slow.undecided, slow  # exit 4
    assert "not converged: undecided" in slow.line and "converges:" not in slow.line
    stuck = exp.verdict(config, _multihead(0.1 + 0.4 * np.exp(-2.0 * TS)))
    assert not stuck.ok and not stuck.undecided  # exit 3
    assert stuck.numbers["counterexample_found"] and "CANDIDATE" in stuck.line
    done = exp.verdict(config, _multihead(np.exp(-3.0 * TS)))
    assert done.ok and "converges: no counterexample" in done.line


def test_a_long_check_cut_at_the_step_budget_leaves_the_run_undecided():
    """`--long 1e6` ran the search, then failed in the long check naming --horizon and
    lost the search; now the check is cut where the solver stopped and the run says
    to lower --long."""
    exp = EXPERIMENTS["conjecture-multihead"]
    config = experiment_config(exp, {}, seed=0)
    cut = exp.verdict(config, _multihead(np.exp(-3.0 * TS), complete=False))
    assert not cut.ok and "a smaller --long" in cut.undecided


def test_the_multihead_objective_resolves_distances_below_rounding():
    """`max(1 − ⟨x, v₁⟩)` was 0 below ~1e-16: a start there had no gradient."""
    from jaxattn.experiments.conjecture_multihead import _distance_to_v1, _top_of_sum

    dyn = ja.SelfAttentionDynamics(jnp.eye(3)[None], jnp.diag(jnp.array([1.0, 0.5, 0.2]))[None])
    v1 = _top_of_sum(dyn)
    kick = jnp.array([0.0, 1.0, 1.0]) * 1e-10

    def f(eps):
        x = ja.normalize(jnp.stack([v1, v1 + eps * kick]))
        return _distance_to_v1(None, jnp.stack([x, x]), dyn)

    assert float(f(1.0)) == pytest.approx(1e-20, rel=1e-6)  # |kick|²/2
    assert float(jax.grad(f)(1.0)) == pytest.approx(2e-20, rel=1e-6)


@pytest.mark.parametrize("name", ["adversarial-tokens", "conjecture-multihead"])
def test_margin_is_in_zero_one_and_refused_before_work(name):
    """`--margin 0` was refused though the API takes it; `--margin 1` was refused only
    after the search started, naming `margin` (the API's name)."""
    exp = EXPERIMENTS[name]
    assert experiment_config(exp, {"margin": 0.0}, seed=0).margin == 0.0
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match=r"^--margin must be in \[0, 1\), got"):
            experiment_config(exp, {"margin": bad}, seed=0)


def test_conjecture_multihead_names_the_flag_of_an_unkeepable_gap():
    """`--gap 10` said "start from such U" (the API's words), which a user of the
    command cannot do."""
    with pytest.raises(ValueError, match=r"^--gap 10: .* lower --gap to at most"):
        experiment_config(EXPERIMENTS["conjecture-multihead"], {"gap": 10.0}, seed=0)


def test_conjecture_bipartite_reports_the_start_of_the_restart_it_reports():
    """The line's "ρ at start (best of restarts)" was the smallest over all restarts,
    not the start of the restart it then reported, nor panel 1's."""
    study = EXPERIMENTS["conjecture-bipartite"]
    found = {"valid": np.array([True, True, False]), "rho": np.array([0.5, 0.2, 0.01]),
             "rho0": np.array([1.5, 4.0, 0.9]), "dist_small": np.zeros(3),
             "dist_large": np.zeros(3), "absorbed": True, "U": np.eye(3)[None] * [3, 2, 1]}
    line = study.judge_setting(study.defaults(), found, 2)[1]
    assert "from a smoothed bound 4 at its projected start → 0.2 among 2 valid" in line, line


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_adversarial_weights_saves_what_rebuilds_its_result(tmp_path):
    """data.npz held neither the optimised U, P nor x0: the result could not be
    re-simulated from the folder. The right panel draws the judged distance to v₁."""
    folder, summary = run_experiment(
        "adversarial-weights", {"steps": 2, "restarts": 2, "tokens": 4, "saves": 10,
                                "horizon": 1.0, "long": 2.0},
        out=tmp_path / "run", progress=False, log=lambda *_: None)
    data = np.load(folder / "data.npz")
    dyn = ja.SelfAttentionDynamics(data["P"], data["U"], causal=True)
    ys = ja.solve_flow(dyn, data["x0"], data["ts_long"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ja.misalignment(ys), data["E_long"], atol=1e-5)
    assert data["dist_long0"].shape == data["dist_long"].shape and bool(data["long_complete"])
    assert json.loads((folder / "summary.json").read_text())["verdict"] == summary["verdict"]


def test_adversarial_tokens_saves_its_model():
    from jaxattn.experiments import paper001
    from jaxattn.experiments.search import model_arrays

    saved = model_arrays(paper001.sphere_dynamics(jax.random.PRNGKey(0)))
    assert set(saved) == {"model_P_params_0", "model_P_params_1", "model_P_params_2",
                          "model_U_value", "model_beta"}


def test_the_trace_panel_shows_each_step_not_only_the_best():
    """"best so far" hid a search whose value collapsed after its start."""
    from jaxattn._artifacts import figures
    from jaxattn.experiments.search import draw_trace

    plt = figures.pyplot()
    _, ax = plt.subplots()
    trace = np.array([[1e-3, 2e-3], [1e-1, 3e-3], [1e-6, 4e-3]])  # restart 0 collapses
    draw_trace(ax, trace, np.full(2, 1e-4), "value")
    drawn = [np.asarray(line.get_ydata()) for line in ax.get_lines()]
    assert any(np.array_equal(y, trace[:, 0]) for y in drawn)
    assert any(np.array_equal(y, [2e-3, 1e-1, 1e-1]) for y in drawn)  # best so far
    plt.close("all")
