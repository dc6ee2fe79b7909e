"""Verdicts a researcher can trust (issue 15; issue 14 point 7): a run that has not
reached the predicted outcome by T says so and is undecided (raise --horizon); only
a stalled convergence contradicts it; a solver failure
in a sweep is a failure, not a verdict."""

import json

import numpy as np
import pytest

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.experiments import EXPERIMENTS, experiment_config
from jaxattn.experiments.verdicts import convergence_trend, overall_kind, run_kind
from jaxattn.sweep import _driver as _run
from jaxattn.sweep import _report

TOL = ja.metrics.CONSENSUS_TOL
TS = np.linspace(0.0, 10.0, 101)
FALLING = 0.5 * np.exp(-0.3 * TS)  # geometric, still 2.5e-2 above the tolerance at T
STALLED = 0.1 + 0.4 * np.exp(-2.0 * TS)  # settles on a plateau off the outcome


# --- the trend -----------------------------------------------------------------------


def test_trend_of_a_slow_geometric_decay_projects_its_arrival():
    trend = convergence_trend(TS, FALLING, TOL)
    assert trend.state == "converging" and not trend.contradicts
    assert trend.window == (pytest.approx(20 / 3, abs=0.1), 10.0)
    np.testing.assert_allclose(trend.rate, 0.3, rtol=1e-10)
    np.testing.assert_allclose(trend.reach, np.log(0.5 / TOL) / 0.3, rtol=1e-10)
    assert run_kind(False, trend) == "not_converged"
    text = trend.describe("E")
    assert "not yet converged at t = 10" in text and "falling at rate 0.3" in text
    assert "would reach 0.0001 by t ≈ 28.4" in text


@pytest.mark.parametrize("values, state", [
    (np.full(101, 0.1), "stalled"),  # an equilibrium off the outcome: no change at all
    (STALLED, "stalled"),  # approached exponentially: no measurable fall at the end
    (0.01 * np.exp(0.05 * TS), "rising"),
])
def test_a_stalled_trend_contradicts_and_a_rising_one_is_undecided(values, state):
    """The theorems say where a run ends, not that its measure falls on the way: a
    causal run rose 1.133 → 1.136 over t ∈ [1, 1.5] and reached 2e-14 at t = 20."""
    trend = convergence_trend(TS, values, TOL)
    assert trend.state == state and trend.contradicts and trend.reach == np.inf
    assert run_kind(False, trend) == ("contradicts" if state == "stalled" else "not_converged")
    assert state in trend.describe("E")


def test_a_short_window_is_judged_on_its_rate():
    """adversarial-weights --horizon 1e-4 read a fall at rate 0.455 as a stall (its log
    changes by 1.5e-5 in the window, under the 1e-3 of a stall): exit 3, AGAINST."""
    ts = np.linspace(0.0, 1e-4, 31)
    trend = convergence_trend(ts, 0.9 * np.exp(-0.455 * ts), TOL)
    assert trend.state == "converging" and not trend.contradicts
    np.testing.assert_allclose(trend.rate, 0.455, rtol=1e-6)
    flat = convergence_trend(ts, 0.9 * np.exp(-1e-4 * ts), TOL)  # 1e-4 per unit time
    assert flat.state == "stalled" and flat.contradicts
    assert convergence_trend(ts * 1e-10, np.full(31, 0.9), TOL).state == "unknown"


def test_a_rising_speed_does_not_contradict_theorem_32():
    """A gradient flow's speed rises when it leaves a saddle: only a stall counts."""
    rising = convergence_trend(TS, 0.01 * np.exp(0.05 * TS), TOL)
    assert run_kind(False, rising) == "not_converged"
    assert run_kind(False, convergence_trend(TS, np.full(101, 0.1), TOL)) == "contradicts"


