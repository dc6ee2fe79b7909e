"""`long-context`: the critical attention scaling study (Chen et al. 2025): its
measures against closed forms on an exact simplex, its blocks against the full
attention matrix, its grid and its run."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.experiments import EXPERIMENTS
from jaxattn.experiments import long_context as LC
from jaxattn.experiments.long_context import (
    QUICK,
    diagonal_weight,
    dims,
    distance_ratio,
    finite_dim,
    mean_square,
    simplex_tokens,
    sizes,
)


def _simplex(n: int, rho: float) -> jnp.ndarray:
    """An exact simplex in R^{n+1}: `⟨y_i, y_j⟩ = ρ` for `i ≠ j` (Assumption 1)."""
    return jnp.concatenate([jnp.full((n, 1), math.sqrt(rho)),
                            math.sqrt(1 - rho) * jnp.eye(n)], axis=1)


def _model(d: int, beta: float) -> ja.SelfAttentionDynamics:
    eye = jnp.eye(d)[None]
    return ja.SelfAttentionDynamics(eye, eye, beta=beta, norm="ngpt")


@pytest.mark.parametrize("block", [1, 3, 7, None])
def test_diagonal_weight_is_the_simplex_closed_form(block):
    """On the simplex `α_ii = 1/(1 + (n − 1) e^{−β(1−ρ)})`, whatever the block (7 does
    not divide n = 9: the padded rows are dropped)."""
    n, rho, beta = 9, 0.3, 2.5
    alpha = diagonal_weight(_model(n + 1, beta), _simplex(n, rho), block=block)
    expected = 1 / (1 + (n - 1) * math.exp(-beta * (1 - rho)))
    np.testing.assert_allclose(alpha, expected, rtol=1e-12)


def test_diagonal_weight_is_the_attention_matrix_diagonal(key):
    """Random tokens and a random P with two heads: the blocks give the diagonal of
    the model's own `attention` (averaged over heads)."""
    dyn = ja.random_dynamics(key, 2, 5, beta=1.7)
    x = jax.random.normal(jax.random.fold_in(key, 1), (11, 5))
    full = jnp.mean(jnp.diagonal(dyn.attention(0.0, x), axis1=1, axis2=2), axis=0)
    np.testing.assert_allclose(diagonal_weight(dyn, x, block=4), full, rtol=1e-12)


def test_one_layer_on_the_simplex_is_the_papers_layer():
    """τ = 1: one "ngpt" layer is `N(Σ_j α_ij y_j)`, whose tokens form a simplex again
    with `r² = |mean|²` in closed form; `λ` compares it with the input's."""
    n, rho, beta = 6, 0.4, 3.0
    x = _simplex(n, rho)
    out = ja.run_layers(_model(n + 1, beta), x, 1, 1.0, observe=mean_square)
    a = 1 / (1 + (n - 1) * math.exp(-beta * (1 - rho)))
    y = a * x + (1 - a) / (n - 1) * (jnp.sum(x, 0, keepdims=True) - x)  # Σ_j α_ij y_j
    y = y / jnp.linalg.norm(y, axis=1, keepdims=True)
    np.testing.assert_allclose(out, [mean_square(x), mean_square(y)], rtol=1e-12)
    lam = distance_ratio(np.asarray(out))
    assert 0 < lam < 1
    assert LC.simplex_collapse(n, rho, beta / math.log(n)) == pytest.approx(lam, rel=1e-12)


def test_tokens_have_the_asked_mean_inner_product(key):
    x = simplex_tokens(key, 400, 64, 0.5)
    np.testing.assert_allclose(jnp.linalg.norm(x, axis=1), 1.0, rtol=1e-12)
    gram = x @ x.T
    off = (jnp.sum(gram) - jnp.trace(gram)) / (400 * 399)
    assert abs(off - 0.5) < 0.02


def test_sizes():
    assert list(sizes(100, 10_000, 2)) == [100, 316, 1000, 3162, 10_000]
    assert list(sizes(5, 5, 3)) == [5]


