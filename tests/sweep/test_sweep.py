"""`jaxattn sweep` / `ja.sweep`: a sweep killed with SIGKILL and resumed writes the
table of one left alone, byte for byte; specs are checked; instances are the
experiments' own draws; the table, sidecar, summary and figure are written."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxattn as ja
from jaxattn._artifacts.folders import RunFolderError
from jaxattn.experiments import experiment_config, get_experiment, paper
from jaxattn.sweep import _driver as _run
from jaxattn.sweep import _instances, _report

# Small enough to compile in seconds, long enough that a chunk takes a moment.
SMALL = {"horizon": 2.0, "saves": 20, "tokens": 6}
GRID = {"beta": [0.5, 1.0, 2.0]}


def _cli(*args, **kw):
    env = os.environ | {"MPLBACKEND": "Agg"}
    return subprocess.Popen([sys.executable, "-m", "jaxattn", "sweep", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _cli_args(out, *extra):
    args = ["thm41-sphere", "--instances", "12", "--chunk", "3", "--out", str(out),
            "--no-progress"]
    for k, v in GRID.items():
        args += ["--grid", f"{k}={','.join(map(str, v))}"]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    return args + list(extra)


@pytest.mark.slow
def test_killed_and_resumed_sweep_gives_the_same_table(tmp_path):
    """SIGKILL a real `jaxattn sweep` once its first chunk is saved, resume it, and
    compare with an uninterrupted sweep run in this process through `ja.sweep`."""
    out = tmp_path / "killed"
    proc = _cli(*_cli_args(out))
    chunks = out / "chunks"
    deadline = time.monotonic() + 300
    while not (chunks.exists() and any(chunks.glob("*.csv"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no chunk written within 300 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(chunks.glob("*.csv"))
    spec = ja.sweep.SweepSpec("thm41-sphere", GRID, instances=12, chunk=3)
    total = len(_run.plan(spec, ja.sweep.check_spec(spec)))
    print(f"killed after {len(done)} of {total} chunks")
    assert (out / "INCOMPLETE").exists() and not (out / "table.csv").exists()
    assert 1 <= len(done) < total, "the sweep was not killed mid-run"

    resumed = _cli(*_cli_args(out, "--resume"))
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 4, stderr  # horizon 2: every instance still converging
    assert f"{len(done)} of {total} chunks done" in stdout + stderr  # nothing redone
    assert not (out / "INCOMPLETE").exists()

    reference = ja.sweep("thm41-sphere", GRID, instances=12, chunk=3, set=SMALL,
                         out=tmp_path / "alone", progress=False, log=lambda *_: None)
    assert (out / "table.csv").read_bytes() == (reference.folder / "table.csv").read_bytes()
    table = reference.table
    assert len(table["point"]) == 3 * 12
    assert set(table) == {"beta", *ja.sweep.COLUMNS}
    # common random numbers: instance i is the same draw at every grid point
    np.testing.assert_array_equal(table["seed"], np.tile(np.arange(12), 3))
    assert np.all(table["solver_success"]) and np.all(table["in_domain"])
    print("median final E per β:", [np.median(table["final_E"][table["point"] == p])
                                    for p in range(3)])
    assert np.all(table["final_E"] < 0.5)  # contracted from random hemisphere starts
    assert np.all(np.isfinite(table["consensus_time"]) == table["outcome_reached"])
    # held exactly where the outcome was reached; elsewhere the trend decides: still
    # converging (undecided, empty) or stalled/reversed (false)
    held, status, reached = table["prediction_held"], table["status"], table["outcome_reached"]
    assert all((h is True) == r for h, r in zip(held, reached))
    assert all((s == "held") == r for s, r in zip(status, reached))
    assert set(status) <= {"held", "not_converged", "contradicted"}
    assert all(h is None for h, s in zip(held, status) if s == "not_converged")
    assert all(h is False for h, s in zip(held, status) if s == "contradicted")
    summary = reference.summary
    assert (summary["prediction_held"] + summary["not_converged"] + summary["contradicted"]
            == summary["in_domain"] == 36)
    assert summary["rows"] == 36 and summary["figures"] == ["sweep.png", "sweep.pdf"]
    sidecar = json.loads((reference.folder / "sweep.json").read_text())
    assert sidecar["spec"]["grid"] == GRID and sidecar["dtype"] == "float64"
    assert sidecar["tolerance"] == ja.metrics.CONSENSUS_TOL
    assert sidecar["versions"]["jax"] == jax.__version__
    assert (reference.folder / "sweep.png").stat().st_size > 10_000

    # resuming a finished sweep runs nothing and returns the same table
    again = ja.sweep("thm41-sphere", GRID, instances=12, chunk=3, set=SMALL,
                     out=reference.folder, resume=True, progress=False, log=lambda *_: None)
    np.testing.assert_array_equal(again.table["final_E"], table["final_E"])


def _fake_chunk(name, config, params, seeds, devices):
    """What `simulate_chunk` returns for `seeds`, without running them."""
    B = len(seeds)
    return {"E": np.ones((B, 3)), "ts": np.tile(np.arange(3.0), (B, 1)),
            "in_domain": np.ones(B, bool), "reached": np.zeros(B, bool),
            "success": np.ones(B, bool), "num_steps": np.full(B, 7)}


@pytest.mark.parametrize("long_sweep, said", [(-1, True), (3600, False)])
def test_a_long_sweep_says_how_long_after_its_first_chunk(tmp_path, monkeypatch, long_sweep,
                                                        said):
    """Past `LONG_SWEEP` seconds at its first chunk's pace, one line says how long is
    left and how to continue a stopped sweep; a short sweep says nothing of it."""
    spec = ja.sweep.SweepSpec("thm41-sphere", instances=4, chunk=2)
    configs = ja.sweep.check_spec(spec)
    monkeypatch.setattr(_run, "LONG_SWEEP", long_sweep)
    lines = []
    _run._run_chunks(tmp_path, spec, configs, ja.sweep.sweep_params("thm41-sphere"), [],
                     _run.plan(spec, configs), None, False, lines.append, _fake_chunk)
    pace = [line for line in lines if "at the first chunk's pace" in line]
    assert len(pace) == said and all(line.endswith("the same command and --resume")
                                     for line in pace), lines


def test_stale_partial_chunk_is_ignored(tmp_path):
    """A temporary file left by a kill during a write is removed; a chunk that does not
    fit the plan is recomputed, never trusted."""
    folder = tmp_path / "s"
    (folder / "chunks").mkdir(parents=True)
    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0]}, instances=4, chunk=2,
                            set={"horizon": 1.0, "saves": 5, "tokens": 3})
    configs = ja.sweep.check_spec(spec)
    header = _run._header(["beta"])
    (folder / "chunks" / ".00000.csv.abc.tmp").write_text("half")
    (folder / "chunks" / "00001.csv").write_text(",".join(header) + "\n1,2\n")
    calls = []

    def fake(name, config, params, seeds, devices):
        seeds = list(seeds)
        calls.append(seeds)
        B = len(seeds)
        return {"E": np.ones((B, 3)), "ts": np.tile(np.arange(3.0), (B, 1)),
                "in_domain": np.ones(B, bool), "reached": np.zeros(B, bool),
                "success": np.ones(B, bool), "num_steps": np.full(B, 7)}

    _run._run_chunks(folder, spec, configs, ja.sweep.sweep_params("thm41-sphere"), ["beta"],
                     _run.plan(spec, configs), None, False, lambda *_: None, fake)
    assert calls == [[0, 1], [2, 3]]
    assert not list((folder / "chunks").glob(".*.tmp"))
    table = _run._assemble(folder, ["beta"], _run.plan(spec, configs))
    np.testing.assert_array_equal(table["instance"], [0, 1, 2, 3])
    np.testing.assert_array_equal(table["num_steps"], [7] * 4)


def test_a_table_is_read_in_blocks_as_in_one(tmp_path, monkeypatch):
    """`load_table` reads blocks of `BLOCK_ROWS` lines: the columns are the same for any
    block size, undecided predictions are `None`, and a row of the wrong length is one
    line naming the file."""
    header = _run._header(["beta", "causal"])
    cells = [["0.5", "false", "0", str(i), str(i), "4.1", repr(i * 1e-17), "nan", "true",
              "false", ["", "true", "false"][i % 3], "true", str(7 + i),
              ["held", "failed"][i % 2]]
             for i in range(7)]
    lines = [",".join(header)] + [",".join(c) for c in cells]
    (tmp_path / "table.csv").write_text("\n".join(lines))  # no newline at the end
    whole = _run.load_table(tmp_path)
    assert whole["beta"].dtype == float and whole["causal"].dtype == bool
    assert whole["prediction_held"].tolist() == [None, True, False, None, True, False, None]
    assert whole["status"].tolist() == ["held", "failed"] * 3 + ["held"]
    np.testing.assert_array_equal(whole["num_steps"], np.arange(7, 14))
    monkeypatch.setattr(_run, "BLOCK_ROWS", 3)
    blocks = _run.load_table(tmp_path)
    for name in header:
        np.testing.assert_array_equal(blocks[name], whole[name], err_msg=name)
        assert blocks[name].dtype == whole[name].dtype, name
    (tmp_path / "table.csv").write_text(",".join(header) + "\n" + ",".join(cells[0][:-1]))
    with pytest.raises(RunFolderError, match="rows of other lengths"):
        _run.load_table(tmp_path)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("name", ja.sweep.SWEEPABLE)
def test_instances_are_the_experiments_draws_judged_by_the_theory(name):
    """Instance `i` is `jaxattn run NAME --seed i` drawn by the experiment's `setup` (for
    thm51-causal `--samples 1`, run in the span coordinates of its start), and the
    theorem's own tests (`ja.theory.theorem_test`) on the states the sweep runs give
    the verdicts of `ja.theory.predict` on the experiment's tokens."""
    small = {"thm51-causal": {"tokens": 4, "dim": 6, "samples": 1}}.get(name, {})
    experiment = get_experiment(name)
    config = experiment_config(experiment, small, 3) | {"beta": 1.0}
    dyn, y0, _ = experiment.instance(jax.random.PRNGKey(3), config)
    drawn, x0 = experiment.setup(jax.random.PRNGKey(3), config)
    if name == "thm51-causal":
        X0 = ja.normalize(x0[0])  # the sweep runs Y with x = Y X₀, on E_G, G = X₀X₀ᵀ
        np.testing.assert_array_equal(np.asarray(y0), np.eye(4))
        np.testing.assert_array_equal(np.asarray(dyn.W), np.asarray(X0 @ X0.T))
        model, x0, to_tokens = paper.causal_dynamics(drawn), x0[0], lambda y: y @ X0
    else:
        np.testing.assert_array_equal(np.asarray(y0), np.asarray(x0))
        np.testing.assert_array_equal(dyn.query_key(0.3), drawn.query_key(0.3))
        np.testing.assert_array_equal(dyn.U(0.3), drawn.U(0.3))
        model, to_tokens = drawn, lambda y: y
    pred = ja.theory.predict(model, x0)
    assert pred.theorem == experiment.theorem == _instances.theorem_of(name)
    test = ja.theory.theorem_test(experiment.theorem, dyn)
    inside, _ = jax.jit(lambda y: test.domain(y))(y0)
    assert bool(inside) == bool(pred.in_domain)
    finals = [y0, jnp.broadcast_to(y0[:1], y0.shape)]  # the start; all at the first token
    if name == "thm52-symmetric":
        finals.append(jnp.asarray(pred.limit))  # all at ±v₁
    verdicts = []
    for yT in finals:
        reached = jax.jit(lambda a, b: test.reached(a, b, 0.0, ja.metrics.CONSENSUS_TOL))(y0, yT)
        verdicts.append(bool(reached))
        assert verdicts[-1] == bool(pred.check(to_tokens(yT), 0.0))
    assert verdicts[0] is False and (name == "thm32-gradient" or verdicts[-1])


