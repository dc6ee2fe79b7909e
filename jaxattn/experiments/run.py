"""Running experiments into run folders, and redrawing one.

`run_experiment` runs a named experiment (`jaxattn run NAME`) with its overrides
checked by `resolve_config` (each value by `convert`, the one typed check of a
parameter); `run_loop` (`jaxattn loop`) and `run_loop_grid` (`jaxattn loop
--grid`, the `loop-grid` experiment on any model) run the looped-model study of
`loop_grid.py`. All three write through the one writer, `_runs.write_run`.

These runners live here, not beside the experiments they run, because they read
the registry (`experiments/__init__.py`), which imports every experiment module.
"""

import hashlib
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from .._horizon import Horizon
from .._precision import check_precision
from .._runs import (
    RunFolderError,
    atomic_write,
    clear_partial_writes,
    finish_run,
    folder_path,
    hold_folder,
    open_run_folder,
    read_json,
    reopen_run,
    save_npz,
    write_run,
)
from .._validate import check_count
from ..models import tokenize
from ..models._run import WEIGHTS, check_ids, iterate_loop, setup_loop
from ..models._tokenize import read_prompts
from . import EXPERIMENTS, get_experiment
from .base import AbstractExperiment, Param
from .loop_grid import (
    DTYPES,
    check_sizes,
    describe,
    get_model,
    grid_data,
    is_loop_config,
    load_grid,
    loop_title,
    prompt_ids,
    redraw_loop,
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
             precision="float32", text=None, resume: bool = False, chunk_passes: int = 10,
             progress: bool = True, log=print) -> Path:
    """Loop `model` (a path, hub name, preset/config, or a model) and write a run folder:
    `config.json` (with the `dtype` and the `precision` of the matrix products),
    `data.npz` (`E` `(prompts, passes·L+1)`, the ids, saved states),
    `loop.png`/`loop.pdf` and `summary.json`. Returns the folder.

    The loop runs one pass at a time under a progress bar and streams to disk: every
    `chunk_passes` passes, `E` of those passes goes to `chunks/NNNNNN.npz` and the
    hidden state after them (the carry) to `chunks/carry.npz`, each written
    atomically. With `resume`, a folder whose run was killed continues from its last
    chunk, to the same `data.npz` as a run left alone (bit for bit on the CPU); its
    settings must be the same. At the end the chunks are gathered into `data.npz`
    and removed.

    **Arguments:**

    - `text`: a file of prompts, one per line, tokenized with the model's own
      tokenizer (`ja.models.tokenize`, `tokens` per prompt) in place of `prompts`
      random ids; `model` must then name a folder, file or packaged model.
    - `resume`: continue the loop in `out` (needs `out`); a finished one is left as it is.
    - `chunk_passes`: passes per saved chunk (what a kill can lose).
    - `progress`, `log`: a progress bar (passes, time left); where messages go
      (`None`: nowhere).
    """
    log = log or (lambda line: None)
    if weights not in WEIGHTS:
        raise ValueError(f"--weights must be one of {WEIGHTS}, got {weights!r}.")
    if resume and out is None:
        raise ValueError("--resume needs --out DIR: the folder of the loop to continue.")
    check_sizes(passes, prompts, tokens, dtype)
    check_count(chunk_passes, "--chunk-passes", 1)
    check_precision(precision)
    seed = check_seed(seed)
    key = jax.random.PRNGKey(seed)
    net = get_model(model, weights, key)  # before the folder: a bad model leaves none
    ids, source = loop_prompts(model, net, prompts, tokens, seed, text)
    check_ids(net, ids)  # before the folder too: more tokens than positions leave none
    setup = setup_loop(net, ids, passes=passes, ffn=ffn, weights=weights, key=key,
                       dtype=DTYPES[dtype], save_states=save_states, precision=precision)
    config = settings(model, net) | {
        "weights": weights, "passes": passes, "ffn": ffn, "prompts": int(ids.shape[0]),
        "tokens": int(ids.shape[1]), "dtype": dtype, "precision": precision, "seed": seed,
        "save_states": save_states, "chunk_passes": chunk_passes} | source
    with hold_folder(folder_path("loop", out), "run") as folder:
        finished, run_id = reopen_run(folder, config, resume, what="loop", command="loop")
        if finished:
            log(f"{folder} holds this loop, finished; nothing to run")
            return folder
        seconds = stream_loop(folder, setup, chunk_passes, progress, log)
        data = gather_loop(folder, setup, ids)
        save_npz(folder / "data.npz", **data)
        L = net.num_layers
        figures = save_loop_figure(data["E"], L, folder / "loop", title=loop_title(config),
                                   variant="full" if ffn else "attn")
        summary = describe(data["E"], L) | {
            "layers_per_pass": L, "seconds_per_pass_incl_compile": seconds / passes}
        finish_run(folder, summary, figures=figures, seconds=seconds, run_id=run_id)
        shutil.rmtree(folder / "chunks", ignore_errors=True)
    return folder