def test_quick_run_finds_the_transition_near_the_prediction(tmp_path):
    """A small run (d = 128 at n = 300, growing as log² n): the identity's crossing lies
    within `TOL` of `γ_n` at the largest n and approaches `γ_c`; summary.json holds
    each n's dimension and crossings beside the predictions."""
    args = ["--n-min", "30", "--n-max", "300", "--per-decade", "2", "--gammas", "9",
            "--gamma-min", "1", "--gamma-max", "3", "--dim", "128"]
    assert main(["run", "long-context", "--out", str(tmp_path), "--no-progress",
                 *args]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agrees_with_theory"] is True
    assert [row["n"] for row in summary["per_size"]] == [30, 95, 300]
    assert [row["d"] for row in summary["per_size"]] == list(dims(np.array([30, 95, 300]), 128))
    for row in summary["per_size"]:
        assert abs(row["gamma_predicted"] - 2) < 0.05
    last = summary["per_size"][-1]
    assert abs(last["gamma_identity"] / last["gamma_predicted_finite_n"] - 1) <= LC.TOL, last
    assert sorted(p.name for p in tmp_path.glob("long_context.*")) == [
        "long_context.pdf", "long_context.png"]


def test_dimension_grows_as_log_squared():
    d = dims(np.array([100, 1000, 10_000]), 1024)
    assert d[-1] == 1024 and d[0] == 256 and np.all(np.diff(d / np.log([100, 1000, 10_000])) > 0)


def test_logit_crossing_is_exact_on_the_simplex():
    """On the exact simplex `logit α_ii` is linear in `γ`: the crossing read on a
    coarse grid is `γ_n` to rounding (a linear read of `α_ii` is off by more)."""
    n, rho, g = 300, 0.5, np.array([1.0, 1.5, 2.7, 3.0])
    alpha = 1 / (1 + (n - 1) * n ** (-g * (1 - rho)))
    want = float(LC.predicted_crossing(np.array([n]), np.array([rho]))[0])
    assert ja.metrics.level_crossing(g, alpha, 0.5, logit=True) == pytest.approx(want,
                                                                             rel=1e-12)
    assert abs(ja.metrics.level_crossing(g, alpha, 0.5) - want) > 1e-2


def test_verdict_fails_a_prediction_ten_percent_off(monkeypatch):
    """The saved run (n = 100 … 1000, d = 228 … 512) passes; with `γ_n` moved by
    ±10 % it fails on the relative error."""
    study, config, data = _saved()
    verdict = study.verdict(config, data)
    assert verdict.ok, verdict.line
    assert verdict.numbers["relative_error"] < LC.TOL / 2
    exact = LC.predicted_crossing
    for factor in (1.1, 0.9):
        monkeypatch.setattr(LC, "predicted_crossing", lambda n, r, f=factor: f * exact(n, r))
        wrong = study.verdict(config, data)
        assert not wrong.ok and wrong.numbers["relative_error"] > 0.08


def test_verdict_says_what_to_change_when_attention_never_reaches_one_half():
    """With every `α_ii` kept below 1/2 (as at `--dim 2`, where the tokens are far from
    a simplex) there is no crossing: the line says so and names the flags to change;
    the saved run's line does not."""
    study, config, data = _saved()
    assert "does not reach 1/2" not in study.verdict(config, data).line
    low = study.verdict(config, data | {"alpha": np.minimum(data["alpha"], 0.4)})
    assert low.undecided == "raise --gamma-max or --dim"  # exit 4: nothing to judge
    assert not low.ok and low.line.endswith(
        f"α_ii does not reach 1/2 for γ in [{config.gamma_min:g}, {config.gamma_max:g}] at "
        f"n = {', '.join(map(str, data['sizes']))}: a larger --gamma-max, or a larger --dim "
        "(the tokens are near a simplex only for d ≫ log n)"), low.line


def test_quick_settings_are_parameters():
    params = {p.name for p in EXPERIMENTS["long-context"].all_params()}
    assert set(QUICK) <= params and not {"horizon", "saves", "discrete"} & params


def test_finite_dimension_estimate_tends_to_the_simplex_value():
    n, rho = np.array([100, 10_000]), np.array([0.5, 0.5])
    simplex = np.log(n - 1) / ((1 - rho) * np.log(n))
    np.testing.assert_allclose(finite_dim(n, 10**9, rho), simplex, rtol=1e-6)
    assert np.all(finite_dim(n, 128, rho) > simplex)
    assert np.isnan(finite_dim(np.array([10**6]), 20, np.array([0.0]))).all()


def test_rho_outside_its_range_is_refused():
    with pytest.raises(ValueError, match=r"--rho .* must lie in \[0, 1\)"):
        EXPERIMENTS["long-context"].config(rho=1.0)


def _saved():
    from pathlib import Path

    folder = Path(__file__).parents[1] / "data" / "figures" / "long-context"
    study = LC.LongContext()
    config = study.config(json.loads((folder / "config.json").read_text()))
    return study, config, dict(np.load(folder / "data.npz"))


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_verdict_fails_a_collapse_prediction_ten_percent_off(monkeypatch, factor):
    """The collapse side below `γ_c`: the saved run's `λ` crosses 1/2 within `TOL` of
    the simplex's crossing; moved by ±10 % the verdict fails on it alone."""
    study, config, data = _saved()
    verdict = study.verdict(config, data)
    assert verdict.ok and verdict.numbers["collapse_relative_error"] < LC.TOL / 2
    exact = LC._collapse_on_grid  # the simplex's crossing on the run's grid, × `factor`
    monkeypatch.setattr(LC, "_collapse_on_grid", lambda n, r, g: factor * exact(n, r, g))
    wrong = study.verdict(config, data)
    assert not wrong.ok and wrong.numbers["collapse_relative_error"] > 0.08
    assert wrong.numbers["relative_error"] == verdict.numbers["relative_error"]


def test_verdict_fails_when_the_tokens_do_not_collapse_further_as_n_grows():
    """Below `COLLAPSE_BELOW · γ_c`, `λ` must fall from the smallest `n` to the largest:
    the saved run's sizes in reverse order (λ growing with `n` there) fail."""
    study, config, data = _saved()
    lam = distance_ratio(data["r2"])
    below = data["gammas"] <= LC.COLLAPSE_BELOW * 2
    assert np.all(lam[-1, below] < lam[0, below]) and below.sum() >= 3
    flipped = data | {"r2": data["r2"].copy()}
    flipped["r2"][:, below] = data["r2"][::-1, below]
    wrong = study.verdict(config, flipped)
    assert not wrong.ok and not wrong.numbers["collapse_deepens"]


def test_simplex_collapse_tends_to_the_two_phases():
    """`λ` of the simplex → 0 below `γ_c = 2` and → 1 above as `n` grows; its crossing
    falls towards `γ_c` from above."""
    n = np.array([1e2, 1e4, 1e8])
    assert np.all(np.diff(LC.simplex_collapse(n, 0.5, 1.6)) < 0)
    assert LC.simplex_collapse(1e8, 0.5, 1.6) < 0.01
    assert LC.simplex_collapse(1e8, 0.5, 2.5) > 0.98
    crossing = LC.predicted_collapse(n, np.full(3, 0.5))
    assert np.all(np.diff(crossing) < 0) and np.all(crossing > 2)



def _exact_simplex_run(config):
    """A run's data as the exact simplex would give it (`α_ii` and `λ` the closed forms
    at `ρ̂ = ρ`, a dimension past any fluctuation): the verdict's own theory."""
    ns = sizes(config.n_min, config.n_max, config.per_decade)
    gammas = np.linspace(config.gamma_min, config.gamma_max, config.gammas)
    rho = config.rho
    alpha = 1 / (1 + (ns[:, None] - 1) * ns[:, None] ** (-gammas * (1 - rho)))
    r0 = (1 + (ns - 1) * rho) / ns  # |mean y|²
    lam = LC.simplex_collapse(ns[:, None], rho, gammas)
    r2 = np.stack([np.broadcast_to(r0[:, None], lam.shape), 1 - lam * (1 - r0[:, None])], -1)
    return {"sizes": ns, "dims": np.full(len(ns), 10**9), "gammas": gammas, "alpha": alpha,
            "r2": r2, "rho_hat": np.full(len(ns), rho)}


def test_at_rho_0_the_collapse_side_is_not_judged_and_the_run_is_undecided():
    """At ρ = 0 the mean token has norm 1/√n: the simplex's own λ crosses 1/2 near
    γ_c/2 (0.54, 0.502, 0.500 at n = 10², 10⁴, 10⁹), not at γ_c = 1, and every run was
    "against". The exact simplex itself is now undecided there (the identity side
    alone judged, said in the line), while at ρ = 1/2 it agrees."""
    np.testing.assert_allclose(LC.predicted_collapse([1e2, 1e4, 1e9], [0.0] * 3),
                               [0.540, 0.502, 0.500], atol=2e-3)
    study = LC.LongContext()
    flags = {"n_min": 20, "n_max": 2000, "gammas": 9, "dim": 256, "gamma_min": 0.2,
             "gamma_max": 2.5}
    config = study.config(rho=0.0, **flags)
    verdict = study.verdict(config, _exact_simplex_run(config))
    assert not verdict.ok and verdict.undecided.startswith("raise --rho"), verdict
    assert "collapse side NOT judged" in verdict.line and not verdict.numbers["collapse_judged"]
    half = study.config(rho=0.5, **(flags | {"gamma_max": 4.0}))
    assert study.verdict(half, _exact_simplex_run(half)).ok


def test_lambda_falls_with_n_only_where_the_simplex_itself_falls():
    """At small n the simplex's own λ rises with n at some γ < γ_c (ρ = 1/2, γ = 1.65:
    0.155, 0.216, 0.203 at n = 3, 10, 30): the exact simplex over n = 3 … 30 was
    "against". Those γ are left out (counted in the line); the rest still judge."""
    assert LC.simplex_collapse(30, 0.5, 1.65) > LC.simplex_collapse(3, 0.5, 1.65)
    study = LC.LongContext()
    config = study.config(n_min=3, n_max=30, gammas=9, dim=64, gamma_min=0.2, gamma_max=6.0)
    data = _exact_simplex_run(config)
    verdict = study.verdict(config, data)
    assert verdict.ok and verdict.numbers["collapse_deepens"], verdict.line
    assert "left out: there the simplex's own λ does not fall" in verdict.line
    flipped = data | {"r2": data["r2"][::-1].copy()}  # λ rising with n everywhere
    assert not study.verdict(config, flipped).numbers["collapse_deepens"]