def test_converged_trend_and_too_few_samples():
    values = np.exp(-2.0 * TS)
    trend = convergence_trend(TS, values, TOL)
    first = TS[np.argmax(values < TOL)]
    assert trend.state == "converged" and trend.reach == first
    assert run_kind(True, trend) == "agrees"
    unknown = convergence_trend(TS[:1], [0.3], TOL)
    assert unknown.state == "unknown" and not unknown.contradicts
    assert run_kind(False, unknown) == "not_converged"
    nan = convergence_trend(TS[:3], [0.3, np.nan, np.nan], TOL)
    assert nan.state == "unknown"


def test_overall_kind_is_the_worst_present():
    assert overall_kind(["agrees", "not_converged"]) == "not_converged"
    assert overall_kind(["agrees", "contradicts", "not_converged"]) == "contradicts"
    assert overall_kind(["not_applicable", "agrees"]) == "agrees"
    assert overall_kind(["not_applicable"]) == overall_kind([]) == "not_applicable"


# --- the theorem experiments: a real short run, a synthetic stall ---------------------

SHORT = {
    "thm52-symmetric": {"tokens": 4, "horizon": 2.0, "saves": 30},
    "thm32-gradient": {"tokens": 4, "horizon": 2.0, "saves": 30},
    "thm51-causal": {"tokens": 4, "dim": 6, "samples": 3, "horizon": 1.0, "saves": 30},
}


@pytest.mark.parametrize("name", [
    n if n == "thm32-gradient" else pytest.param(n, marks=pytest.mark.slow) for n in SHORT])
def test_short_horizon_is_not_yet_converged_not_against(name):
    """At a horizon too short for the outcome, but with the run still converging,
    the verdict says so: undecided, not against the theory."""
    experiment = EXPERIMENTS[name]
    config = experiment_config(experiment, SHORT[name], seed=1)
    data = experiment.simulate(config, False)
    verdict = experiment.verdict(config, data)
    print(verdict.line)
    assert not verdict.ok and verdict.undecided and verdict.extra["verdict_kind"] == "not_converged"
    assert "not yet converged at t = " in verdict.line and "AGAINST" not in verdict.line
    if name == "thm51-causal":
        assert verdict.numbers["not_converged"] == 3 and verdict.numbers["contradicts"] == 0
    else:
        assert verdict.numbers["decay_rate"] > 0


def test_thm41_short_horizon_exits_4_with_not_converged(tmp_path, capsys):
    """`jaxattn run thm41-sphere --horizon 1`: once "AGAINST Thm 4.1" with exit 3, then
    "consistent with" it with exit 0; it decides neither."""
    out = tmp_path / "run"
    assert main(["run", "thm41-sphere", "--out", str(out), "--seed", "1", "--tokens", "4",
                 "--horizon", "1", "--saves", "30", "--no-progress"]) == 4
    printed = capsys.readouterr().out
    assert "not yet converged at t = 1" in printed and "AGAINST" not in printed
    assert "undecided, raise --horizon" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agrees_with_theory"] is None
    assert summary["verdict_kind"] == "not_converged"
    assert summary["numbers"]["final_E"] > TOL and summary["numbers"]["decay_rate"] > 0


def _thm41(E):
    return {"ts": TS, "E": E, "V": 2 * E, "margin": np.asarray(0.3),
            "in_domain": np.asarray(True)}


def _thm52(dist):
    return {"ts": TS, "E": dist, "proj": 1 - dist, "theorem": np.asarray("5.2"),
            "in_domain": np.asarray(True), "agrees": np.asarray(dist[-1] < TOL)}


def _thm32(speed, EP=None):
    return {"ts": TS, "E_P": 10 + TS if EP is None else EP, "speed": speed,
            "relative_speed": speed, "E": speed,
            "clusters": np.asarray(2), "theorem": np.asarray("3.2"),
            "agrees": np.asarray(speed[-1] < TOL)}


