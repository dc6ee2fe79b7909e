"""The `antipodal` experiment's set-up and estimators (its theory, the two-token
reduction, is `ja.theory`'s: tests/theory/test_theory_noise.py)."""

import functools
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_same_values

import jaxattn as ja
from jaxattn.experiments import antipodal as A
from jaxattn.experiments.pieces import keyed_layers


def test_pair_start_has_the_asked_gap_on_the_sphere(key):
    x = A.pair_start(key, 7, 5, 1e-4)
    plus, minus = A.gaps(x)
    np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(plus, 1e-4, rtol=1e-8)
    np.testing.assert_allclose(minus, 2 - 1e-4, rtol=1e-12)


def test_formation_reads_clusters_and_antipodal_groups():
    e = np.eye(3)
    small = 1e-3 * e[2]
    ends = np.stack([
        [e[0], e[0] + small, e[0], e[0]],  # one cluster
        [e[0], -e[0], e[0], e[0] - small],  # 1 : 3
        [e[0], -e[0], -e[0] + small, e[0]],  # 2 : 2
        [e[0], e[1], -e[0], e[0]],  # a third direction
        [e[0], -e[0], -e[0], -e[0]],  # 1 : 3, token 0 alone
    ])
    ends /= np.linalg.norm(ends, axis=-1, keepdims=True)
    np.testing.assert_array_equal(A.formation(ends), [0, 1, 2, -1, 1])


def test_noisy_layers_give_each_run_its_own_noise(key):
    """Two identical starts end apart (their own keys), and the same key repeats."""
    x0 = jnp.broadcast_to(A.pair_start(jax.random.fold_in(key, 1), 1, 3, 0.5), (2, 2, 3))
    first = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    again = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=10)
    np.testing.assert_array_equal(first, again)
    # in pieces as in one call: each piece's key is fold_in(key, piece)
    one = A.noisy_layers(2.0, 1.0, x0, 30, 0.05, key, piece=30)
    eye = jnp.eye(3)[None]
    direct = ja.run_layers(ja.SelfAttentionDynamics(eye, eye, beta=2.0), x0, 30, 0.05,
                           noise=ja.ValueNoise(1.0), key=jax.random.fold_in(key, 0))[:, -1]
    assert_same_values(one, direct)  # blocks of runs against one batch: two programs
    assert float(jnp.max(jnp.abs(first[0] - first[1]))) > 1e-3
    assert first.shape == x0.shape


def test_a_run_is_the_same_bits_whatever_shares_its_block(key):
    """A run's numbers do not depend on how many runs there are (its block is padded to
    `BLOCK` runs), nor on the batch's size past one block."""
    x0 = A.pair_start(key, A.BLOCK + 3, 4, 0.5)
    keys = jax.random.split(jax.random.fold_in(key, 2), A.BLOCK + 3)
    eye = jnp.eye(4)[None]
    dyn = eqx.filter_vmap(lambda b: ja.SelfAttentionDynamics(eye, eye, beta=b))(
        jnp.full(A.BLOCK + 3, 1.5))
    run = functools.partial(keyed_layers, num_layers=7, tau=0.05,
                            noise=ja.ValueNoise(1.0), block=A.BLOCK)
    whole = run(dyn, x0, keys)
    for part in (slice(0, 1), slice(A.BLOCK, A.BLOCK + 3), slice(2, 5)):
        np.testing.assert_array_equal(run(jax.tree.map(
            lambda a: a[part] if eqx.is_array(a) else a, dyn), x0[part], keys[part]),
            whole[part])
    assert whole.shape == (A.BLOCK + 3, 8, 2, 4)


def test_defaults_run_past_the_thresholds():
    """The default grid starts below and ends above every default dimension's β_c."""
    config = A.Antipodal().defaults()
    grid = A.Antipodal.grid(config)
    betas = grid["betas"]
    for d in grid["dims"]:
        beta_c = ja.theory.antipodal_threshold(int(d), config["sigma"])
        assert betas[0] < beta_c < betas[-1]


def test_crossing_fit_and_extrapolation_are_exact_on_lines():
    betas = np.linspace(0.8, 1.2, 5)
    zero, se = ja.metrics.fit_crossing(betas, 2.0 * (1.05 - betas), se=np.full(5, 0.01))
    assert zero == pytest.approx(1.05, rel=1e-12) and 0 < se < 0.01
    value, se = ja.metrics.fit_intercept([0.01, 0.02], [1.1, 1.2], se=[0.003, 0.004])
    assert value == pytest.approx(1.0, rel=1e-12)
    assert se == pytest.approx(math.hypot(2 * 0.003, 0.004), rel=1e-9)


