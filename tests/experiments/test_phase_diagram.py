"""`jaxattn run phase-diagram`: the update, the time loop and the pair density against an
independent NumPy transcription of Geshkovski et al.'s `phase-diagrams.py`."""

import json
import math
import re

import jax
import numpy as np
import pytest

import jaxattn as ja
from jaxattn._dynamics import NORMS
from jaxattn.cli import main
from jaxattn.experiments import EXPERIMENTS, norm_beta, pair_density
from jaxattn.experiments import phase_diagram as pd
from jaxattn.experiments.base import choices
from jaxattn.experiments.runner import experiment_config, run_experiment


def _their_step(M, BF, V, beta, eta, softmax):
    """`simu_xform.step_1` in NumPy: batch of systems (b, n, d), BF and V (b, d, d)."""
    SM = beta * (M @ BF) @ M.transpose(0, 2, 1)
    if softmax:
        SM = np.exp(SM - SM.max(-1, keepdims=True))
        SM /= SM.sum(-1, keepdims=True)
    else:
        SM = np.exp(SM) / M.shape[1]
    M2 = (eta * (SM @ M)) @ V + M
    return M2 / np.linalg.norm(M2, axis=-1, keepdims=True)


def _their_density(M, threshold=0.999):
    IP = M @ M.transpose(0, 2, 1)
    mask = ~np.eye(M.shape[1], dtype=bool)[None].repeat(len(M), 0)
    return (IP[mask] > threshold).sum() / mask.sum()


def _their_run(M, BF, V, beta, eta, times, softmax):
    """`do_single_beta`: step, and fill every checkpoint the summed time has passed."""
    M = M / np.linalg.norm(M, axis=-1, keepdims=True)
    dens, cur_time, ckpt = np.zeros(len(times)), 0.0, 0
    while True:
        M = _their_step(M, BF, V, beta, eta, softmax)
        cur_time = cur_time + eta
        if ckpt < len(times) and cur_time >= times[ckpt]:
            d = _their_density(M)
            while ckpt < len(times) and cur_time >= times[ckpt]:
                dens[ckpt], ckpt = d, ckpt + 1
        if cur_time >= times[-1]:
            return dens


@pytest.mark.parametrize("exp_kernel, key_query, value", [(False, 0, 0), (True, 1, 2)])
def test_density_map_equals_their_script(exp_kernel, key_query, value):
    """The whole study against the transcription, system by system, with the
    experiment's own draws: softmax with identity weights (one model per β, systems in
    groups), the exp kernel with a Gaussian B and V = +KQ per system."""
    cfg = experiment_config(EXPERIMENTS["phase-diagram"], {
        "betas": 2, "beta_min": 0.5, "beta_max": 2.0, "systems": 3, "tokens": 6, "dim": 3,
        "key_query": key_query, "value": value, "exp_kernel": exp_kernel,
        "horizon": 0.0 if exp_kernel else 3.0, "times": 9}, seed=5)
    key = jax.random.PRNGKey(5)
    got = pair_density.density_map(key, cfg)
    x0, P, U = (np.asarray(a) for a in pair_density.draw_systems(key, cfg))
    s = x0.shape[2]  # systems per model
    x0, P, U = x0.reshape(2, 3, 6, 3), np.repeat(P[:, :, 0], s, 1), np.repeat(U[:, :, 0], s, 1)
    times = np.linspace(0, 1.0 if exp_kernel else 3.0, 9)
    for b, beta in enumerate(np.linspace(0.5, 2.0, 2)):
        eta = 0.1 / max(math.sqrt(beta) * math.exp(beta - 0.5), 1) if exp_kernel else 0.1
        want = _their_run(x0[b], P[b], U[b].transpose(0, 2, 1), beta, eta, times,
                          not exp_kernel)
        np.testing.assert_array_equal(got["density"][b], want)
    assert got["density"][:, -1].max() > 0  # the check saw some clustering


@pytest.mark.parametrize("kernel", ["softmax", "exp"])
def test_layer_is_their_update_for_a_few_steps(key, kernel):
    """Their update is the post-norm layer with P = B, U = Vᵀ (float64, 1e-13), for
    every key-query and value draw."""
    n, d, beta, eta = 7, 3, 1.7, 0.05
    x0 = jax.random.normal(key, (n, d))
    for kq in range(4):
        for v in range(4):
            P, U = pair_density.draw_weights(jax.random.fold_in(key, 4 * kq + v), d, 1, kq, v)
            dyn = ja.SelfAttentionDynamics(P, U, beta=beta, kernel=kernel)
            ys = np.asarray(ja.run_layers(dyn, x0, 4, eta))
            # Their V: ±B/c from B itself (B Gaussian is not symmetric, so U = Vᵀ shows);
            # the identity and GGᵀ/√d are symmetric.
            scale = (1, math.sqrt(d), math.sqrt(d), math.sqrt(d + 1))[kq]
            V = {2: P / scale, 3: -P / scale}.get(v, np.swapaxes(U, -1, -2))
            M = np.asarray(x0)[None] / np.linalg.norm(x0, axis=-1, keepdims=True)
            for k in range(1, 5):
                M = _their_step(M, np.asarray(P), np.asarray(V), beta, eta, kernel == "softmax")
                np.testing.assert_allclose(ys[k], M[0], rtol=0, atol=1e-13)


