"""Running experiments into run folders, and redrawing one.

`run_experiment` runs a named experiment (`jaxattn run NAME`) with its overrides
checked by `resolve_config` (each value by `convert`, the one typed check of a
parameter); `run_loop` (`jaxattn loop`) and `run_loop_grid` (`jaxattn loop
--grid`, the `loop-grid` experiment on any model) run the looped-model study of
`loop_grid.py`. All three write through the one writer, `_runs.write_run`.

These runners live here, not beside the experiments they run, because they read
the registry (`experiments/__init__.py`), which imports every experiment module.
"""

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._horizon import Horizon
from .._precision import check_precision
from .._runs import RunFolderError, open_run_folder, read_json, write_run
from .._validate import check_count
from ..models import loop
from ..models._run import WEIGHTS, check_ids
from . import EXPERIMENTS, get_experiment
from .base import AbstractExperiment, Param
from .loop_grid import (
    DTYPES,
    check_sizes,
    describe,
    get_model,
    grid_data,
    load_grid,
    prompt_ids,
    save_loop_figure,
    settings,
)


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


#: The largest seed `jax.random.PRNGKey` takes (a signed 64-bit integer).
MAX_SEED = 2**63 - 1
#: The most layers a discrete run takes (the int32 step counter of its scan).
MAX_LAYERS = 2**31 - 1


def check_seed(seed, name: str = "--seed", count: int = 1) -> int:
    """`seed` as a whole number ≥ 0 such that the `count` seeds `seed, seed + 1, …`
    fit JAX's 64-bit seeds, or a `ValueError`."""
    seed = check_count(seed, name)
    count = count if isinstance(count, int) and count > 1 else 1  # others: checked later
    if seed + count - 1 > MAX_SEED:
        raise ValueError(f"`{name}` must be at most {MAX_SEED - count + 1} "
                         f"(JAX's seeds are 64-bit integers), got {seed}.")
    return seed


def check_layers(config: dict[str, Any]) -> None:
    """Refuse a discrete run of more than `MAX_LAYERS` layers (`--horizon / --tau`)."""
    if not (config.get("discrete") and "tau" in config and "horizon" in config):
        return
    ratio = config["horizon"] / config["tau"]
    if not ratio < MAX_LAYERS:
        raise ValueError(f"--horizon {config['horizon']!r} with --tau {config['tau']!r} is "
                         f"{ratio:.3g} layers, more than {MAX_LAYERS}; choose a larger --tau "
                         "or a shorter --horizon.")
    Horizon(config["horizon"]).num_layers(config["tau"])  # its own checks


def resolve_config(experiment: AbstractExperiment, overrides: dict[str, Any], seed: int) -> dict:
    """The experiment's defaults with `overrides` applied and checked (each value, the
    seed's range and a discrete run's number of layers)."""
    params = {p.name: p for p in experiment.all_params()}
    config = experiment.defaults()
    for key, value in overrides.items():
        if key not in params:
            known = ", ".join(p.flag for p in params.values())
            raise ValueError(f"{experiment.name} has no parameter --{key}; it takes {known}.")
        config[key] = convert(params[key], value)
    check_layers(config)
    return {"experiment": experiment.name, "seed": check_seed(seed)} | config


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


def run_into_folder(
    experiment: AbstractExperiment,
    config: dict[str, Any],
    *,
    command: str | None,
    simulate: Callable[[], dict[str, np.ndarray]] | None = None,
    out=None,
    progress: bool = True,
    log: Callable[[str], object] | None = print,
) -> tuple[Path, dict]:
    """Run `experiment` with a checked `config` into a run folder (`_runs.write_run`).

    **Arguments:**

    - `command`: the command line that repeats the run, recorded in `config.json`
      and `summary.json` (`None`: not recorded).
    - `simulate`: computes the data (default `experiment.simulate(config, progress)`).
    - `out`, `progress`: the folder (default `runs/NAME/<timestamp>/`), a progress bar.
    - `log`: where the folder's name is announced (`None`: nowhere).

    **Returns:**

    The run folder and the summary: the verdict, its numbers (and `extra`
    entries), the simulation time and the figures.
    """
    noted = {} if command is None else {"command": command}

    def summarise(data, seconds):
        verdict = experiment.verdict(config, data)
        return {"experiment": experiment.name, "theorem": experiment.theorem,
                "verdict": verdict.line, "agrees_with_theory": verdict.ok,
                "numbers": verdict.numbers, "simulation_seconds": round(seconds, 2),
                **noted, **verdict.extra}

    return write_run(
        experiment.name, {"dtype": "float64"} | config | noted,
        simulate or (lambda: experiment.simulate(config, progress)),
        lambda data, folder: experiment.draw(config, data, folder), summarise, out=out,
        announce=None if log is None else lambda f: log(f"jaxattn run {experiment.name} → {f}"),
    )


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
    return run_into_folder(experiment, config, command=command_line(config, experiment),
                           out=out, progress=progress, log=log)


