"""`jaxattn run noisy-transition`: the coupling's mapping onto the USA model, the
equilibration and hysteresis measures (the layers' diffusion and the threshold's
estimator are `ja.theory`'s: tests/test_theory_noise.py), and the uniform state's
susceptibility `n ⟨r²⟩ = 1/(1 − K/K_#)` in a small noisy simulation."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.experiments import noisy_transition as nt
from jaxattn.theory import noisy_beta_star, noisy_threshold


def test_usa_model_has_the_papers_coupling(seed):
    """The drift of `usa_model(d, K, β)` is `K σ² P_x (1/n) Σ_j e^{β⟨x_i, x_j⟩} x_j`:
    the gradient of `K ∫ W_β(⟨x, y⟩) dρ(y)`, `W_β(t) = (e^{βt} − 1)/β`, times σ²."""
    n, d, K, beta = 7, 3, 0.37, 2.3
    x = np.asarray(ja.normalize(jax.random.normal(jax.random.PRNGKey(seed), (n, d))))
    field = K * nt.SIGMA**2 * (np.exp(beta * x @ x.T) @ x) / n
    want = field - np.sum(field * x, -1, keepdims=True) * x
    got = nt.usa_model(d, K, beta).velocity(0.0, jnp.asarray(x))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_fit_rates_of_exponentials():
    t = np.linspace(0, 1.5, 31)
    g = np.stack([0.1 * np.exp(-0.7 * t), 0.1 * np.exp(0.3 * t), -np.ones_like(t)])
    np.testing.assert_allclose(nt.fit_rates(t, g)[:2], [0.7, -0.3], rtol=1e-12)
    assert math.isnan(nt.fit_rates(t, g)[2])


def test_half_gap_flags_a_drifting_window(seed):
    rng = np.random.default_rng(seed)
    still = 1 + 0.1 * rng.standard_normal((3, 2, 8))
    drift = still + np.linspace(0, 1, 8)
    assert np.all(np.abs(nt.half_gap(still)) < 4)
    assert np.all(nt.half_gap(drift) > 4)


def test_autocorrelation_time_of_an_ar1_series(seed):
    """AR(1) with coefficient φ: `τ_int = (1 + φ)/(1 − φ)` steps."""
    rng = np.random.default_rng(seed)
    phi, x = 0.8, np.zeros(200_000)
    noise = rng.standard_normal(len(x))
    for i in range(1, len(x)):
        x[i] = phi * x[i - 1] + noise[i]
    assert nt.autocorrelation_time(x) == pytest.approx((1 + phi) / (1 - phi), rel=0.1)
    assert math.isnan(nt.autocorrelation_time(np.ones(10)))


def test_hysteresis_reads_where_each_sweep_orders():
    n = 2500  # ordered above 5/√n = 0.1
    ratios = np.array([0.4, 0.6, 0.8, 1.0, 1.2])
    up = np.array([0.02, 0.02, 0.02, 0.5, 0.7])
    down = np.array([0.02, 0.4, 0.5, 0.6, 0.7])
    assert nt.hysteresis(ratios, up, down, n) == pytest.approx((1.0, 0.6, 0.4))
    assert nt.hysteresis(ratios, up, up, n)[2] == 0
    assert math.isnan(nt.hysteresis(ratios, up * 0, down, n)[0])


def test_window_blocks_cut_the_tail_per_seed():
    r = np.arange(2 * 10, dtype=float).reshape(2, 10) ** 0.5  # r² = 0 … 19
    np.testing.assert_allclose(nt.window_blocks(r, 8, 2), [3.5, 7.5, 13.5, 17.5])


def test_uniform_state_susceptibility_matches_the_threshold(seed):
    """Below the threshold the noisy layers hold `n ⟨r²⟩ = 1/(1 − K/K_#)`: at
    `K = K_#/2` (β = β*, d = 3), 2 and not the 4/3 or ∞ that a coupling off by a
    factor 2 gives, nor the 2.7 of layers at τ = 0.05 without `layer_coupling`;
    the seeds' spread is the error."""
    n, d, tau, seeds = 300, 3, 0.05, 6
    beta = noisy_beta_star(d)
    threshold = noisy_threshold(beta, d)
    K = nt.layer_coupling(0.5 * threshold, beta, d, tau, threshold)
    dyn = eqx_stack(d, K, beta, seeds)
    x0 = ja.normalize(jax.random.normal(jax.random.PRNGKey(seed), (seeds, n, d)))
    m, _ = ja.run_layers(dyn, x0, 500, tau, observe=lambda x: (jnp.mean(x, 0), x[:1]),
                         noise=ja.TokenNoise(nt.SIGMA), key=jax.random.PRNGKey(seed + 1))
    chi = n * np.sum(np.asarray(m)[:, 100:] ** 2, -1).mean(-1)  # per seed, after t = 5
    se = chi.std(ddof=1) / math.sqrt(seeds)
    assert abs(chi.mean() - 2) < 3 * se, (chi.mean(), se)
    assert 3 * se < 2 - 4 / 3  # enough to tell 2 from 4/3 and from 2.7


def eqx_stack(d, K, beta, count):
    import equinox as eqx

    return eqx.filter_vmap(lambda k: nt.usa_model(d, k, beta))(jnp.full((count,), K))


@pytest.mark.parametrize("flags, message", [
    (["--k-min", "1.2"], "need --k-min < 1 < --k-max"),
    (["--window", "0.2", "--sweep-tau", "0.1"], "too few for --blocks 4"),
])
def test_bad_settings_are_one_line(capsys, tmp_path, flags, message):
    assert main(["run", "noisy-transition", "--out", str(tmp_path / "x"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_quick_run_writes_the_summary(tmp_path):
    out = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in nt.QUICK.items()] + ["--max-dim", "2"]
    assert main(["run", "noisy-transition", "--out", str(out), "--no-progress", *flags]) in (0, 3)
    summary = json.loads((out / "summary.json").read_text())
    cases = summary["cases"]
    assert [(c["d"], c["beta_ratio"]) for c in cases] == [(2, r) for r in nt.BETA_RATIOS]
    for c in cases:
        assert c["K_theory"] == pytest.approx(noisy_threshold(c["beta"], 2))
        assert c["continuous"] == (c["beta_ratio"] <= 1)
        assert {"K_estimate", "K_se", "hysteresis_width"} <= set(c)
    assert (out / "noisy_transition.png").exists() and (out / "table.csv").exists()