def test_weight_draws_follow_their_codes(key):
    d = 4
    B1, _ = pair_density.draw_weights(key, d, 1, 3, 0)
    np.testing.assert_array_equal(B1, np.swapaxes(B1, -1, -2))  # GOE is symmetric
    for v, sign in ((2, 1), (3, -1)):
        B, U = pair_density.draw_weights(key, d, 1, 3, v)
        np.testing.assert_allclose(U[0].T, sign * B[0] / math.sqrt(d + 1), rtol=1e-15)
    B, U = pair_density.draw_weights(key, d, 2, 1, 2)  # two heads, averaged: U = V^T / h
    np.testing.assert_allclose(U, np.swapaxes(B, -1, -2) / math.sqrt(d) / 2, rtol=1e-15)
    assert not np.allclose(B[0], B[1])


def test_pair_count_against_numpy(key):
    x = np.array(jax.random.normal(key, (5, 9, 2)))
    x[:, 3] = x[:, 1] * 1.0001  # a clustered pair in every system
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    got = jax.vmap(lambda y: pair_density.clustered_pairs(y, 0.999))(x)
    want = [(np.triu(y @ y.T > 0.999, 1)).sum() * 2 for y in x]
    np.testing.assert_array_equal(got, want)
    assert min(want) >= 2
    off = jax.vmap(lambda y: pair_density.clustered_pairs(3 * y, 0.999, unit=False))(x)
    np.testing.assert_array_equal(off, want)


def test_schedule_and_groups():
    steps, at = pair_density.schedule(0.1, np.linspace(0, 30, 200))
    clock = np.cumsum(np.full(steps, 0.1))
    assert clock[-1] >= 30 > clock[-2] and at[0] == 1 and at[-1] == steps
    taus = [pair_density.step_size(b, 0.1, True, False) for b in np.linspace(0.1, 9, 90)]
    counts = np.array([pair_density.schedule(t, np.linspace(0, 1, 200))[0] for t in taus])
    groups = pair_density.step_groups(counts)
    assert sorted(np.concatenate(groups).tolist()) == list(range(90))
    assert all(counts[g].max() <= 2 * counts[g].min() for g in groups)
    assert pair_density.step_groups(np.full(5, 301))[0].tolist() == list(range(5))