def loop_prompts(model, net, prompts: int, tokens: int, seed: int, text):
    """The ids a loop runs, `(prompts, tokens)` random ones or the lines of the file
    `text` tokenized, and what `config.json` records of them."""
    if text is None:
        return prompt_ids(net.config.vocab_size, prompts, tokens, seed), {}
    lines = read_prompts(text)
    ids = tokenize(model, lines, tokens=tokens)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return ids, {"text": str(text), "text_sha256": digest}


def _chunk_file(folder: Path, start: int) -> Path:
    return folder / "chunks" / f"{start:06d}.npz"


def _save_carry(folder: Path, x, done: int, seconds: float) -> None:
    """The hidden state after `done` passes, byte for byte (bfloat16 included)."""
    x = np.ascontiguousarray(np.asarray(x))
    arrays = {"x": x.reshape(-1).view(np.uint8), "shape": np.asarray(x.shape),
              "dtype": np.asarray(str(x.dtype)), "done": np.asarray(done),
              "seconds": np.asarray(seconds)}
    atomic_write(folder / "chunks" / "carry.npz", lambda f: np.savez(f, **arrays))


def _load_carry(folder: Path):
    """`(passes done, x, seconds)` of a stopped loop, or `(0, None, 0.0)`."""
    path = folder / "chunks" / "carry.npz"
    if not path.exists():
        return 0, None, 0.0
    with np.load(path) as f:
        x = f["x"].view(jax.numpy.dtype(str(f["dtype"]))).reshape(tuple(f["shape"]))
        return int(f["done"]), jax.numpy.asarray(x), float(f["seconds"])


def stream_loop(folder: Path, setup, chunk_passes: int, progress: bool, log) -> float:
    """Run the loop from its last saved chunk (none: from the start), one pass at a
    time, saving `E` (and the states reached) every `chunk_passes` passes and then
    the carry. Returns the computing seconds of every session together."""
    (folder / "chunks").mkdir(exist_ok=True)
    clear_partial_writes(folder / "chunks")
    done, x, seconds = _load_carry(folder)
    if done:
        log(f"resuming {folder}: {done} of {setup.passes} passes done")
    values, states, index, lo = [], [], [], done
    with tqdm(total=setup.passes, initial=done, unit="pass", desc="loop", smoothing=0.1,
              disable=not progress) as bar:
        start = time.perf_counter()
        for seg in iterate_loop(setup, start=done, x=x):
            values.append(np.asarray(seg.values))
            states.append(np.asarray(seg.states)[:, seg.hit])
            index.append(np.flatnonzero(seg.hit))
            bar.update(seg.stop - seg.start)
            if seg.stop == setup.passes or (seg.stop and seg.stop % chunk_passes == 0):
                spent = seconds + time.perf_counter() - start
                save_npz(_chunk_file(folder, lo), E=np.concatenate(values, axis=1),
                         states=np.concatenate(states, axis=1), index=np.concatenate(index))
                _save_carry(folder, seg.x, seg.stop, spent)
                values, states, index, lo = [], [], [], seg.stop
    return seconds + time.perf_counter() - start


def gather_loop(folder: Path, setup, ids) -> dict[str, np.ndarray]:
    """The chunks of a finished loop as `data.npz`'s arrays: `E`, `ids` and, when
    asked for, `states` and `depths`."""
    chunk_passes = read_json(folder / "config.json")["chunk_passes"]
    starts = range(0, setup.passes, chunk_passes)
    missing = [s for s in starts if not _chunk_file(folder, s).exists()]
    if missing:
        raise RunFolderError(f"{folder} lacks the chunk of passes from {missing[0]}; "
                             "its chunks do not fit its config.json (re-run it).")
    parts = [np.load(_chunk_file(folder, s)) for s in starts]
    E = np.concatenate([p["E"] for p in parts], axis=1)
    data = {"E": E, "ids": np.asarray(ids)}
    depths = setup.options["depths"]
    if depths:  # each chunk's states, with their places in `depths`
        found = np.concatenate([p["states"] for p in parts], axis=1)
        states = np.empty_like(found)
        states[:, np.concatenate([p["index"] for p in parts])] = found
        data |= {"states": states.astype(np.float32), "depths": np.asarray(depths)}
    return data


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
    """Draw a finished run's figures again from its `config.json` and `data.npz`:
    a `jaxattn run NAME` folder (`loop --grid` included: it is the `loop-grid`
    experiment) or a `jaxattn loop` folder. A sweep folder is `ja.sweep.redraw`'s;
    `jaxattn plot DIR` takes both. Any other folder: `RunFolderError`, one line.

    **Returns:**

    The paths of the figures written.
    """
    folder = open_run_folder(folder)
    config = read_json(folder / "config.json")
    if not (folder / "data.npz").exists():
        raise RunFolderError(f"{folder} has no data.npz; it holds no data to draw.")
    with np.load(folder / "data.npz") as f:
        data = {k: f[k] for k in f.files}
    if config.get("experiment") in EXPERIMENTS:
        return EXPERIMENTS[config["experiment"]].draw(config, data, folder)
    if is_loop_config(config) and "E" in data:
        return redraw_loop(config, data, folder)
    raise RunFolderError(f"{folder} was not made by `jaxattn run`, `jaxattn loop` or "
                         "`jaxattn sweep` (its config.json names no known experiment).")
