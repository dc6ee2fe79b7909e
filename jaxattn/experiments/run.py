"""Running an experiment into a run folder, and redrawing one: `run_experiment`,
`redraw`, with the overrides checked by `resolve_config`."""

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._runs import (
    RunFolderError,
    create_run_folder,
    finish_run,
    open_run_folder,
    package_versions,
    read_json,
    save_npz,
    write_json,
)
from . import EXPERIMENTS, get_experiment
from .base import AbstractExperiment, Param, Verdict, stamp


def convert(param: Param, value: Any) -> Any:
    """`value` as the parameter's type, checked against its minimum, or a `ValueError`."""
    want = {int: "an integer", float: "a number", bool: "true or false"}[param.type]
    if param.type is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{param.flag} must be {want}, got {value!r}.")
    try:
        if isinstance(value, bool):
            raise TypeError
        converted = param.type(value)
        if param.type is int and isinstance(value, float) and value != converted:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{param.flag} must be {want}, got {value!r}.") from None
    if param.type is float and not math.isfinite(converted):
        raise ValueError(f"{param.flag} must be finite, got {value!r}.")
    if param.minimum is not None:
        too_small = converted < param.minimum if param.type is int else converted <= param.minimum
        if too_small:
            bound = f"≥ {param.minimum:g}" if param.type is int else f"> {param.minimum:g}"
            raise ValueError(f"{param.flag} must be {bound}, got {value!r}.")
    return converted


def resolve_config(experiment: AbstractExperiment, overrides: dict[str, Any], seed: int) -> dict:
    """The experiment's defaults with `overrides` applied and checked."""
    params = {p.name: p for p in experiment.all_params()}
    config = experiment.defaults()
    for key, value in overrides.items():
        if key not in params:
            known = ", ".join(p.flag for p in params.values())
            raise ValueError(f"{experiment.name} has no parameter --{key}; it takes {known}.")
        config[key] = convert(params[key], value)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"--seed must be an integer ≥ 0, got {seed!r}.")
    return {"experiment": experiment.name, "seed": int(seed)} | config


def command_line(config: dict, experiment: AbstractExperiment) -> str:
    """The `jaxattn run` command that repeats a run (every parameter spelled out)."""
    parts = ["jaxattn", "run", config["experiment"], "--seed", str(config["seed"])]
    for p in experiment.all_params():
        value = config[p.name]
        if p.type is bool:
            parts += [p.flag] if value else []
        elif value != p.default:
            parts += [p.flag, repr(value) if p.type is float else str(value)]
    return " ".join(parts)


def run_experiment(
    name: str,
    overrides: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    out=None,
    progress: bool = True,
    log=print,
) -> tuple[Path, dict]:
    """Run an experiment into a run folder (`runs/NAME/<timestamp>/` or `out`).

    Writes `config.json` first, then `data.npz`, the figures (PNG and PDF) and,
    last, `summary.json` with the verdict; the folder is marked `INCOMPLETE` until
    then. Bad names or overrides raise `ValueError` before anything is written.

    **Returns:**

    The run folder and the summary.
    """
    experiment = get_experiment(name)
    config = resolve_config(experiment, overrides or {}, seed)
    folder = create_run_folder(name, out)
    reproduce = command_line(config, experiment)
    write_json(folder / "config.json", config | {
        "command": reproduce, "dtype": "float64", "versions": package_versions(),
        "started": stamp(), "argv": sys.argv[1:],
    })
    log(f"jaxattn run {name} → {folder}")
    start = time.perf_counter()
    data = experiment.simulate(config, progress)
    elapsed = time.perf_counter() - start
    save_npz(folder / "data.npz", **data)
    figures = experiment.draw(config, data, folder)
    verdict: Verdict = experiment.verdict(config, data)
    summary = {
        "experiment": name, "theorem": experiment.theorem, "verdict": verdict.line,
        "agrees_with_theory": verdict.ok, "numbers": verdict.numbers,
        "simulation_seconds": round(elapsed, 2), "figures": [p.name for p in figures],
        "command": reproduce, "finished": stamp(),
    }
    finish_run(folder, summary)
    return folder, summary


def redraw(folder) -> list[Path]:
    """Draw a finished run's figures again from its `config.json` and `data.npz`."""
    folder = open_run_folder(folder)
    config = read_json(folder / "config.json")
    if not (folder / "data.npz").exists():
        raise RunFolderError(f"{folder} has no data.npz; it is not an experiment run.")
    if config.get("experiment") not in EXPERIMENTS:
        raise RunFolderError(f"{folder} was not made by `jaxattn run` (no known experiment).")
    experiment = EXPERIMENTS[config["experiment"]]
    with np.load(folder / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    return experiment.draw(config, data, folder)