def test_listed_and_run_by_the_cli(tmp_path, capsys):
    assert main(["list"]) == 0
    assert "phase-diagram" in capsys.readouterr().out
    flags = [a for k, v in pd.QUICK.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    out = tmp_path / "run"
    assert main(["run", "phase-diagram", "--out", str(out), "--no-progress", *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["numbers"]["total_steps"] > 0 and "softmax" in summary["verdict"]
    # it predicts nothing: no agreement recorded (it was `true`), and exit 0
    assert summary["agrees_with_theory"] is None and "undecided" not in summary
    data = np.load(out / "data.npz")
    assert data["density"].shape == (pd.QUICK["betas"], pd.QUICK["times"])
    assert (out / "phase_diagram.png").exists()
    assert main(["run", "phase-diagram", "--out", str(tmp_path / "bad"), "--value", "7"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--value" in err and "\n" not in err


def test_norm_beta_runs_a_placement_and_names_them(tmp_path):
    assert choices(0, NORMS) == NORMS
    assert choices(2, NORMS) == ("pre",)
    with pytest.raises(ValueError, match="--norm"):
        EXPERIMENTS["norm-beta"].config(norm=len(norm_beta.NORMS) + 1)
    folder, summary = run_experiment("norm-beta", norm_beta.QUICK | {"norm": 2}, seed=1,
                                     out=tmp_path / "nb", progress=False, log=None)
    data = np.load(folder / "data.npz")
    assert data["norms"].tolist() == ["pre"]
    assert data["density"].shape == (1, norm_beta.QUICK["betas"], norm_beta.QUICK["times"])
    assert np.all((data["density"] >= 0) & (data["density"] <= 1))
    assert "pre:" in summary["verdict"] and (folder / "norm_beta.png").exists()
    assert summary["agrees_with_theory"] is None


def test_an_exp_kernel_past_float64_is_refused_before_its_steps_overflow():
    """The steps `exp(β − ½)` were computed first: an OverflowError traceback."""
    with pytest.raises(ValueError, match="--beta-max 800: with --exp-kernel") as info:
        experiment_config(EXPERIMENTS["phase-diagram"], {"exp_kernel": True, "beta_max": 800.0},
                          0)
    assert "\n" not in str(info.value)


def test_a_map_with_no_clustered_pair_is_drawn_and_says_so():
    """All zeros: a log scale has nothing to show (matplotlib's "Invalid vmin or vmax"
    left the run INCOMPLETE); the map is drawn linear, from 0 to 1."""
    from jaxattn._artifacts.figures import pyplot

    plt = pyplot()
    fig = plt.figure()
    mesh = pair_density.draw_map(fig.add_subplot(), fig, np.array([2.0, 3.0]),
                                 np.array([0.0, 0.5, 1.0]), np.zeros((2, 3)), log=True,
                                 title="log colour scale")
    assert mesh.norm.vmin == 0.0 and mesh.norm.vmax == 1.0
    assert "no pair clustered" in mesh.axes.get_title()
    plt.close(fig)


def test_the_map_names_every_range_of_beta_short_of_one_half():
    """Density ½ reached in the middle of the β grid alone: the words name both ranges
    it misses (they said "not reached for β ≥ 0.1", as if the misses were one range
    above)."""
    betas, ts = np.array([0.1, 1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0.0, 1.0, 2.0])
    density = np.zeros((6, 3))
    density[2:4, 1:] = 0.6
    line, numbers = pair_density.describe_map(betas, ts, density)
    assert "not reached by T for β in [0.1, 1] and β in [4, 5]" in line, line
    assert "t½ (density ≥ 0.5) from 1 at β = 2 to 1 at β = 3" in line
    density[5, 2] = 0.6
    assert "for β in [0.1, 1] and β = 4" in pair_density.describe_map(betas, ts, density)[0]
    assert numbers["beta_not_reaching_half"] == 0.1


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_placement_whose_tokens_overflow_keeps_the_others(tmp_path):
    """`norm = "none"` lets the tokens grow past float64: the run stopped after every
    placement was computed (exit 2, INCOMPLETE, the other maps lost). Its β rows are
    NaN now, named in the line and left blank in the figure."""
    config = norm_beta.QUICK | {"dim": 64, "heads": 1, "value": 1, "horizon": 50.0,
                                "times": 6, "norm": 0}
    folder, summary = run_experiment("norm-beta", config, seed=0, out=tmp_path / "nb",
                                     progress=False, log=None)
    data = np.load(folder / "data.npz")
    lost = np.isnan(data["density"]).all(axis=(1, 2))
    assert data["norms"][lost].tolist() == ["none"], data["norms"][lost]
    assert np.all((data["density"][~lost] >= 0) & (data["density"][~lost] <= 1))
    assert "none: the tokens overflowed float64 for every β" in summary["verdict"]
    assert (folder / "norm_beta.png").exists()


def test_the_map_names_the_betas_that_overflowed():
    betas, ts = np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0])
    density = np.array([[0.2, 0.6], [0.1, 0.3], [np.nan, np.nan]])
    line, numbers = pair_density.describe_map(betas, ts, density)
    assert "overflowed float64 for β = 3" in line and "density at T = 1: 0.3 to 0.6" in line
    assert numbers["beta_overflowed"] == 3.0 and numbers["final_density_max"] == 0.6
    from jaxattn._artifacts.figures import pyplot

    plt = pyplot()
    fig = plt.figure()
    ax = fig.add_subplot()
    pair_density.draw_map(ax, fig, betas, ts, density, log=False, title="map")
    # hatched and named, not a white row a reader takes for a density of 0
    assert [t.get_text() for t in ax.texts] == ["overflowed float64"]
    assert len(ax.patches) == 1 and ax.patches[0].get_hatch() == "//"
    plt.close(fig)


@pytest.mark.parametrize("changes, message", [
    # a plot of 10⁸ columns hung, after data.npz was written
    ({"betas": 2, "systems": 2, "tokens": 4, "horizon": 1.0, "times": 10**8},
     "--times 100000000 records more times than the longest run has states (11"),
    # `--beta-max` was dropped without a word and the β axis ran from 0 to 1
    ({"betas": 1, "beta_min": 0.5, "beta_max": 9.0}, "--betas 1 runs β = --beta-min (0.5)"),
    # the d × d weights (320 GB) and the n × n attention (240 GB) were not counted
    ({"betas": 2, "systems": 2, "tokens": 4, "dim": 100_000}, "the weights need at least"),
    ({"betas": 2, "systems": 2, "tokens": 100_000}, "one system's attention needs at least"),
])
def test_sizes_it_cannot_run_are_refused_before_any_work(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        experiment_config(EXPERIMENTS["phase-diagram"], changes, 0)
    assert "\n" not in str(info.value)