def _thm51(gap):
    gaps = np.stack([np.exp(-3 * TS), gap])
    return {"ts": TS, "E": gaps, "gap": gaps, "agrees": gaps[:, -1] < TOL,
            "in_domain": np.ones(2, bool), "theorem": np.asarray("5.1")}


@pytest.mark.parametrize("name, make", [
    ("thm41-sphere", _thm41), ("thm52-symmetric", _thm52), ("thm32-gradient", _thm32),
    ("thm51-causal", _thm51),
])
def test_theorem_verdicts_on_a_falling_and_a_stalled_curve(name, make):
    experiment = EXPERIMENTS[name]
    config = experiment_config(experiment, {}, seed=0)
    slow = experiment.verdict(config, make(FALLING))
    assert not slow.ok and slow.undecided and slow.extra["verdict_kind"] == "not_converged", \
        slow.line
    assert "not yet converged" in slow.line and "would reach 0.0001 by t ≈ 28.4" in slow.line
    stalled = experiment.verdict(config, make(STALLED))
    assert not stalled.ok and stalled.extra["verdict_kind"] == "contradicts", stalled.line
    assert "AGAINST Theorem" in stalled.line and "stalled" in stalled.line
    done = experiment.verdict(config, make(np.exp(-3 * TS)))
    assert done.ok and done.extra["verdict_kind"] == "agrees" and "predicts" in done.line


def test_thm32_speed_rising_is_no_contradiction_but_a_falling_potential_is():
    experiment = EXPERIMENTS["thm32-gradient"]
    config = experiment_config(experiment, {}, seed=0)
    leaving_saddle = experiment.verdict(config, _thm32(0.01 * np.exp(0.05 * TS)))
    assert not leaving_saddle.ok and leaving_saddle.undecided
    assert leaving_saddle.extra["verdict_kind"] == "not_converged"
    falling_EP = experiment.verdict(config, _thm32(FALLING, EP=10 - TS))
    assert not falling_EP.ok and "AGAINST" in falling_EP.line
    # β = 500 on seed 0: E_P overflows float64 (inf − inf is NaN), the equilibrium holds
    overflow = experiment.verdict(config, _thm32(np.exp(-3 * TS), EP=np.full(101, np.inf)))
    assert overflow.ok and "overflows float64" in overflow.line and "AGAINST" not in overflow.line


def test_outside_the_hypotheses_nothing_is_contradicted():
    exp = EXPERIMENTS["thm52-symmetric"]
    config = experiment_config(exp, {}, seed=0)
    v = exp.verdict(config, _thm52(STALLED) | {"in_domain": np.asarray(False)})
    assert v.ok and v.extra["verdict_kind"] == "not_applicable" and "does not cover" in v.line
    v = EXPERIMENTS["thm41-sphere"].verdict(
        experiment_config(EXPERIMENTS["thm41-sphere"], {}, seed=0),
        _thm41(STALLED) | {"in_domain": np.asarray(False)})
    assert v.ok and v.extra["verdict_kind"] == "not_applicable"


# --- the studies -------------------------------------------------------------------


def _weights(dist):
    """adversarial-weights as in issue 15: λ₁ > 0, distance to v₁ still falling at 10T."""
    return {"value": np.asarray(0.3), "baseline": np.full(4, 7e-8), "gaps": np.full(4, 0.02),
            "values": np.arange(4.0), "gap0": np.asarray(0.75),
            "eig_best": np.array([-0.26, 0.25, 0.27]), "P_norm": np.asarray(1.6),
            "ts_long": TS * 10, "dist_long": dist, "limit_gap": np.asarray(dist[-1]),
            "E_long": dist ** 2, "in_domain": np.asarray(True)}