def _exact_run(config, bias=5.0):
    """A run's data where every measured exponent is `antipodal_rate` moved by a
    bias linear in τ (`bias · τ`, as a layer step's): what the verdict judges."""
    grid = A.Antipodal.grid(config)
    dims, taus, betas = [int(d) for d in grid["dims"]], grid["taus"], grid["betas"]
    window = np.stack([A.window_of(d, config["sigma"]) for d in dims])
    rate = np.stack([[ja.theory.antipodal_rate(w, d, config["sigma"]) + bias * t
                      for t in taus] for d, w in zip(dims, window)])
    shape = (len(dims), len(betas))
    p = np.array([[ja.theory.antipodal_probability(b, d, config["sigma"]) for b in betas]
                  for d in dims])
    return {"dims": np.asarray(dims), "betas": betas, "taus": taus,
            "p_antipodal": p, "p_antipodal_early": p, "p_consensus": 1 - p,
            "rate": np.stack([ja.theory.antipodal_rate(betas, d, config["sigma"])
                              for d in dims]),
            "rate_se": np.full(shape, 0.01), "window_betas": window, "window_rate": rate,
            "window_se": np.full(rate.shape, 0.01),
            "formation": np.zeros((len(A.FORMATION_TOKENS), 10), dtype=np.int64)}


def test_verdict_extrapolates_tau_and_fails_a_threshold_ten_percent_off(monkeypatch):
    """With exponents biased in proportion to τ, the extrapolated threshold is the
    predicted one up to the straight-line fit's bias on the curved exponent (≤ 1.1 %
    for d ≤ 8 across the window), and the verdict passes (the measurement at τ
    alone is off by more); with the prediction moved by ±10 % it fails."""
    study = A.Antipodal()
    config = study.defaults()
    data = _exact_run(config)
    verdict = study.verdict(config, data)
    assert verdict.ok, verdict.line
    for t in verdict.numbers["thresholds"].values():
        assert t["relative_error"] < 0.012
        assert abs(t["at_tau"][-1] / t["predicted"] - 1) > t["relative_error"] + 0.01
    assert A.THRESHOLD_TOL <= 0.1 / 2
    for factor in (1.1, 0.9):
        monkeypatch.setattr(A, "antipodal_threshold",
                            lambda d, s, f=factor: f * ja.theory.antipodal_threshold(d, s))
        wrong = study.verdict(config, data)
        assert not wrong.ok and wrong.undecided == ""  # resolved: a contradiction
        assert all(t["relative_error"] > 0.08 for t in wrong.numbers["thresholds"].values())
        # the same 10 % within two standard errors (noisy exponents) cannot be told
        # from the prediction: undecided (exit 4), not against it (exit 3)
        noisy = study.verdict(config, data | {"window_se": 100 * data["window_se"]})
        assert not noisy.ok and "raise --threshold-runs" in noisy.undecided, noisy.line


def test_a_verdict_with_too_little_measured_is_undecided():
    """Exit 4 (undecided), not 0 or 3, where the run cannot decide: a threshold on the
    prediction whose standard error exceeds half the tolerance; no antipodal end at
    the largest β with a share too noisy to tell from the theorem's; no predicted β_c
    inside the β grid. No antipodal end where many runs would show the theorem's
    share is a contradiction."""
    study = A.Antipodal()
    config = study.defaults()
    data = _exact_run(config)
    assert study.verdict(config, data).ok
    wide = study.verdict(config, data | {"window_se": 10 * data["window_se"]})
    assert any(t["measured_se"] > A.THRESHOLD_TOL / 2 * t["predicted"]
               for t in wide.numbers["thresholds"].values())
    assert not wide.ok and "raise --threshold-runs" in wide.undecided, wide.line
    rare = 0.1 + 0 * data["p_antipodal"]  # 0.1 ± 0.095 at 10 runs: not told from 0
    few = study.verdict(config | {"runs": 10}, data | {"p_antipodal": rare,
                                                      "p_antipodal_early": rare})
    assert not few.ok and "raise --runs" in few.undecided, few.line
    none = data | {"p_antipodal": 0 * rare, "p_antipodal_early": 0 * rare}
    many = study.verdict(config, none)
    assert not many.ok and many.undecided == "", many.line
    # the line names the check that failed (it did not)
    assert "Against: d=2: P(antipodal) past β_c not the theorem's" in many.line
    # 0.15 ± 0.08 of 20 runs against 0.388 (2.2 s.e.) read as a contradiction
    short = 0.15 + 0 * data["p_antipodal"]
    twenty = study.verdict(config | {"runs": 20}, data | {"p_antipodal": short,
                                                         "p_antipodal_early": short})
    assert not twenty.ok and "raise --runs" in twenty.undecided, twenty.line
    # no antipodal end yet, still changing at the horizon: a short run, not against
    late = study.verdict(config, data | {"p_antipodal": 0 * rare,
                                         "p_antipodal_early": 0.2 + 0 * rare})
    assert not late.ok and "raise --horizon" in late.undecided, late.line
    low = study.verdict(config, data | {"betas": data["betas"] * 0 + 0.1})
    assert not low.ok and "raise --beta-max" in low.undecided, low.line


