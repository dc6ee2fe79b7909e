"""The `variants` study (`jaxattn run variants`): the grid end to end, one cell alone,
its measurements against NumPy, and resuming after an interruption."""

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn.cli import main
from jaxattn.experiments import run_experiment
from jaxattn.experiments import variants as study
from jaxattn.experiments.runner import experiment_config
from jaxattn.metrics import CONSENSUS_TOL

#: A tiny grid: one placement (pre), both kernels (two programs), every mask and the
#: default β (4 of them), 3 instances of 10 tokens in R³, 12 layers.
TINY = {"size": 1, "norm": 2, "kernel": 0, "instances": 3, "layers": 12, "tau": 0.5}


@pytest.fixture(scope="module")
def chunk_root(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("cwd")
        mp.chdir(root)  # the chunks live in the run folder, never in ./runs
        yield root


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, chunk_root):
    out = tmp_path_factory.mktemp("variants") / "run"
    folder, summary = run_experiment("variants", TINY, seed=3, out=out, progress=False,
                                     log=None)
    with np.load(folder / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    return folder, summary, data


def _table(folder):
    with open(folder / "table.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_tiny_grid_end_to_end(tiny_run, chunk_root):
    folder, summary, data = tiny_run
    rows = _table(folder)
    assert len(rows) == 1 * 1 * 4 * 2 * 4  # sizes × norms × masks × kernels × β
    assert data["final_E"].shape == (1, 1, 4, 2, 4, 3)
    assert data["E_median"].shape == (1, 1, 4, 2, 4, 13)
    assert {r["outcome"] for r in rows} <= set(study.OUTCOMES)
    assert {r["theorem"] for r in rows} == {"none"}  # pre-LN: no theorem covers it
    assert all("norm = 'pre'" in r["no_theorem_because"] for r in rows)
    assert set(summary["verdicts"]) == {f"pre · {m} · {k}" for m in study.MASKS
                                        for k in study.KERNELS}
    assert (folder / "variants.png").exists() and (folder / "variants.pdf").exists()
    assert not any(chunk_root.iterdir())  # the chunks go once the study is done


def test_a_cell_alone_equals_its_cell_of_the_grid(tiny_run, tmp_path, chunk_root, capsys):
    folder, _, data = tiny_run
    row = next(r for r in _table(folder)
               if (r["mask"], r["kernel"], r["beta"]) == ("window", "sigmoid", "4.0"))
    out = tmp_path / "cell"
    assert main(row["command"].split()[1:] + ["--out", str(out), "--no-progress"]) == 0
    # the closing line names every file written (it left out table.csv)
    assert "variants.pdf, table.csv, summary.json (" in capsys.readouterr().out
    with np.load(out / "data.npz") as f:
        cell = {k: f[k] for k in f.files}
    at = (0, 0, study.MASKS.index("window"), study.KERNELS.index("sigmoid"),
          study.BETAS.index(4.0))
    for name in study.MEASURES:
        assert cell[name].shape == (1, 1, 1, 1, 1, 3)
        np.testing.assert_allclose(cell[name][0, 0, 0, 0, 0], data[name][at], rtol=1e-12,
                                   atol=0, err_msg=name)
    alone = _table(out)[0]
    assert alone.keys() == row.keys()
    for name in row.keys() - {"command"}:  # the same cell; numbers as the data above
        try:
            ours, grid = float(alone[name]), float(row[name])
        except ValueError:
            assert alone[name] == row[name], name
            continue
        np.testing.assert_allclose(ours, grid, rtol=1e-12, atol=0, err_msg=name)


def test_measurements_against_numpy(tiny_run):
    # The tiny grid's own program (pre-LN, softmax; compiled once), on other keys.
    n, d, L, tau = 10, 3, TINY["layers"], TINY["tau"]
    keys = jax.random.split(jax.random.PRNGKey(7), TINY["instances"])
    drawn = study.draw_batch(keys, size=(n, d), heads=2, masks=study.MASKS, window=2,
                             keep=0.3)
    betas = jnp.asarray(study.BETAS)
    E, clusters, residual, finite = study.run_program(*drawn, betas, num_layers=L, tau=tau,
                                                      norm="pre", kernel="softmax")
    P, U, x0, masks = (np.asarray(a) for a in drawn)
    i, j = np.indices((n, n))
    assert np.array_equal(masks[1, 0], j <= i) and np.array_equal(masks[2, 0], abs(i - j) < 2)
    assert masks[3].all(axis=0).diagonal().all() and not masks[3].all()
    for m, b, k in [(1, 0, 1), (3, 3, 2), (2, 1, 0)]:
        dyn = ja.SelfAttentionDynamics(P[k], U[k], beta=float(betas[b]), norm="pre",
                                       mask=masks[m, k])
        xs = np.asarray(ja.run_layers(dyn, x0[k], L, tau))  # the library's own entry point
        u = xs / np.linalg.norm(xs, axis=-1, keepdims=True)
        E_np = np.mean(1 - np.einsum("td,tjd->tj", u[:, 0], u), axis=-1)
        np.testing.assert_allclose(E[m, b, k], E_np, atol=1e-12)
        last = u[-1]
        res = np.linalg.norm(last - last.mean(0)) / np.linalg.norm(last)
        np.testing.assert_allclose(residual[m, b, k], res, rtol=1e-10)
        assert clusters[m, b, k] == _components(last, study.CLUSTER_EPS)
        assert finite[m, b, k]
    below = np.asarray(E) < CONSENSUS_TOL
    first = np.where(below.any(-1), below.argmax(-1), np.inf)
    np.testing.assert_array_equal(study.consensus_layer(np.asarray(E)), first)


def _components(u: np.ndarray, eps: float) -> int:
    """Single-linkage clusters by union–find (an independent count)."""
    parent = list(range(len(u)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(u)):
        for j in range(i):
            if np.linalg.norm(u[i] - u[j]) < eps:
                parent[root(i)] = root(j)
    return len({root(i) for i in range(len(u))})


def test_cluster_count_sees_separated_groups():
    u = np.array([[1.0, 0, 0], [1.0, 0.01, 0], [0, 1.0, 0], [0, 1.0, 0.02], [0, 0, 1.0]])
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    count = jax.jit(study.measure)(jnp.asarray(u))[0]
    assert int(count) == 3 == _components(u, study.CLUSTER_EPS)


def test_resume_after_an_interruption_gives_the_same_table(tiny_run, tmp_path, monkeypatch,
                                                           chunk_root):
    reference, _, _ = tiny_run
    real, calls = study.simulate_chunk, []

    def interrupted(config, grid, program):
        if calls:
            raise KeyboardInterrupt  # a kill after the first chunk was saved
        calls.append(program)
        return real(config, grid, program)

    monkeypatch.setattr(study, "simulate_chunk", interrupted)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment("variants", TINY, seed=3, out=out, progress=False, log=None)
    assert len(list((out / study.CHUNKS).glob("*.npz"))) == 1

    def counted(config, grid, program):
        calls.append(program)
        return real(config, grid, program)

    monkeypatch.setattr(study, "simulate_chunk", counted)
    folder, _ = run_experiment("variants", TINY | {"resume": True}, seed=3, out=out,
                               progress=False, log=None)
    assert len(calls) == 2  # the saved chunk was not computed again
    assert (folder / "table.csv").read_bytes() == (reference / "table.csv").read_bytes()
    verdict = json.loads((folder / "summary.json").read_text())["verdict"]
    assert verdict == json.loads((reference / "summary.json").read_text())["verdict"]


def test_bad_settings_are_refused(tmp_path, chunk_root):
    for bad, match in [({"norm": 9}, r"--norm must be one of all \(0\), post \(1\)"),
                       ({"norm": "post-norm"}, "--norm must be one of"), ({"beta": -1.0}, "--beta"),
                       ({"keep": 1.5}, "--keep"), ({"mask": -1}, "--mask")]:
        with pytest.raises(ValueError, match=match):
            run_experiment("variants", TINY | bad, progress=False, log=None,
                           out=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_choices_are_taken_by_name_and_recorded_by_name():
    """`--norm none` (or its code 5) selects the post-less placement; the command
    recorded to repeat the run spells the name; the names are the study's own axes."""
    from jaxattn.experiments import experiment_config, get_experiment, runner

    experiment = get_experiment("variants")
    names = {p.name: p.names for p in experiment.all_params() if p.names}
    assert names == {"norm": ("all", *study.NORMS), "mask": ("all", *study.MASKS),
                     "kernel": ("both", *study.KERNELS)}
    by_name = experiment_config(experiment, {"norm": "none", "mask": "causal"}, 0)
    assert by_name == experiment_config(experiment, {"norm": "5", "mask": 2}, 0)
    assert study.Grid.of(by_name).norms == ("none",)
    line = runner.command_line(by_name, experiment)
    assert line.endswith("--norm none --mask causal"), line


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_figures_carry_no_creation_date(tmp_path):
    """The heat map's PDF is written with the reproducible metadata of every other
    figure: no /CreationDate, so a resumed run's PDF equals the uninterrupted one's."""
    from pathlib import Path

    saved = Path(__file__).parents[1] / "data" / "figures" / "variants"
    config = study.VariantsExperiment().config(json.loads((saved / "config.json").read_text()))
    with np.load(saved / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    paths = study.VariantsExperiment().draw(config, data, tmp_path)
    pdfs = [p for p in paths if str(p).endswith(".pdf")]
    assert pdfs
    for pdf in pdfs:
        assert b"/CreationDate" not in Path(pdf).read_bytes(), pdf


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_a_cells_title_names_only_the_settings_it_uses(tmp_path):
    """One cell of the causal mask: its title names no window width and no sparse
    share (settings of masks it does not draw); the full grid names both."""
    from pathlib import Path

    import matplotlib.axes
    import matplotlib.figure

    titles = {}
    real = matplotlib.figure.Figure.suptitle, matplotlib.axes.Axes.set_title

    def record(real):
        def titled(self, t, *args, **kw):
            titles[name] = titles.get(name, "") + " " + t  # the figure's or a panel's
            return real(self, t, *args, **kw)
        return titled

    matplotlib.figure.Figure.suptitle = record(real[0])
    matplotlib.axes.Axes.set_title = record(real[1])
    try:
        for name in ("variants-one-cell", "variants"):
            saved = Path(__file__).parents[1] / "data" / "figures" / name
            config = study.VariantsExperiment().config(
                json.loads((saved / "config.json").read_text()))
            with np.load(saved / "data.npz") as f:
                data = {k: f[k] for k in f.files}
            (tmp_path / name).mkdir()
            study.VariantsExperiment().draw(config, data, tmp_path / name)
    finally:
        matplotlib.figure.Figure.suptitle, matplotlib.axes.Axes.set_title = real
    one, full = (" ".join(titles[n].split()) for n in ("variants-one-cell", "variants"))
    assert "window w" not in one and "sparse p" not in one, one
    assert "window w = 2" in full and "sparse p = 0.3" in full, full


def test_the_star_marks_the_cells_a_theorem_covers_not_their_row():
    """post · full with softmax is Theorem 4.1's; with sigmoid no theorem covers it:
    the ★ sits in the softmax cell alone (it marked the whole row)."""
    from jaxattn.experiments.variants_plot import _panel_grid

    base = {"tokens": 10, "dim": 3, "norm": "post", "mask": "full", "beta": 1.0,
            "final_E_median": 1e-3, "outcome": "slow", "reached": 0.0}
    rows = [base | {"kernel": "softmax", "theorem": "4.1"},
            base | {"kernel": "sigmoid", "theorem": "none"}]
    _, text = _panel_grid(rows, (10, 3), ["post"], ["full"], ["softmax", "sigmoid"], [1.0])
    assert list(text[0]) == ["…★", "…"]


def test_a_cell_a_theorem_covers_not_in_consensus_leaves_the_run_undecided(tiny_run,
                                                                          monkeypatch):
    """The verdict said "agrees" (exit 0) whatever the cells showed, with every covered
    cell not in consensus. A covered cell short of consensus at the last layer now
    leaves the run undecided (exit 4, "raise --layers"), and the line counts it."""
    folder, summary, data = tiny_run
    config = study.VariantsExperiment().config(json.loads((folder / "config.json").read_text()))
    assert study.VariantsExperiment().verdict(config, data).ok  # no cell a theorem covers
    rows = study.cell_rows(config, study._grid_of_data(data), data)
    covered = [r | {"kind": "theorem, not reached", "theorem": "4.1"} if i == 0 else r
               for i, r in enumerate(rows)]
    monkeypatch.setattr(study, "cell_rows", lambda *a: covered)
    verdict = study.VariantsExperiment().verdict(config, data)
    assert not verdict.ok and verdict.undecided == "1 cell a theorem covers not in consensus " \
        f"by layer {config.layers}: raise --layers"
    assert "1 a theorem covers NOT in consensus by the final depth" in verdict.line


def test_a_cells_median_of_two_instances_keeps_its_half():
    """Layers 5 and 8 read "6" (`:.0f` rounds 6.5 half to even), 19 and 20 "20"."""
    from jaxattn.experiments.variants_plot import _cell_text

    assert _cell_text({"outcome": "consensus", "consensus_layer_median": 6.5}) == "6.5"
    assert _cell_text({"outcome": "consensus", "consensus_layer_median": 7.0}) == "7"
    assert _cell_text({"outcome": "apart", "clusters_median": 2.5}) == "k2.5"


def test_a_theorem_judges_only_the_starts_in_its_domain():
    """Theorem 4.1 covers starts in an open hemisphere, which 2 of seeds 0–23's ten
    random tokens in R³ are (a linear program says so: 0 and 9). A cell was credited
    to the theorem, or held against it, over every start."""
    inside = study.in_domain((10, 3), 1, "full", 2, 0.3, 0, 24)
    x0 = np.stack([np.asarray(study.draw_instance(jax.random.PRNGKey(i), 10, 3, 1)[2])
                   for i in range(24)])
    np.testing.assert_array_equal(inside, ja.metrics.hemisphere(x0).inside)
    assert np.flatnonzero(inside).tolist() == [0, 9]
    config = study.VariantsExperiment().config(
        {"size": 1, "norm": 1, "mask": 1, "kernel": 1, "beta": 1.0, "instances": 4})
    grid = study.Grid.of(config)
    # only start 0, the one in the hemisphere, reaches consensus
    data = {"consensus_layer": np.array([20.0, np.inf, np.inf, np.inf]),
            "final_E": np.array([1e-12, 0.3, 0.3, 0.3]), "clusters": np.array([1, 2, 2, 2]),
            "residual": np.full(4, 0.1), "stalled": np.array([False, True, True, True]),
            "finite": np.ones(4, bool)}
    data = {k: v.reshape((1,) * 5 + (4,)) for k, v in data.items()}
    (row,) = study.cell_rows(config, grid, data)
    assert row["kind"] == "theorem" and row["in_domain"] == 0.25, row
    assert row["verdict"] == ("consensus, as Theorem 4.1 predicts (for the 1 of 4 starts in "
                              "its domain)")


def test_a_cells_command_gives_a_mask_setting_only_to_its_mask():
    """`--keep` and `--window` are refused for a run without their mask: a cell's
    command (in `table.csv`) carries each only for the mask it sets."""
    config = study.VariantsExperiment().config({"size": 1, "keep": 0.5, "window": 3})
    grid = study.Grid.of(config)
    commands = {mask: study.cell_command(config, grid, (0, 0, study.MASKS.index(mask), 0, 0))
                for mask in study.MASKS}
    assert "--keep 0.5" in commands["sparse"] and "--window 3" in commands["window"]
    assert not any(flag in commands[mask] for mask in ("full", "causal")
                   for flag in ("--keep", "--window"))
    assert "--window" not in commands["sparse"] and "--keep" not in commands["window"]
    for command in commands.values():  # each repeats its cell without a refusal
        args = command.split()[5:]
        overrides = dict(zip((a[2:].replace("-", "_") for a in args[::2]), args[1::2]))
        experiment_config(study.VariantsExperiment(), overrides, 0)