def test_adversarial_weights_slow_convergence_is_not_a_contradiction():
    exp = EXPERIMENTS["adversarial-weights"]
    config = experiment_config(exp, {}, seed=0)
    slow = exp.verdict(config, _weights(0.5 * np.exp(-0.04 * TS * 10)))  # rate 2 × gap
    assert not slow.ok and slow.undecided and slow.extra["verdict_kind"] == "not_converged", \
        slow.line
    assert "not yet converged at t = 100" in slow.line and "rate 0.04" in slow.line
    assert "NOT at v₁" not in slow.line
    stalled = exp.verdict(config, _weights(STALLED))
    assert not stalled.ok and stalled.extra["verdict_kind"] == "contradicts"
    assert "AGAINST Theorem 5.2" in stalled.line
    done = exp.verdict(config, _weights(np.exp(-0.2 * TS * 10)))
    assert done.ok and "consensus at v₁, as Theorem 5.2 predicts" in done.line


def _tokens(sphere, causal):
    data = {"causal_backsolve_rel_error": np.asarray(1e-9)}
    for tag, E in (("sphere", sphere), ("causal", causal)):
        data |= {f"{tag}_value": np.asarray(0.2), f"{tag}_baseline": np.full(3, 0.1),
                 f"{tag}_E_long": np.stack([E, np.exp(-3 * TS)]), f"{tag}_ts_long": TS,
                 f"{tag}_in_domain": np.asarray(True), f"{tag}_x0": np.zeros((5, 3)),
                 f"{tag}_min_inner": np.asarray(0.1)}
    return data


def test_adversarial_tokens_slow_then_stalled():
    exp = EXPERIMENTS["adversarial-tokens"]
    config = experiment_config(exp, {}, seed=0)
    slow = exp.verdict(config, _tokens(FALLING, np.exp(-3 * TS)))
    assert not slow.ok and slow.undecided and slow.extra["verdict_kind"] == "not_converged", \
        slow.line
    assert "not yet converged" in slow.line and "as Theorem 5.1 predicts" in slow.line
    stalled = exp.verdict(config, _tokens(np.exp(-3 * TS), STALLED))
    assert not stalled.ok and "AGAINST Theorem 5.1" in stalled.line


def _multihead(dist):
    data = {}
    for h in (2, 3):
        data |= {f"h{h}_value": np.asarray(dist[10]), f"h{h}_dist_long": np.asarray(dist[-1]),
                 f"h{h}_speed_end": np.asarray(1e-3), f"h{h}_baseline": np.full(3, 0.01),
                 f"h{h}_gap": np.asarray(0.05), f"h{h}_margin": np.asarray(0.02),
                 f"h{h}_ts": TS, f"h{h}_dist": dist}
    return data


def test_conjecture_multihead_slow_approach_is_no_counterexample():
    """Falling from 0.049 at T to 0.041 at 10T at a steady rate: slow, not stuck (the
    old rule, "above 1e-2 and half its value at T", called it a candidate)."""
    exp = EXPERIMENTS["conjecture-multihead"]
    config = experiment_config(exp, {}, seed=0)
    slow = exp.verdict(config, _multihead(0.05 * np.exp(-0.02 * TS)))
    assert slow.numbers["counterexample_found"] is False and "CANDIDATE" not in slow.line
    stuck = exp.verdict(config, _multihead(STALLED))
    assert stuck.numbers["counterexample_found"] is True and "CANDIDATE" in stuck.line


# --- sweeps: statuses, counts, old tables ------------------------------------------------


def test_sweep_row_statuses_and_prediction_held():
    """Failures are failures: a solver failure has no `prediction_held`; a run still
    converging at T is `not_converged` (undecided), a stalled one `contradicted`."""
    E = np.stack([np.exp(-3 * TS), FALLING, STALLED, FALLING, STALLED])
    out = {"E": E, "ts": np.tile(TS, (5, 1)), "residual": E,
           "in_domain": np.array([True, True, True, True, False]),
           "reached": E[:, -1] < TOL, "success": np.array([True, True, True, False, True]),
           "num_steps": np.full(5, 9)}
    spec = ja.sweep.SweepSpec("thm41-sphere", instances=5)
    rows = _run._rows(spec, {"beta": 1.0}, ["beta"], 0, 0, out, "4.1")
    cols = {c: [r[i] for r in rows] for i, c in enumerate(_run._header(["beta"]))}
    assert cols["status"] == ["held", "not_converged", "contradicted", "solver_failed",
                              "outside_domain"]
    assert cols["prediction_held"] == ["true", "", "false", "", ""]
    assert _report.instance_status(True, True, False, TS, 0.01 * np.exp(0.05 * TS)) == (
        "not_converged")