def test_spec_files_toml_and_json(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('experiment = "thm52-symmetric"\ninstances = 5\nseed = 2\n'
                    '[grid]\nbeta = [1, 2]\ndim = [3, 4]\n[set]\nhorizon = 3.5\n')
    spec = ja.sweep.read_spec(toml)
    configs = ja.sweep.check_spec(spec)
    assert [(c["beta"], c["dim"]) for c in configs] == [(1.0, 3), (1.0, 4), (2.0, 3), (2.0, 4)]
    assert all(c["horizon"] == 3.5 and c["seed"] == 2 for c in configs)
    js = tmp_path / "s.json"
    js.write_text(json.dumps({"experiment": "thm32-gradient",
                              "points": [{"beta": 1, "sphere": True}, {"beta": 4}]}))
    configs = ja.sweep.check_spec(ja.sweep.read_spec(js))
    assert [(c["beta"], c["sphere"]) for c in configs] == [(1.0, True), (4.0, False)]
    assert len(_run.plan(ja.sweep.SweepSpec("thm32-gradient", instances=10, chunk=4),
                          configs)) == 6


@pytest.mark.slow  # warm: over ~3 s (make test stays the fast loop)
def test_the_command_lines_grid_joins_a_spec_files(tmp_path, capsys):
    """`jaxattn sweep spec.toml --grid heads=1,2`: the file's β grid times the two
    head counts (the command line's grid once replaced the file's without a word)."""
    from jaxattn.cli import main

    toml = tmp_path / "s.toml"
    toml.write_text('experiment = "thm41-sphere"\ninstances = 1\n[grid]\nbeta = [0.5, 2]\n'
                    '[set]\nhorizon = 0.5\nsaves = 5\ntokens = 3\n')
    out = tmp_path / "joined"
    assert main(["sweep", str(toml), "--grid", "heads=1,2", "--out", str(out),
                 "--no-progress"]) == 4  # horizon 0.5: every instance still converging
    table = ja.sweep.load_table(out)
    assert sorted(zip(table["beta"], table["heads"])) == [(0.5, 1), (0.5, 2), (2.0, 1),
                                                          (2.0, 2)]


@pytest.mark.parametrize("spec, message", [
    (dict(experiment="thm99"), "unknown experiment"),
    (dict(experiment="thm41-sphere", grid={"gamma": [1]}), "no parameter 'gamma'"),
    (dict(experiment="thm41-sphere", grid={"samples": [1]}), "--instances"),
    (dict(experiment="thm41-sphere", grid={"beta": []}), "non-empty list"),
    (dict(experiment="thm41-sphere", grid={"beta": [1, 1]}), "repeats"),
    (dict(experiment="thm41-sphere", grid={"beta": [-1]}), "> 0"),
    (dict(experiment="thm41-sphere", grid={"heads": [1.5]}), "integer"),
    (dict(experiment="thm41-sphere", grid={"beta": ["x"]}), "number"),
    (dict(experiment="thm41-sphere", instances=0), "instances"),
    (dict(experiment="thm41-sphere", seed=-1), "seed"),
    (dict(experiment="thm41-sphere", grid={"beta": [1]}, points=[{"beta": 1}]), "not both"),
    (dict(experiment="thm41-sphere", set={"beta": 1}, grid={"beta": [1, 2]}),
     "beta is both fixed"),
    (dict(experiment="thm41-sphere", set={"tokens": 4}, points=[{"tokens": 5}]),
     "tokens is both fixed"),
    (dict(experiment="thm51-causal", set={"tokens": 9, "dim": 4}),
     r"--tokens \(9\) must be ≤ --dim \(4\)"),
    (dict(experiment="thm32-gradient", set={"sphere": "maybe"}), "true or false"),
    (dict(experiment="thm41-sphere", set={"horizon": 1e300}), r"past 2\*\*52"),
    (dict(experiment="thm41-sphere", grid={"tokens": [5, 300000]}),
     "--tokens 300000: the run's arrays need at least"),
    (dict(experiment="thm41-sphere", points=[{"tokens": 5}, {"tokens": 10**8}]),
     "--tokens 100000000: the run's arrays need at least"),
])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        ja.sweep.check_spec(ja.sweep.SweepSpec(**spec))


def test_bad_spec_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("experiment = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        ja.sweep.read_spec(bad)
    extra = tmp_path / "extra.json"
    extra.write_text('{"experiment": "thm41-sphere", "instance": 3}')
    with pytest.raises(ValueError, match="unknown key"):
        ja.sweep.read_spec(extra)
    with pytest.raises(ValueError, match="cannot read"):
        ja.sweep.read_spec(tmp_path / "missing.toml")


def test_ja_sweep_run_is_a_plain_function_and_the_old_spellings_alias_it():
    import inspect

    assert inspect.isfunction(ja.sweep.run) and ja.sweep.run is _run.run_sweep
    assert set(ja.sweep.SWEEPABLE) == {"thm41-sphere", "thm51-causal", "thm52-symmetric",
                                       "thm32-gradient"}
    assert ja.sweep.SWEEPABLE == ja.experiments.SWEEPABLE
    assert ja.sweep.EXPERIMENTS == ja.sweep.SWEEPABLE  # the older name
    assert callable(ja.sweep)  # the older spelling ja.sweep(...)
    for call in (ja.sweep.run, ja.sweep):
        with pytest.raises(ValueError, match="--resume needs --out"):
            call("thm41-sphere", resume=True)
        with pytest.raises(TypeError, match="SweepSpec"):
            call(42)


def test_existing_folder_needs_resume_and_the_same_spec(tmp_path, capsys):
    from jaxattn.cli import main

    out = tmp_path / "s"
    out.mkdir()
    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0]}, instances=2)
    (out / "sweep.json").write_text(json.dumps(
        {"spec": spec.to_json(), "points": ja.sweep.check_spec(spec), "dtype": "float64"}))
    (out / "INCOMPLETE").write_text("")
    assert main(["sweep", "thm41-sphere", "--grid", "beta=1", "--instances", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --resume" in err
    assert main(["sweep", "thm41-sphere", "--grid", "beta=2", "--instances", "2",
                 "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another spec" in err
    # the entry that differs is named, with both values (was: "another spec" alone)
    assert "with another spec entry 'grid' ({'beta': [1.0]}, not {'beta': [2.0]})" in err, err


@pytest.mark.slow
def test_sweep_outcome_matches_the_experiment_run(tmp_path):
    """Instance 0's final E equals that of `jaxattn run thm41-sphere` at the same size
    (the experiment restarts the solver at its pieces: close, not bitwise)."""
    from jaxattn.experiments import run_experiment

    overrides = {"horizon": 2.0, "saves": 20, "tokens": 6}
    _, summary = run_experiment("thm41-sphere", overrides, seed=0, out=tmp_path / "run",
                                progress=False, log=lambda *_: None)
    result = ja.sweep("thm41-sphere", {"beta": [1.0]}, instances=1, set=overrides,
                      out=tmp_path / "sweep", progress=False, log=lambda *_: None)
    np.testing.assert_allclose(result.table["final_E"][0], summary["numbers"]["final_E"],
                               rtol=1e-4)


def test_one_chunk_per_point_by_default():
    spec = ja.sweep.SweepSpec("thm41-sphere", GRID, instances=7)
    assert _run.plan(spec, ja.sweep.check_spec(spec)) == [(p, 0, 7) for p in range(3)]
    assert Path(_run._chunk_path(Path("f"), 12)).name == "00012.csv"


def test_chunks_fit_the_memory_and_a_sweep_too_large_for_it_is_refused(monkeypatch):
    """By default a chunk takes at most an eighth of the memory (whole blocks of
    `LANES`); a chunk asked for, or a table, that cannot fit is refused before any
    work, with the largest that fits."""
    lanes = _instances.LANES
    spec = ja.sweep.SweepSpec("thm41-sphere", instances=5 * lanes // 2)
    configs = ja.sweep.check_spec(spec)
    need = _instances.instance_bytes("thm41-sphere", configs[0])
    monkeypatch.setattr(_run, "machine_memory", lambda: 8 * (lanes + lanes // 4) * need)
    assert _run.plan(spec, configs) == [(0, 0, lanes), (0, lanes, 2 * lanes),
                                        (0, 2 * lanes, 5 * lanes // 2)]
    assert _run.plan(dataclasses.replace(spec, chunk=30), configs)[:2] == [(0, 0, 30),
                                                                          (0, 30, 60)]
    with pytest.raises(ValueError, match=rf"chunk = {20 * lanes} \(--chunk\).*\(at most "
                       rf"{8 * (lanes + lanes // 4)}\)"):
        _run.plan(dataclasses.replace(spec, instances=40 * lanes, chunk=20 * lanes), configs)
    from jaxattn.sweep import _spec

    monkeypatch.setattr(_spec, "machine_memory", lambda: 100 * _spec.TABLE_ROW_BYTES)
    ja.sweep.check_spec(ja.sweep.SweepSpec("thm41-sphere", GRID, instances=33))
    with pytest.raises(ValueError, match="3 points × 34 instances = 102 table rows.*at most 33"):
        ja.sweep.check_spec(ja.sweep.SweepSpec("thm41-sphere", GRID, instances=34))


def test_the_memory_estimate_counts_the_outputs_of_a_chunk():
    """`instance_bytes` is `PEAK_PER_OUTPUT` times the bytes an instance's outputs take
    (the figure the peak memory was measured against)."""
    sizes = {"horizon": 2.0, "saves": 1, "tokens": 4}  # as the sweep row test's program
    config = ja.sweep.check_spec(ja.sweep.SweepSpec("thm41-sphere", set=sizes))[0]
    out = _instances.simulate_chunk("thm41-sphere", config,
                                    ja.sweep.sweep_params("thm41-sphere"), [5, 6])
    outputs = sum(out[k][0].nbytes for k in ("E", "ts", "residual", "y0"))
    assert _instances.instance_bytes("thm41-sphere", config) == (
        _instances.PEAK_PER_OUTPUT * outputs)


def test_report_reads_the_tolerance_recorded_in_sweep_json(tmp_path, monkeypatch):
    """The figure's labels and threshold line show `sweep.json`'s tolerance, not a
    constant of the code."""
    (tmp_path / "sweep.json").write_text(json.dumps({"tolerance": 0.003}))
    table = {"point": np.array([0, 0, 1, 1]), "beta": np.array([1.0, 1.0, 2.0, 2.0]),
             "consensus_time": np.array([1.0, np.inf, 2.0, 3.0]),
             "final_E": np.array([1e-4, 0.1, 1e-5, 1e-6]),
             "in_domain": np.ones(4, bool), "prediction_held": np.array([True] * 4, object),
             "solver_success": np.ones(4, bool)}
    figures = []
    monkeypatch.setattr(_report, "save_figure", lambda fig, stem, title: figures.append(fig))
    _report.write_figure(tmp_path, ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0, 2.0]}),
                         ["beta"], table)
    ax_t, ax_e = figures[0].axes
    assert "E < 3e-3" in ax_t.get_ylabel()
    legend, = figures[0].legends  # one legend under both panels: each line is in both
    assert legend.get_texts()[0].get_text() == "3/4 reached E < 3e-3"
    assert ax_t.get_xlabel() == ax_e.get_xlabel() == "β"
    assert (0.003, 0.003) in [tuple(line.get_ydata()) for line in ax_e.lines]
    # the horizon (thm41's default T = 10): the "past T" marks above it, where a
    # reader would read them as times (they sat at 2.83 of an axis ending at 2.92 < T)
    assert (10.0, 10.0) in [tuple(line.get_ydata()) for line in ax_t.lines]
    assert ax_t.get_ylim()[1] > 10.0


def test_many_instances_are_drawn_faint_but_those_off_the_tolerance_in_full(tmp_path,
                                                                            monkeypatch):
    """Past `SCATTER_FULL` instances a point the final `E` under the tolerance are drawn
    fainter (a cloud, not a block), those above it as at any size: a rare one shows."""
    (tmp_path / "sweep.json").write_text(json.dumps({"tolerance": 1e-4}))
    n = 4 * _report.SCATTER_FULL
    E = np.full(n, 1e-10)
    E[7] = 0.1
    table = {"point": np.zeros(n, int), "beta": np.ones(n), "consensus_time": np.ones(n),
             "final_E": E, "in_domain": np.ones(n, bool),
             "prediction_held": np.array([True] * n, object), "solver_success": np.ones(n, bool)}
    figures = []
    monkeypatch.setattr(_report, "save_figure", lambda fig, stem, title: figures.append(fig))
    _report.write_figure(tmp_path, ja.sweep.SweepSpec("thm41-sphere", instances=n), ["beta"],
                         table)
    below, above = figures[0].axes[1].collections
    assert len(below.get_offsets()) == n - 1 and below.get_alpha() == pytest.approx(0.2)
    assert below.get_rasterized() and above.get_offsets()[:, 1].tolist() == [0.1]
    assert above.get_alpha() == 0.4 and above.get_sizes()[0] == 6


@pytest.mark.parametrize("name", ja.sweep.SWEEPABLE)
def test_every_sweep_parameter_is_an_override_of_jaxattn_run(name):
    """One parameter list serves both: a sweep varies exactly what `jaxattn run NAME
    --param v` takes (less `samples`, which its instances replace), `beta` included."""
    from jaxattn.cli.experiments import parse_overrides

    experiment = get_experiment(name)
    params = ja.sweep.sweep_params(name)
    assert [p.name for p in params] == [p.name for p in experiment.all_params()
                                        if p.name != "samples"]
    assert "beta" in [p.name for p in params]
    for p in params:
        value = True if p.type is bool else p.type(2 * p.default)
        argv = [p.flag] if p.type is bool else [p.flag, str(value)]
        _, overrides = parse_overrides(experiment, argv)
        assert overrides == {p.name: value}
        assert experiment_config(experiment, overrides, 0)[p.name] == value
        config = ja.sweep.check_spec(ja.sweep.SweepSpec(name, {p.name: [value]}))[0]
        assert config[p.name] == value


@pytest.mark.slow
def test_a_sweep_row_is_jaxattn_run_with_its_seed_and_values(tmp_path):
    """Instance 1 of a point with β = 2 is `jaxattn run thm41-sphere --seed 6 --beta 2`
    at the same sizes: the same start, in the domain alike, the same final E (one
    saved interval, so the experiment solves in one piece as the sweep does)."""
    from jaxattn.cli.experiments import parse_overrides
    from jaxattn.experiments import run_experiment

    sizes = {"horizon": 2.0, "saves": 1, "tokens": 4}
    result = ja.sweep("thm41-sphere", {"beta": [2.0]}, instances=2, seed=5, set=sizes,
                      out=tmp_path / "sweep", progress=False, log=lambda *_: None)
    _, overrides = parse_overrides(get_experiment("thm41-sphere"),
                                   "--beta 2 --horizon 2 --saves 1 --tokens 4".split())
    folder, summary = run_experiment("thm41-sphere", overrides, seed=6, out=tmp_path / "run",
                                     progress=False, log=None)
    row = {k: v[1] for k, v in result.table.items()}
    assert row["seed"] == 6 and row["beta"] == 2.0
    assert json.loads((folder / "config.json").read_text())["beta"] == 2.0
    np.testing.assert_allclose(row["final_E"], summary["numbers"]["final_E"], rtol=1e-9)
    with np.load(folder / "data.npz") as data:
        assert bool(row["in_domain"]) == bool(data["in_domain"])
    assert summary["command"] == ("jaxattn run thm41-sphere --seed 6 --tokens 4 --beta 2.0 "
                                  "--horizon 2.0 --saves 1")


def _two_point_table(key, values):
    return {"point": np.array([0, 0, 1, 1]), key: np.repeat(values, 2),
            "consensus_time": np.array([1.0, np.inf, 2.0, 3.0]),
            "final_E": np.array([1e-4, 0.1, 1e-5, 1e-6]), "in_domain": np.ones(4, bool),
            "prediction_held": np.array([True] * 4, object), "solver_success": np.ones(4, bool)}


@pytest.mark.parametrize(("key", "values", "noted"), [("heads", [1, 2], True),
                                                      ("heads", [2, 2], False),
                                                      ("beta", [1.0, 2.0], False)])
def test_a_sweep_over_heads_says_that_the_heads_are_summed(key, values, noted):
    """The heads are summed (U = I each): h heads move the tokens h times as fast, so a
    sweep whose grid varies `heads` says so under its table and in summary.json."""
    spec = ja.sweep.SweepSpec("thm41-sphere", {key: values})
    configs = [{key: v} for v in values]
    summary = _report.summarise(spec, configs, [key], _two_point_table(key, values))
    printed = _report.format_table(summary, [key])
    assert ("h heads move the tokens about h times as fast" in printed) is noted, printed
    assert summary["notes"] == ([get_experiment("thm41-sphere").grid_notes["heads"]]
                                if noted else [])


@pytest.mark.parametrize(("argv", "words"), [
    (["--instances", "0"], "`--instances` must be a whole number ≥ 1"),
    (["--set", "horizon=-1"], "--horizon must be > 0"),
    (["--grid", "beta=1,x"], "--beta must be a number"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_bad_value_is_refused_before_jax_loads(argv, words, tmp_path):
    """As `jaxattn run` does: the values are checked from the experiment's source,
    so the answer comes at once (JAX's import took ~19 s under load)."""
    code = ("import sys\nfrom jaxattn.cli import main\n"
            f"code = main(['sweep', 'thm41-sphere', *{argv!r}, '--out', {str(tmp_path / 'o')!r}])\n"
            "assert code == 2, code\nassert 'jax' not in sys.modules, 'JAX loaded'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "o").exists()


def test_the_host_domain_decides_as_the_callback_without_one(monkeypatch):
    """Theorem 4.1's domain of a chunk's instances is decided on the host, instance by
    instance, as the vmapped callback decides it, with no callback (a program that holds
    one is compiled again every run): half the starts in a hemisphere, half not, each
    instance with its own metric."""
    from jaxattn.sweep import _instances
    from jaxattn.theory import Theorem41Test

    rng = np.random.default_rng(0)
    A = rng.standard_normal((6, 3, 3))
    W = A @ A.transpose(0, 2, 1) + 3 * np.eye(3)
    x = rng.standard_normal((6, 5, 3))
    x[:3] = np.abs(x[:3])  # in the open orthant: inside a hemisphere of every metric
    x[3:, :3] = np.eye(3)
    x[3:, 3:] = -np.eye(3)[:2]  # ±e₁, ±e₂, e₃: in no open hemisphere
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    tests = Theorem41Test(W=jnp.asarray(W))
    reference = np.asarray(jax.vmap(lambda t, y: t.domain(y)[0])(tests, jnp.asarray(x)))
    assert reference.tolist() == [True] * 3 + [False] * 3

    def refuse(*args, **kwargs):
        raise AssertionError("a host callback in a program")

    monkeypatch.setattr(jax, "pure_callback", refuse)
    assert _instances._host_domain(tests, x).tolist() == reference.tolist()


def test_a_failed_solve_reports_no_E_nor_consensus_time():
    """A solve that failed measured nothing: its row's `final_E` and `consensus_time`
    are empty (NaN), not its last save's (a failed thm41 solve once read `E = 0`
    and "reached consensus"), and the point's statistics count only the others."""
    from jaxattn.sweep import _driver

    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0]}, instances=2)
    ts = np.linspace(0.0, 1.0, 5)
    E = np.array([[0.3, 0.1, 0.0, 0.0, 0.0], [0.3, 0.1, 1e-4, 1e-7, 1e-9]])
    out = {"E": E, "ts": np.stack([ts, ts]), "in_domain": [True, True],
           "reached": [True, True], "success": [False, True], "num_steps": [9, 9]}
    rows = _driver._rows(spec, {"beta": 1.0}, ["beta"], 0, 0, out, "4.1")
    header = _driver._header(["beta"])
    failed, solved = (dict(zip(header, row)) for row in rows)
    assert (failed["final_E"], failed["consensus_time"], failed["status"]) == (
        "nan", "nan", "solver_failed")
    assert float(solved["final_E"]) == 1e-9 and float(solved["consensus_time"]) > 0
    table = {"point": np.zeros(2, int), "final_E": np.array([np.nan, 1e-9]),
             "consensus_time": np.array([np.nan, 0.5]), "in_domain": np.ones(2, bool),
             "prediction_held": np.array([None, True], object),
             "solver_success": np.array([False, True]),
             "status": np.array(["solver_failed", "held"], object)}
    stats = _report.point_stats(table, 0)
    assert stats["reached_consensus"] == 1 and stats["final_E_max"] == 1e-9


def test_an_instance_larger_than_the_memory_is_refused_before_the_folder(tmp_path):
    """10⁹ tokens (96 GB an instance) once aborted inside XLA (a negative dimension)
    and left a locked, half-made folder: refused in one line, with no folder."""
    out = tmp_path / "big"
    with pytest.raises(ValueError, match=r"--tokens 1000000000: the run's arrays need at "
                       r"least .* more than this machine's memory") as info:
        ja.sweep("thm41-sphere", {"tokens": [10**9]}, instances=2, out=out, progress=False)
    assert "\n" not in str(info.value) and not out.exists()


def test_one_grid_value_far_from_zero_is_drawn(tmp_path, monkeypatch):
    """A grid of one value gets its own tick and finite limits: β = 1e308 broke
    matplotlib's ticks ("arange: cannot compute length") after the sweep had run."""
    (tmp_path / "sweep.json").write_text(json.dumps({"tolerance": 1e-4}))
    table = {"point": np.array([0, 0]), "beta": np.array([1e308, 1e308]),
             "consensus_time": np.array([np.inf, np.inf]), "final_E": np.array([0.1, 0.05]),
             "in_domain": np.ones(2, bool), "prediction_held": np.array([None, None], object),
             "solver_success": np.ones(2, bool)}
    figures = []
    monkeypatch.setattr(_report, "save_figure", lambda fig, stem, title: figures.append(
        (fig, title)))
    _report.write_figure(tmp_path, ja.sweep.SweepSpec("thm41-sphere", {"beta": [1e308]}),
                         ["beta"], table)
    fig, title = figures[0]
    fig.canvas.draw()  # the ticks are computed here
    ax_t, ax_e = fig.axes
    assert [t.get_text() for t in ax_e.get_xticklabels()] == ["1e+308"]
    assert np.all(np.isfinite(ax_e.get_xlim())) and "1 point ×" in title


def test_a_resumed_sweep_takes_an_explicit_default_and_its_saved_chunk(tmp_path, monkeypatch):
    """Resuming with a `--set` value the first run took by default (written `6` for
    `6.0`), and without the `--chunk` it gave, continues the saved sweep with its
    recorded spec and plan; a value that changes a point is still refused by name."""
    out = tmp_path / "s"
    first = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0, 2.0]}, set={"horizon": 2.0},
                               instances=4, chunk=2)
    monkeypatch.setattr(_run, "simulate_chunk", _fake_chunk)
    ja.sweep(first, out=out, progress=False, log=lambda *_: None)
    (out / "summary.json").unlink()  # as if killed before the end
    (out / "INCOMPLETE").write_text("")
    tokens = next(p.default for p in ja.sweep.sweep_params("thm41-sphere") if p.name == "tokens")
    again = ja.sweep("thm41-sphere", {"beta": [1.0, 2.0]}, set={"horizon": "2", "tokens": tokens},
                     instances=4, out=out, resume=True, progress=False, log=lambda *_: None)
    saved = json.loads((out / "sweep.json").read_text())
    assert saved["spec"] == first.to_json() and again.summary["rows"] == 8
    (out / "summary.json").unlink()
    (out / "INCOMPLETE").write_text("")
    with pytest.raises(RunFolderError, match="another spec entry 'set'"):
        ja.sweep("thm41-sphere", {"beta": [1.0, 2.0]}, set={"horizon": 2.0, "tokens": tokens + 1},
                 instances=4, out=out, resume=True, progress=False, log=lambda *_: None)


def test_consensus_time_quartiles_count_the_instances_that_never_reached_it(tmp_path):
    """An instance that never reached the tolerance (`inf`) is later than every one that
    did: with 11 of 32 reached, the median and upper quartile are past T (`>T` in the
    table), not the median of the 11; a failed solve (NaN) is left out."""
    from jaxattn._artifacts.folders import write_json

    reached = np.linspace(4.7, 4.9, 11)
    t = np.concatenate([reached, np.full(21, np.inf), [np.nan]])
    table = {"point": np.zeros(33, int), "consensus_time": t, "in_domain": np.ones(33, bool),
             "final_E": np.ones(33), "solver_success": np.r_[np.ones(32, bool), False],
             "prediction_held": np.array(["true"] * 11 + [""] * 22, object)}
    stats = _report.point_stats(table, 0)
    # linear quartiles of the 32 times with inf largest: position 7.75 of 0..31
    assert stats["consensus_time_q25"] == pytest.approx(np.quantile(reached, 7.75 / 10))
    assert np.isinf(stats["consensus_time_median"]) and np.isinf(stats["consensus_time_q75"])
    write_json(tmp_path / "s.json", {"points": [stats]})
    row = _report.format_table(json.loads((tmp_path / "s.json").read_text()), []).splitlines()[2]
    assert f">T [{stats['consensus_time_q25']:.3g}, >T]" in row
    few = {k: v[-12:] for k, v in table.items()} | {"consensus_time": np.r_[reached, np.nan]}
    assert _report.point_stats(few, 0)["consensus_time_median"] == np.median(reached)


@pytest.mark.parametrize("argv", [["--set", "tokens=100000000"], ["--set", "tokens=300000"],
                                  ["--grid", "tokens=5,300000"], ["--set", "horizon=1e300"],
                                  ["--set", "discrete=true", "--set", "tau=1e-300"]],
                         ids=" ".join)
def test_a_point_jaxattn_run_refuses_is_refused_in_its_words(argv, tmp_path, capsys):
    """Each point is checked as `jaxattn run` checks its instance, before any folder: 10⁸
    tokens once aborted inside XLA (SIGABRT, a half-made folder), 3 × 10⁵ ran out of
    memory in a traceback, and a horizon of 1e300 ran, every solve failing."""
    from jaxattn.cli import main

    out = tmp_path / "o"
    assert main(["sweep", "thm41-sphere", "--instances", "2", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    flags = {key: values.split(",")[-1]  # the refused point: the grid's last value
             for key, _, values in (t.partition("=") for t in argv[1::2])}
    flags["discrete"] = flags.get("discrete") == "true"
    with pytest.raises(ValueError) as run:  # what `jaxattn run` says for the same values
        experiment_config(get_experiment("thm41-sphere"), flags, 0)
    assert err.strip() == f"jaxattn sweep: error: {run.value}" and not out.exists(), err


@pytest.mark.parametrize("words", [("true", "false"), ("1", "0"), ("yes", "no"), ("on", "Off"),
                                   ("TRUE", " False ")])
def test_a_flag_takes_the_usual_spellings(words, monkeypatch, capsys):
    """`--set discrete=true` and `--grid discrete=true,false` were refused ("--discrete
    must be true or false, got 'true'"): a flag's value is read as the command line
    reads one (`parse_value`), before its check."""
    import jaxattn.sweep
    from jaxattn.cli import main

    seen = []

    def run(spec, grid, *, set, **kwargs):
        seen.append((ja.sweep.check_spec(dataclasses.replace(spec, grid=grid or {}, set=set or {})),
                     set))
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxattn.sweep, "run", run)
    on, off = words
    assert main(["sweep", "thm41-sphere", "--grid", f"discrete={on},{off}"]) == 130
    assert main(["sweep", "thm41-sphere", "--set", f"discrete={off}"]) == 130
    assert [c["discrete"] for c in seen[0][0]] == [True, False]
    assert seen[1][1] == {"discrete": False}
    assert main(["sweep", "thm41-sphere", "--set", "discrete=maybe"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--discrete must be true or false, got 'maybe'.")


@pytest.mark.parametrize(("statuses", "code", "words"), [
    (["held", "held"], 0, "verdict: "),
    (["held", "outside_domain"], 0, "verdict: "),
    (["held", "not_converged"], 4, "(undecided, 1 still converging at T: exit status 4)"),
    (["solver_failed", "solver_failed"], 4, "(undecided, 2 solver failed: exit status 4)"),
    (["not_converged", "contradicted"], 3, "(against the prediction: exit status 3)"),
])
def test_the_exit_status_says_what_the_table_says(statuses, code, words, tmp_path,
                                                  monkeypatch, capsys):
    """As `jaxattn run`: 3 when an instance contradicted its theorem, 4 when instances
    were left undecided (not converged, solver failed: every instance failing), else 0.
    A sweep exited 0 whatever its table said."""
    import jaxattn.sweep
    from jaxattn._artifacts.folders import write_json
    from jaxattn.cli import main

    n = len(statuses)
    table = {"point": np.zeros(n, int), "beta": np.ones(n), "consensus_time": np.ones(n),
             "final_E": np.ones(n), "in_domain": np.array([s != "outside_domain"
                                                           for s in statuses]),
             "prediction_held": np.array([s == "held" for s in statuses], object),
             "solver_success": np.array([s != "solver_failed" for s in statuses]),
             "status": np.array(statuses, object)}
    spec = ja.sweep.SweepSpec("thm41-sphere", {"beta": [1.0]}, instances=n)
    summary = _report.summarise(spec, [{"beta": 1.0}], ["beta"], table) | {"figures": []}
    write_json(tmp_path / "sweep.json", {"grid_keys": ["beta"]})
    monkeypatch.setattr(jaxattn.sweep, "run", lambda *a, **k: ja.sweep.SweepResult(
        tmp_path, table, summary))
    assert main(["sweep", "thm41-sphere", "--grid", "beta=1", "--out", str(tmp_path)]) == code
    assert words in capsys.readouterr().out