@pytest.mark.slow
def test_small_run_measures_the_threshold_at_tau_zero(monkeypatch):
    """d = 2 with the real layers: the extrapolated threshold is within the tolerance
    of the prediction, and a prediction 10 % off fails."""
    study = A.Antipodal()
    config = study.defaults() | {"dims": 1, "betas": 3, "runs": 200, "horizon": 3.0,
                                 "tau": 0.04, "seed": 0}
    data = study.simulate(config, progress=False)
    verdict = study.verdict(config, data)
    found = verdict.numbers["thresholds"]["d=2"]
    assert verdict.ok, verdict.line
    assert found["measured_se"] < A.THRESHOLD_TOL * found["predicted"] / 2
    monkeypatch.setattr(A, "antipodal_threshold",
                        lambda d, s: 1.1 * ja.theory.antipodal_threshold(d, s))
    assert not study.verdict(config, data).ok


def test_p_antipodal_is_judged_where_settled_and_fails_a_prediction_ten_percent_off(
        monkeypatch):
    """Measured shares equal to the theorem's `T → ∞` prediction pass; with the
    prediction moved by ±10 % they fail; a share still moving over the horizon's last
    part (by more than its binomial error) is not judged, and is reported."""
    study = A.Antipodal()
    config = study.defaults()
    data = _exact_run(config)
    found = study.thresholds(config, data)
    for t in found.values():
        assert t["p_within"] and t["p_ratio"] == pytest.approx(1.0, rel=1e-12)
        assert t["p_settled"] == t["p_points"] > 3 and t["p_unsettled_at"] == []
        # 1000 runs tell 5 % where P(antipodal) is large (d = 2, 4), not at d = 8
        assert t["p_judged"] == (t["p_ratio_se"] <= A.PROBABILITY_TOL / 2)
    assert found["d=2"]["p_judged"] and found["d=4"]["p_judged"]
    for factor in (1.1, 0.9):
        with monkeypatch.context() as m:
            m.setattr(A, "antipodal_probability", lambda b, d, s, f=factor:
                      f * ja.theory.antipodal_probability(b, d, s))
            wrong = study.verdict(config, data)
            assert not wrong.ok, wrong.line
            assert all(not t["p_within"] for t in wrong.numbers["thresholds"].values()
                       if t["p_judged"])
    moving = data | {"p_antipodal_early": data["p_antipodal"] - 0.05}
    moving["p_antipodal"] = data["p_antipodal"] * 1.2  # off, but not settled: not judged
    for t in study.thresholds(config, moving).values():
        assert t["p_settled"] == 0 and not t["p_judged"] and t["p_ratio"] is None
        assert len(t["p_unsettled_at"]) == len(data["betas"])


def test_a_folder_written_before_the_early_reading_is_judged_without_it():
    """An older run folder (no `p_antipodal_early`) replots: P(antipodal) not judged."""
    import json
    from pathlib import Path

    saved = Path(__file__).parents[1] / "data" / "figures" / "antipodal"
    with np.load(saved / "data.npz") as f:
        data = {k: f[k] for k in f.files if k != "p_antipodal_early"}
    experiment = A.Antipodal()
    config = experiment.config(json.loads((saved / "config.json").read_text()))
    verdict = experiment.verdict(config, data)
    assert "settled at 0/" in verdict.line and "too few runs to judge" in verdict.line


def test_a_share_of_zero_in_few_runs_is_not_judged_against_the_theorem():
    """10 runs with no antipodal end read "0 ± 0 of the theorem's (NOT within 0.05)",
    exit 3: the observed share's binomial error is 0 at 0. The error is the theorem's
    share's where larger, and 10 runs are too few to judge."""
    betas = np.array([1.5, 2.0, 2.6])
    zero = np.zeros(3)
    check = A.probability_check(betas, zero, zero, 10, 4, 1.0)
    assert not check["p_judged"] and check["p_within"] and check["p_ratio_se"] > 0.1, check
    many = A.probability_check(betas, zero, zero, 100_000, 4, 1.0)
    assert many["p_judged"] and not many["p_within"], many  # 10⁵ runs with none: against


@pytest.mark.parametrize("changes, message", [
    ({"sigma": 1e300}, "β_c = 0), so there is no threshold to measure"),  # OverflowError
    ({"sigma": 1e-300}, "puts the threshold runs past β = 300"),  # failed after its folder
    ({"dims": 40}, "--dims 40 (d up to 1,099,511,627,776): the noisy runs need"),  # hung
    ({"beta_max": 1e300}, "choose --beta-max ≤ 300"),  # overflow warnings, then exit 3
])
def test_settings_past_float64_or_memory_are_refused_before_any_work(changes, message):
    from jaxattn.experiments.runner import experiment_config

    with pytest.raises(ValueError, match=re.escape(message)):
        experiment_config(A.Antipodal(), changes, 0)