@pytest.mark.slow
def test_short_sweep_counts_still_converging_apart(tmp_path):
    """A horizon too short for 1e-4: no instance is counted against the theorem."""
    result = ja.sweep("thm41-sphere", {"beta": [1.0]}, instances=4,
                      set={"horizon": 0.5, "saves": 10, "tokens": 4}, out=tmp_path / "s",
                      progress=False, log=lambda *_: None)
    table, s = result.table, result.summary
    assert list(table) == ["beta", *ja.sweep.COLUMNS]
    assert set(table["status"]) == {"not_converged"} and not any(table["outcome_reached"])
    assert all(h is None for h in table["prediction_held"])
    assert s["not_converged"] == 4 and s["contradicted"] == s["solver_failed"] == 0
    assert s["prediction_held"] == 0 and s["verdict_kind"] == "not_converged"
    assert "4 not yet converged" in s["verdict"] and "0 contradicted" in s["verdict"]
    text = ja.sweep.format_table(s, ["beta"])
    assert "converging" in text and "against" in text


def test_summary_counts_each_status_and_old_tables_still_load(tmp_path):
    status = np.array(["held", "not_converged", "contradicted", "solver_failed",
                       "outside_domain", "held"], dtype=object)
    table = {"point": np.array([0, 0, 0, 0, 0, 1]), "beta": np.array([1.0] * 5 + [2.0]),
             "consensus_time": np.array([1.0, np.inf, np.inf, np.inf, 2.0, 1.0]),
             "final_E": np.array([1e-5, 1e-2, 0.1, np.nan, 1e-5, 1e-6]),
             "in_domain": np.array([True, True, True, True, False, True]),
             "prediction_held": np.array([True, None, False, None, None, True], object),
             "solver_success": np.array([True, True, True, False, True, True]),
             "status": status}
    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0, 2.0]}, instances=5)
    s = _report.summarise(spec, [{"beta": 1.0}, {"beta": 2.0}], ["beta"], table)
    assert (s["prediction_held"], s["not_converged"], s["contradicted"], s["solver_failed"],
            s["outside_domain"]) == (2, 1, 1, 1, 1)
    assert s["verdict_kind"] == "contradicts"
    # a table.csv written before the status column: read as it is, summarised from the rest
    header = ["beta", *[c for c in ja.sweep.COLUMNS if c != "status"]]
    (tmp_path / "table.csv").write_text(",".join(header) + "\n"
                                        "1.0,0,0,0,4.1,0.5,inf,true,false,false,true,9\n"
                                        "1.0,0,1,1,4.1,1e-05,1.0,true,true,true,true,9\n")
    old = ja.sweep.load_table(tmp_path)
    assert "status" not in old and list(old["prediction_held"]) == [False, True]
    assert list(_report.statuses(old)) == ["not_reached", "held"]
    assert _report.point_stats(old, 0)["prediction_held"] == 1


