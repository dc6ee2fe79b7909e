"""Every registered experiment at the bounds of its parameters: a result or a
one-line refusal before any work, never a traceback. Sizes that cannot fit in the
machine's memory are refused in one line naming the flag and the memory, before a
folder is made (`runner.check_sizes`)."""

import json
import math
import os
import random
import sys
import time
from datetime import date
from pathlib import Path

import pytest

from jaxattn.cli import main
from jaxattn.experiments import EXPERIMENTS, experiment_config, get_experiment, runner

FIGURES = Path(__file__).parents[1] / "data" / "figures"
# the small saved runs of test_figures.py: each experiment's quick settings
RUN_KEYS = ("dtype", "experiment", "seed", "command", "model", "weights", "precision",
            "layers_per_pass")


def small_config(name: str) -> dict:
    folder = FIGURES / ("variants-one-cell" if name == "variants" else name)
    config = json.loads((folder / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in RUN_KEYS}


def _refused_in_one_line(capsys, argv) -> str:
    start = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert time.monotonic() - start < 30, argv
    return lines[0]


TOO_BIG = [
    ("noisy-transition", "--tokens", "1000000000"),
    ("noisy-transition", "--tokens", "20000000"),  # its sweeps' states: 30 GB in float32
    ("antipodal", "--runs", "1000000000000"),
    ("thm41-sphere", "--tokens", "100000000"),
    ("thm41-sphere", "--saves", "100000000"),
    ("long-context", "--n-max", "1000000000"),
    ("phase-diagram", "--systems", "1000000000"),
    # sizes the memory check let through, each then out of memory: an allocation it
    # could not make (XLA's RESOURCE_EXHAUSTED), or killed by the system
    ("thm32-gradient", "--saves", "21063758"),
    ("metastability", "--saves", "40000000"),
    ("adversarial-weights", "--saves", "52659396"),
    ("conjecture-multihead", "--saves", "70212528"),
    ("phase-diagram", "--systems", "219414"),
    ("thm51-causal", "--dim", "31595"),
    ("thm41-sphere", "--saves", "40000000"),
    ("thm41-sphere", "--saves", "21063758"),  # killed at 24 GB: 37 GB, its arrays summed
    ("thm52-symmetric", "--saves", "40000000"),
    ("adversarial-tokens", "--causal-tokens", "98736"),
    ("conjecture-bipartite", "--layers", "70212528"),
    ("oja-bipartite", "--instances", "200000000"),  # its draws alone: 52 GB
]


def _no_work(*args, **kwargs):
    raise AssertionError("the run started")


@pytest.mark.parametrize(("name", "flag", "value"), TOO_BIG, ids=lambda v: str(v))
def test_sizes_that_cannot_fit_are_refused_before_a_folder(capsys, tmp_path, monkeypatch,
                                                           name, flag, value):
    monkeypatch.chdir(tmp_path)  # the default folder would be runs/NAME/… here
    monkeypatch.setattr(runner, "machine_memory", lambda: 32 * 10**9)  # the machine
    monkeypatch.setattr(runner, "run_into_folder", _no_work)
    line = _refused_in_one_line(capsys, ["run", name, flag, value, "--out",
                                         str(tmp_path / "out")])
    assert flag in line and "this machine's memory (32 GB)" in line, line
    assert list(tmp_path.iterdir()) == [], line


def test_a_run_out_of_memory_is_one_line_naming_its_sizes(capsys, tmp_path, monkeypatch):
    """What the estimate lets through and XLA cannot allocate: one line, not a
    traceback, with the flags that size the run's arrays."""
    import jax

    def out_of_memory(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory allocating 50553022544 bytes.")

    monkeypatch.setattr(runner, "run_into_folder", out_of_memory)
    line = _refused_in_one_line(capsys, ["run", "thm32-gradient", "--out",
                                         str(tmp_path / "out")])
    assert line.startswith("jaxattn run: error: the computation ran out of memory: it asked "
                           "for 50.6 GB at once, on a machine of "), line
    assert line.endswith("; choose smaller sizes (--saves, --tokens, --dim)."), line


def test_counts_past_int32_are_refused_by_name(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_into_folder", _no_work)
    line = _refused_in_one_line(capsys, ["run", "adversarial-tokens", "--steps", str(2**31),
                                         "--out", str(tmp_path / "out")])
    assert "--steps 2147483648" in line and "int32" in line, line
    assert not (tmp_path / "out").exists()


def test_the_memory_check_names_the_machine_and_passes_the_defaults():
    memory = runner.machine_memory()
    assert memory > 2**30  # the system reports it
    for name, experiment in EXPERIMENTS.items():
        runner.check_sizes(name, experiment.defaults())  # every default run fits
        assert name in runner.FOOTPRINT, name  # every member is estimated
        for entry in runner.FOOTPRINT[name]:
            for product in runner.held_at_once(entry):
                assert all(isinstance(f, int) or f in experiment.defaults() for f in product)
    with pytest.raises(ValueError, match=r"--tokens 1000000000, --max-dim 3, --seeds 1: .* "
                                         r"3.02 TB, more than this machine's memory \(100 GB\)"):
        runner.check_sizes("noisy-transition", {**EXPERIMENTS["noisy-transition"].defaults(),
                                                "tokens": 10**9}, memory=10**11)


def _bounds(name: str):
    """(parameter, value) at each declared bound: an int's minimum, and the smallest
    float accepted above a float's (exclusive) minimum (the next float, or above 0 the
    smallest normal one: a subnormal value is refused, XLA flushes it to 0)."""
    for p in get_experiment(name).all_params():
        if p.minimum is None or p.type is bool:
            continue
        above = max(math.nextafter(p.minimum, math.inf), sys.float_info.min) \
            if p.minimum == 0 else math.nextafter(p.minimum, math.inf)
        yield p.name, p.minimum if p.type is int else above


ALL_CASES = [(name, key, value) for name in EXPERIMENTS for key, value in _bounds(name)]


#: The registered experiments split in this many groups, one a day.
GROUPS = 3


def daily_cases(day: int) -> list:
    """One bound of each experiment in the day's group (every `GROUPS`-th experiment),
    each drawn afresh: `GROUPS` days cover every registered experiment, and the days
    go on to cover every bound."""
    draw = random.Random(day)
    return [draw.choice([c for c in ALL_CASES if c[0] == name])
            for i, name in enumerate(EXPERIMENTS) if i % GROUPS == day % GROUPS]


#: Every experiment at each of its bounds is ~180 small runs (about an hour on 2 cores,
#: each compiles its experiment's programs): CI runs one bound of a third of the
#: experiments, a different draw each day (JAXATTN_BOUNDS_DAY repeats a day's draw),
#: and JAXATTN_ALL_BOUNDS=1 runs all.
CASES = ALL_CASES if os.environ.get("JAXATTN_ALL_BOUNDS") else daily_cases(
    int(os.environ.get("JAXATTN_BOUNDS_DAY", date.today().toordinal())))


def _run_or_refuse(name: str, key: str, value, out: Path) -> None:
    """A summary, or a ValueError of one line raised before the folder exists."""
    overrides = small_config(name) | {key: value}
    try:
        config = experiment_config(get_experiment(name), overrides, 0)
    except ValueError as e:
        assert "\n" not in str(e) and not out.exists(), (name, key, value, str(e))
        return
    try:
        folder, summary = runner.run_into_folder(get_experiment(name), config, command=None,
                                                 out=out, progress=False, log=None)
    except ValueError as e:  # refused by the experiment's own check, before any work
        assert "\n" not in str(e) and not (out / "data.npz").exists(), (name, key, str(e))
        return
    assert isinstance(summary["verdict"], str) and summary["verdict"], (name, key)


@pytest.mark.slow  # small runs: a third of the experiments a day (CASES)
@pytest.mark.parametrize(("name", "key", "value"), CASES, ids=lambda v: str(v))
def test_every_experiment_at_each_smallest_value(tmp_path, name, key, value):
    import jax

    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", name not in ("loop-grid",))
    try:
        _run_or_refuse(name, key, value, tmp_path / "out")
    finally:  # the rest of this worker's tests run as the suite set them
        jax.config.update("jax_enable_x64", before)


def test_the_daily_draws_cover_every_experiment_and_every_bound():
    """`GROUPS` days in a row run every registered experiment; 400 days every bound."""
    seen = set()
    for day in range(400):
        cases = daily_cases(day)
        assert len({c[0] for c in cases}) == len(cases)  # one bound per experiment
        seen.update(cases)
        if day == GROUPS - 1:
            assert {c[0] for c in seen} == set(EXPERIMENTS)
    assert seen == set(ALL_CASES)


# What the slow property test found; here, fast, as refusals before any work.
REFUSED_EARLY = [
    ("equiangular", "saves", 1, "--saves"),
    ("noisy-transition", "tau", 2.3e-308, "--tau"),
    ("noisy-transition", "sweep_tau", 2.3e-308, "--sweep-tau"),
    ("norm-beta", "step", 2.3e-308, "--step"),
    ("phase-diagram", "beta_min", 1e6, "--beta-min"),
    ("antipodal", "tau", 2.3e-308, "--tau"),
    ("thm41-sphere", "tau", 5e-324, "subnormal"),
    # one layer past the horizon: judged at t = τ, 20 times the horizon
    ("thm41-sphere", "tau", 20.0, "--tau 20 is longer than --horizon"),
    ("antipodal", "tau", 0.6, "--tau"),
    ("hardmax", "tau", 2.0, "--tau"),
    ("steer", "std", 1e-30, "--std"),
    # these ran: a gap no ‖U‖₂ ≤ 1 can keep (the search broke the bound by 3 and agreed),
    # Fig. 13 at an unstable radius, or at one no q in [0, 10] gives (silently another)
    ("adversarial-weights", "gap", 1.5, "--gap 1.5 cannot be kept with --u-bound 1"),
    ("oja-bipartite", "radius", 1.5, "--radius must be < 1"),
    ("oja-bipartite", "radius", 0.5, "--radius 0.5 is out of reach at --tau 1"),
]


@pytest.mark.parametrize(("name", "key", "value", "flag"), REFUSED_EARLY, ids=lambda v: str(v))
def test_what_a_verdict_cannot_judge_is_refused_before_work(tmp_path, name, key, value, flag):
    with pytest.raises(ValueError, match=flag) as info:
        experiment_config(get_experiment(name), small_config(name) | {key: value}, 0)
    assert "\n" not in str(info.value)


def test_a_resumed_run_records_the_command_of_the_uninterrupted_one():
    experiment = get_experiment("variants")
    config = experiment_config(experiment, small_config("variants") | {"resume": True}, 3)
    line = runner.command_line(config, experiment)
    assert "--resume" not in line
    assert line == runner.command_line(config | {"resume": False}, experiment)


@pytest.mark.parametrize("argv", [["run", "thm41-sphere", "--horizon", "1e308"],
                                  ["run", "metastability", "--horizon", "1e16"]],
                         ids=lambda a: a[1])
def test_a_horizon_no_step_can_advance_is_refused_before_a_folder(capsys, tmp_path,
                                                                   monkeypatch, argv):
    monkeypatch.setattr(runner, "run_into_folder", _no_work)
    line = _refused_in_one_line(capsys, [*argv, "--out", str(tmp_path / "out")])
    assert "--horizon" in line and "2**52" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_negative_infinity_is_read_as_a_value(capsys, tmp_path, monkeypatch):
    """`--beta -inf` gets the value's own check (as `--beta inf`), not argparse's
    "expected one argument"."""
    monkeypatch.setattr(runner, "run_into_folder", _no_work)
    for value, words in (("-inf", "must be finite"), ("inf", "must be finite"),
                         ("-1e3", "must be > 0")):
        line = _refused_in_one_line(capsys, ["run", "thm41-sphere", "--beta", value,
                                             "--out", str(tmp_path / "out")])
        assert f"--beta {words}" in line, line


def test_a_preset_records_what_it_sets_and_refuses_a_flag_it_overrides(capsys, tmp_path,
                                                                      monkeypatch):
    """noisy-transition --full: config.json records the settings the run uses (n =
    4000, τ = 0.01, 23 couplings), and --tokens beside --full is refused by name."""
    from jaxattn.experiments import noisy_transition

    experiment = get_experiment("noisy-transition")
    config = experiment_config(experiment, {"full": True}, 0)
    for key, value in noisy_transition.FULL.items():
        assert config[key] == value, key
    assert noisy_transition.settings(config) == config  # what runs is what is recorded
    line = runner.command_line(config, experiment)  # which repeats the run
    assert line == "jaxattn run noisy-transition --seed 0 --full", line
    monkeypatch.setattr(runner, "run_into_folder", _no_work)
    line = _refused_in_one_line(capsys, ["run", "noisy-transition", "--full", "--tokens", "10",
                                         "--out", str(tmp_path / "out")])
    assert "--full sets --tokens itself (tokens 4000)" in line, line
    assert list(tmp_path.iterdir()) == []
    # a trained model has its own width: --hidden beside it was ignored, yet recorded
    line = _refused_in_one_line(capsys, ["run", "steer", "--minilm", "--hidden", "128",
                                         "--out", str(tmp_path / "out")])
    assert "--minilm sets --hidden itself (hidden 0)" in line, line
    assert list(tmp_path.iterdir()) == []