def run_loop(model, out=None, seed: int = 0, *, weights="trained", passes=20, ffn=True,
             prompts=100, tokens=200, dtype="float32", save_states=None,
             precision="float32") -> Path:
    """Loop `model` (a path, hub name, preset/config, or a model) and write a run folder:
    `config.json` (with the `dtype` and the `precision` of the matrix products),
    `data.npz` (`E` `(prompts, passes·L+1)`, the ids, saved states),
    `loop.png`/`loop.pdf` and `summary.json`. Returns the folder."""
    if weights not in WEIGHTS:
        raise ValueError(f"--weights must be one of {WEIGHTS}, got {weights!r}.")
    check_sizes(passes, prompts, tokens, dtype)
    check_precision(precision)
    seed = check_seed(seed)
    key = jax.random.PRNGKey(seed)
    net = get_model(model, weights, key)  # before the folder: a bad model leaves none
    ids = prompt_ids(net.config.vocab_size, prompts, tokens, seed)
    check_ids(net, ids)  # before the folder too: more tokens than positions leave none
    L = net.num_layers

    def compute():
        res = loop(net, ids, passes=passes, ffn=ffn, weights=weights, key=key,
                   dtype=DTYPES[dtype], save_states=save_states, precision=precision)
        E, states = res if save_states is not None else (res, None)
        data = {"E": np.asarray(jax.block_until_ready(E)), "ids": ids}
        if states is not None:
            data |= {"states": np.asarray(states, np.float32), "depths": np.asarray(save_states)}
        return data

    title = (f"{model}: {weights} weights, {'full blocks' if ffn else 'no FFN'}, "
             f"{prompts}×{tokens} tokens, {passes} passes")
    config = settings(model, net) | {
        "weights": weights, "passes": passes, "ffn": ffn, "prompts": prompts, "tokens": tokens,
        "dtype": dtype, "precision": precision, "seed": seed, "save_states": save_states}
    folder, _ = write_run(
        "loop", config, compute,
        lambda data, folder: save_loop_figure(data["E"], L, folder / "loop", title=title,
                                              variant="full" if ffn else "attn"),
        lambda data, seconds: describe(data["E"], L) | {
            "layers_per_pass": L, "seconds_per_pass_incl_compile": seconds / passes},
        out=out)
    return folder


def run_loop_grid(model, out=None, seed: int = 0, *, passes=20, prompts=100, tokens=200,
                  dtype="float32", weights=WEIGHTS, precision="float32") -> Path:
    """The `loop-grid` experiment (paper 001 Figs. 7–10) on any model: every weight
    kind in `weights` (trained, random, resample) with and without feed-forward blocks.

    Trained weights need a loadable model (a folder, .gguf, packaged or reachable
    hub name); with a preset/config only, pass `weights=("random", "resample")`.
    Writes `config.json` (with `dtype` and `precision`), `data.npz`
    (`E_<weights>_<attn|full>`, `ids`,
    `layers_per_pass`), `loop_grid.png/.pdf` and `summary.json` (the experiment's
    verdict, `layers_per_pass` and per-setting statistics); returns the folder.
    """
    experiment = get_experiment("loop-grid")
    check_sizes(passes, prompts, tokens, dtype)
    check_precision(precision)
    seed = check_seed(seed)
    weights = tuple(weights)
    nets, ids = load_grid(model, weights, prompts, tokens, seed)  # before the folder
    config = resolve_config(experiment, {"passes": passes, "prompts": prompts,
                                         "tokens": tokens}, seed)
    config |= settings(model, next(iter(nets.values()))) | {
        "weights": list(weights), "dtype": dtype, "precision": precision}
    folder, _ = run_into_folder(
        experiment, config, command=None, out=out, log=None,
        simulate=lambda: grid_data(nets, ids, seed, passes=passes, dtype=dtype,
                                   weights=weights, precision=precision))
    return folder


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