def test_the_trend_of_a_run_over_a_subnormal_horizon_is_read():
    """adversarial-tokens --horizon 5e-324 (its smallest allowed value): the times are
    subnormal, and the least-squares fit on them failed (SVD did not converge)."""
    import math

    import numpy as np

    from jaxattn.experiments.verdicts import convergence_trend

    ts = np.linspace(0.0, 5e-323, 31)  # the run to 10 T: ten distinct subnormal times
    trend = convergence_trend(ts, np.full(31, 0.75), 1e-4)
    # no rate can be read in so short a window: not a stall (it read as one, AGAINST)
    assert trend.state == "unknown" and trend.final == 0.75 and not trend.contradicts
    # an ordinary run: the rate and the time the tolerance is reached, exactly
    ts = np.linspace(0.0, 10.0, 101)
    trend = convergence_trend(ts, 0.5 * np.exp(-0.3 * ts), 1e-6)
    assert trend.state == "converging"
    assert math.isclose(trend.rate, 0.3, rel_tol=1e-9)
    assert math.isclose(trend.reach, math.log(0.5 / 1e-6) / 0.3, rel_tol=1e-9)


# --- a plateau near an unstable equilibrium; the layers judge nothing ------------------


def _antipodal_plateau(ts, theta0=1e-6, rate=np.exp(-1) / (np.exp(-1) + np.e)):
    """1 − ⟨x₂, x₁⟩ of 2 causal tokens on S² (P = U = I), x₂ at θ₀ rad from −x₁: the
    angle to −x₁ grows as tan(θ/2) ∝ e^{a t} near it, a = e⁻¹/(e⁻¹ + e); the true flow
    reaches a gap < 1e-4 at t ≈ 129."""
    theta = 2 * np.arctan(np.tan(theta0 / 2) * np.exp(rate * ts))
    return 1 + np.cos(theta)


def test_a_stall_near_an_unstable_equilibrium_is_undecided_not_against():
    """Theorem 5.1's domain holds the start, and T = 10 is a plateau at gap ≈ 2: it
    read as AGAINST (exit 3). A stall away from the unstable points still contradicts."""
    plateau = _antipodal_plateau(TS)
    trend = convergence_trend(TS, plateau, TOL)
    assert trend.state == "stalled"
    assert run_kind(False, trend, unstable=True) == "not_converged"
    assert run_kind(False, trend) == "contradicts"
    experiment = EXPERIMENTS["thm51-causal"]
    config = experiment_config(experiment, {}, seed=0)
    v = experiment.verdict(config, _thm51(plateau))
    assert not v.ok and v.undecided and v.extra["verdict_kind"] == "not_converged", v.line
    assert "AGAINST" not in v.line and "unstable equilibrium" in v.line
    assert v.numbers["contradicts"] == 0
    # Theorem 5.2: a token left on the equator ⟨x, v₁⟩ = 0 (1 − proj ≈ 1)
    exp52 = EXPERIMENTS["thm52-symmetric"]
    v = exp52.verdict(experiment_config(exp52, {}, seed=0), _thm52(1 - 1e-4 * STALLED))
    assert v.undecided and v.extra["verdict_kind"] == "not_converged", v.line
    # the adversarial-tokens causal check that ends with a token near −x₁
    exp = EXPERIMENTS["adversarial-tokens"]
    data = _tokens(np.exp(-3 * TS), 2 * plateau) | {"causal_end_min_first": np.asarray(-0.99996)}
    v = exp.verdict(experiment_config(exp, {}, seed=0), data)
    assert not v.ok and v.undecided and "AGAINST" not in v.line, v.line
    far = exp.verdict(experiment_config(exp, {}, seed=0),
                      data | {"causal_end_min_first": np.asarray(0.3)})
    assert "AGAINST Theorem 5.1" in far.line


def _with_layers(flow, layers):
    return flow | {f"{k}_layers": v for k, v in layers.items() if k not in
                   ("theorem", "in_domain")}


def test_discrete_judges_the_flow_and_describes_the_layers():
    """Theorem 5.2 is about the flow: with --discrete the layers' stall is no AGAINST,
    and the flow's stall still is."""
    exp = EXPERIMENTS["thm52-symmetric"]
    config = experiment_config(exp, {"discrete": True, "tau": 0.1}, seed=0)
    v = exp.verdict(config, _with_layers(_thm52(np.exp(-3 * TS)), _thm52(STALLED)))
    assert v.ok and v.extra["verdict_kind"] == "agrees", v.line
    assert v.line.startswith("flow: ") and "as Theorem 5.2 predicts" in v.line
    assert "the layers (100, τ = 0.1): consensus at v₁ not reached by t = 10" in v.line
    assert "Theorem 5.2 covers the flow only" in v.line and "AGAINST" not in v.line
    v = exp.verdict(config, _with_layers(_thm52(STALLED), _thm52(np.exp(-3 * TS))))
    assert v.extra["verdict_kind"] == "contradicts" and "the layers (100, τ = 0.1): " \
        "consensus at v₁; Theorem 5.2 covers" in v.line, v.line
    exp51 = EXPERIMENTS["thm51-causal"]
    config = experiment_config(exp51, {"discrete": True}, seed=0)
    v = exp51.verdict(config, _with_layers(_thm51(np.exp(-3 * TS)), _thm51(STALLED)))
    assert v.ok and "1/2 starts reached consensus at the first token" in v.line, v.line


def test_search_numbers_keep_labels_and_flags():
    exp = EXPERIMENTS["adversarial-tokens"]
    data = _tokens(FALLING, np.exp(-3 * TS)) | {"sphere_theorem": np.asarray("4.1")}
    numbers = exp.numbers(experiment_config(exp, {}, seed=0), data)
    assert numbers["sphere_theorem"] == "4.1" and numbers["sphere_in_domain"] is True
    assert isinstance(numbers["sphere_value"], float)


def test_rounding_is_no_rise_and_no_negative_distance():
    """thm41 printed "V(t) largest rise 9.8e-34", thm52 "1 − min_i⟨x_i, v₁⟩ = -2.2e-16"."""
    from jaxattn.experiments.verdicts import largest_rise

    V = np.array([1e-30, 1e-30 + 9.8e-34, 5e-31])
    eps = np.finfo(float).eps
    assert largest_rise(V, 8 * eps * np.sqrt(2 * np.maximum(V[1:], V[:-1]))) == 0.0
    assert largest_rise(V) > 0 and largest_rise(np.array([1.0, 0.5])) == -0.5
    v = EXPERIMENTS["thm41-sphere"].verdict(experiment_config(EXPERIMENTS["thm41-sphere"], {},
                                                              seed=0),
                                            _thm41(np.exp(-3 * TS)) | {"V": 1e-30 + 0 * TS})
    assert "V(t) never rises" in v.line
    exp = EXPERIMENTS["thm52-symmetric"]
    dist = np.exp(-3 * TS)
    dist[-1] = -2.2e-16  # 1 − proj as rounded for a token on v₁
    v = exp.verdict(experiment_config(exp, {}, seed=0), _thm52(dist))
    assert v.ok and v.numbers["final_1_minus_min_proj"] == 0.0
    assert "1 − min_i⟨x_i, v₁⟩ = 0 < 0.0001" in v.line, v.line


def test_a_sweeps_stall_near_an_unstable_equilibrium_is_not_counted_against():
    """A sweep's instance that stalls with a token at −x₁ (Theorem 5.1's residual near
    2) or its worst token on the equator (5.2's near 1) sits on a plateau: not
    converged, as `run` judges it; the same stall elsewhere, or for 4.1, contradicts."""
    flat = np.full_like(TS, 2.0 - 1e-6)
    assert _report.instance_status(True, True, False, TS, flat, "5.1") == "not_converged"
    assert _report.instance_status(True, True, False, TS, flat - 0.5, "5.1") == "contradicted"
    assert _report.instance_status(True, True, False, TS, flat - 1.0, "5.2") == "not_converged"
    assert _report.instance_status(True, True, False, TS, flat, "4.1") == "contradicted"
