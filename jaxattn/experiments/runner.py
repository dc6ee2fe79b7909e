"""Running an experiment into a run folder: `run_experiment` (`jaxattn run NAME`), its
overrides checked by `experiment_config` (each value by `convert`), through the one
writer of run folders (`write_run`).
"""

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._artifacts.folders import folder_path, write_run
from .._process.distributed import agree, is_writer
from .._validate import check_seed, machine_memory, too_big
from . import REGISTRY, get_experiment
from .base import AbstractExperiment, Config, convert

#: The most layers a discrete run takes (the int32 step counter of its scan).
MAX_LAYERS = 2**31 - 1

#: The largest count any parameter takes: JAX sizes and indexes arrays and loops
#: with int32.
MAX_COUNT = 2**31 - 1

#: The longest horizon: past 2⁵², consecutive float64 times are more than 1 apart, so a
#: step of the dynamics' unit time cannot advance the clock (the solver stalls).
MAX_HORIZON = 2.0**52

#: The arrays a run holds at once, as products of its parameters (names, or constant
#: factors), in float64 values: the trajectories it saves (saves × tokens × dim, on
#: the device and again on the host), its ensembles (runs, systems, restarts, prompts
#: of tokens). Each product is checked on its own; a list of them is arrays held at
#: once, checked by their sum. A lower bound, from measured allocations and peak
#: memory (BENCHMARKS.md, "Measured claims"), enough to refuse a run that cannot fit
#: before it starts.
FOOTPRINT: dict[str, tuple[tuple[str | int, ...] | list[tuple[str | int, ...]], ...]] = {
    # peak memory a save: 95 n + 9.6 n² bytes (--saves 526,594 → 2,106,376 at n = 10,
    # n = 10 → 40 at 263,297 saves)
    "thm41-sphere": ([("saves", "tokens", 3, 4), ("saves", "tokens", "tokens")], ("heads", 3, 3)),
    # 155 B per dim² at 2 heads (peak memory, --dim 500 → 1500)
    "thm51-causal": (("saves", "tokens", "dim", 2), ("samples", "tokens", "dim"),
                     ("heads", "dim", "dim", 9)),
    "thm52-symmetric": (("saves", "tokens", "dim", 4),),  # measured 974 B a save at n = 10
    "thm32-gradient": (("saves", "tokens", "dim", 2), ("saves", "tokens", "tokens", "dim")),
    "adversarial-tokens": (("restarts", "tokens", "dim"), ("saves", "tokens", "dim"),
                           ("restarts", "causal_tokens", "dim"),
                           ("causal_tokens", "causal_tokens", 2)),  # 2.6 floats a pair
    # the searches hold 16 floats a restart, save and token at d = 3 (8: any d ≥ 2)
    "adversarial-weights": (("restarts", "tokens", "dim"), ("restarts", "saves", "tokens", 8)),
    "conjecture-multihead": (("restarts", "tokens", "dim"), ("restarts", "saves", "tokens", 8)),
    "conjecture-bipartite": (("restarts", "tokens", "dim"),  # 7.3 floats a layer, token, dim
                             ("layers", "tokens", "dim", 7)),
    # GPT-2's hidden states, four float32 copies at the peak (`loop_runner.HIDDEN_COPIES`)
    "loop-grid": (("prompts", "tokens", "passes"), ("prompts", "tokens", 2 * 768)),
    "power-shared": (("prompts", "tokens", "hidden"), ("heads", "hidden", "hidden")),
    "power-layers": (("prompts", "tokens", "hidden"), ("heads", "hidden", "hidden")),
    "steer": (("prompts", "tokens", "hidden"), ("heads", "hidden", "hidden")),
    # its draws: 258 B an instance at d = 3 (peak memory, 10⁶ → 4 × 10⁶ instances)
    "oja-bipartite": (("instances", "tokens", "dim"), ("instances", "dim", "dim", 3)),
    # 4.1 floats a β, system, token and dimension (peak memory, 4,096 → 32,768 systems)
    "phase-diagram": (("betas", "systems", "tokens", "dim", 4), ("betas", "times")),
    "norm-beta": (("betas", "systems", "tokens", "dim"), ("heads", "dim", "dim")),
    "variants": (("instances", "layers"), ("instances", "heads", 64, 64)),
    "long-context": (("n_max", "dim", 4), ("gammas", "n_max")),
    "metastability": (("betas", "saves", "tokens", "dim"), ("saves", "tokens", "tokens", "dim")),
    "hardmax": (("betas", "steps", "tokens", "vertices"), ("nsd_steps", "tokens", "vertices")),
    "equiangular": (("saves", "tokens", "dim", 12),),
    # the sweeps keep every token of a chunk's 20 layers and the start, 3 β × 2 sweeps
    "noisy-transition": (("tokens", "max_dim", "seeds", 6 * 21),
                         ("couplings", "rates", "blocks", "seeds")),
    "antipodal": (("runs", "formation_dim", 4), ("runs", "betas", "dims")),
    "mean-field": (("max_tokens", "modes", 2),),
}


def held_at_once(entry) -> list[tuple]:
    """The products of a `FOOTPRINT` entry: a list of them is arrays held at once (their
    sizes add up), a tuple one array."""
    return entry if isinstance(entry, list) else [entry]


def size_params(entry) -> list[str]:
    """The parameters a `FOOTPRINT` entry multiplies, each once, in order."""
    return list(dict.fromkeys(f for product in held_at_once(entry) for f in product
                              if isinstance(f, str)))


def check_sizes(name: str, config: dict[str, Any], memory: int | None = None, *,
                footprint: tuple[tuple, ...] | None = None) -> None:
    """Refuse, in one line naming the flags, a run whose arrays (`FOOTPRINT`) cannot fit
    in the machine's memory, a horizon past `MAX_HORIZON`, a count past `MAX_COUNT` or a
    discrete run of more than `MAX_LAYERS` layers (`--horizon / --tau`): before any
    folder or any work. `footprint`: the run's arrays as `FOOTPRINT` writes them, for a
    command whose arrays depend on more than its flags (`jaxattn loop`: the model's)."""
    memory = machine_memory() if memory is None else memory
    products = FOOTPRINT.get(name, ()) if footprint is None else footprint
    refused = []
    for entry in products if memory else ():
        size = sum(8.0 * math.prod(config[f] if isinstance(f, str) else f for f in product)
                   for product in held_at_once(entry))
        flags = ", ".join(f"--{f.replace('_', '-')} {config[f]}" for f in size_params(entry))
        wrong, line = too_big(size, f"{flags}: the run's arrays need at least",
                              "choose smaller values", memory)
        refused += [line] * wrong
    for key, value in config.items():
        flag = f"--{key.replace('_', '-')}"
        if key.endswith("horizon") and isinstance(value, float) and value > MAX_HORIZON:
            refused.append(f"{flag} {value!r} is past 2**52 ≈ 4.5e15, where float64 times are "
                           "more than 1 apart and no step can advance; choose a shorter horizon.")
        if type(value) is int and key != "seed" and value > MAX_COUNT:
            refused.append(f"{flag} {value} is more than {MAX_COUNT} (JAX counts in int32); "
                           "choose a smaller value.")
    layered = config.get("discrete") and "tau" in config and "horizon" in config
    ratio = config["horizon"] / config["tau"] if layered else 0.0
    if not ratio < MAX_LAYERS:
        refused.append(f"--horizon {config['horizon']!r} with --tau {config['tau']!r} is "
                       f"{ratio:.3g} layers, more than {MAX_LAYERS}; choose a larger --tau "
                       "or a shorter --horizon.")
    if refused:
        raise ValueError(refused[0])


def experiment_config(experiment: AbstractExperiment, overrides: dict[str, Any],
                      seed: int) -> Config:
    """The experiment's `Config`: its defaults with `overrides` applied and checked (each
    value, the seed's range, a discrete run's number of layers, the memory its arrays
    need, and the experiment's own `check_config`)."""
    params = {p.name: p for p in experiment.all_params()}
    config = dict(experiment.defaults())
    for key, value in overrides.items():
        if key not in params:
            known = ", ".join(p.flag for p in params.values())
            raise ValueError(f"{experiment.name} has no parameter --{key}; it takes {known}.")
        config[key] = convert(params[key], value)
    # each preset flag that is on (`presets`: flag → the parameters it sets) puts its
    # values into the config, which records them; one given beside its flag is refused
    for flag, preset in experiment.presets.items():
        if not config.get(flag):
            continue
        clash = [key for key in preset if key in overrides]
        if clash:
            given = ", ".join(f"--{k.replace('_', '-')}" for k in clash)
            raise ValueError(f"--{flag.replace('_', '-')} sets {given} itself ("
                             + ", ".join(f"{k.replace('_', '-')} {preset[k]!r}" for k in clash)
                             + f"); drop {given} or --{flag.replace('_', '-')}.")
        config.update(preset)
    check_sizes(experiment.name, config)
    return experiment.config(config, seed=check_seed(seed))


def command_line(config: dict, experiment: AbstractExperiment) -> str:
    """The `jaxattn run` command that repeats a run (every parameter spelled out; not
    `--resume`, which continues a run and repeats none: a resumed run records the
    command of the uninterrupted one)."""
    parts = ["jaxattn", "run", config["experiment"], "--seed", str(config["seed"])]
    preset = {key for flag, values in experiment.presets.items()
              if config.get(flag) for key in values}  # the flag says them
    for p in experiment.all_params():
        if p.name == "resume" or p.name in preset:
            continue
        value = config[p.name]
        if p.type is bool:
            parts += [p.flag] if value else []
        elif value != p.default:
            text = p.names[value] if p.names else repr(value) if p.type is float else str(value)
            parts += [p.flag, text]
    return " ".join(parts)


def run_into_folder(experiment: AbstractExperiment, config: dict[str, Any], *,
                    command: str | None,
                    simulate: Callable[[], dict[str, np.ndarray]] | None = None, out=None,
                    progress: bool = True, log: Callable[[str], object] | None = print,
                    record: dict[str, Any] | None = None) -> tuple[Path, dict]:
    """Run `experiment` with a checked `config` into a run folder (`write_run`).

    **Arguments:**

    - `command`: the command that repeats the run, recorded in `config.json` and
      `summary.json` (`None`: not recorded).
    - `simulate`: computes the data (default `experiment.simulate(config, progress)`;
      an experiment with a `resume` parameter also gets `folder=`, where it keeps its
      resumable pieces).
    - `out`, `progress`: the folder (default `runs/NAME/<timestamp>/`), a progress bar.
    - `log`: where the folder's name is announced (`None`: nowhere).
    - `record`: what `config.json` records beside the config (`jaxattn loop --grid`'s
      model).

    **Returns:**

    The run folder and the summary (the verdict, its numbers and `extra` entries, the
    simulation time, the figures); `(None, None)` on a process other than 0 of a
    distributed run, which computes beside process 0 and writes nothing.
    """
    noted = {} if command is None else {"command": command}

    def summarise(data, seconds):
        verdict = experiment.verdict(config, data)
        return {"experiment": experiment.name, "theorem": experiment.theorem,
                "verdict": verdict.line,
                "agrees_with_theory": verdict.ok if experiment.judges and not verdict.undecided
                else None,
                **({"undecided": verdict.undecided} if verdict.undecided else {}),
                "numbers": verdict.numbers, "simulation_seconds": round(seconds, 2),
                **noted, **verdict.extra}

    resume = config.get("resume")  # None: the experiment cannot resume
    folder = folder_path(experiment.name, out, resume=resume)
    pieces = {} if resume is None else {"folder": folder}
    record = {"dtype": "float64", **config, **(record or {}), **noted}
    if jax.process_count() > 1:  # a distributed run records its processes and devices
        record |= {"processes": jax.process_count(), "devices": jax.device_count()}
    compute = simulate or (lambda: experiment.simulate(config, progress, **pieces))
    if not is_writer():  # process 0 holds the folder and says when to start
        if not agree(lambda: [])[0]:
            compute()
        return None, None
    started = False

    def start():  # the folder is ready: the other processes start too
        nonlocal started
        started = not agree(lambda: [0])[0]
        return compute()

    try:
        done = write_run(
            experiment.name, record, start,
            lambda data, folder: experiment.draw(config, data, folder), summarise, out=folder,
            announce=None if log is None else
            lambda f: log(f"jaxattn run {experiment.name} → {f}"),
            resume=resume, same=tuple(k for k in record if k not in _NOT_SAME))
    except Exception as error:
        if not started:  # refused before the work: every process stops with it
            agree(functools.partial(_raise, error))
        raise
    if not started:  # resumed, and nothing was left to run
        agree(lambda: [1])
    return done


#: What a resumed run need not share with the interrupted one (`--resume` continues it
#: with any number of processes).
_NOT_SAME = ("resume", "command", "processes", "devices")


def _raise(error: Exception):
    raise error


def run_experiment(name: str, overrides: dict[str, Any] | None = None, *, seed: int = 0,
                   out=None, progress: bool = True, log=print) -> tuple[Path, dict]:
    """Run an experiment into a run folder (`runs/NAME/<timestamp>/` or `out`); returns
    the folder and the summary.

    Writes `config.json` first, then `data.npz`, the figures (PNG and PDF) and, last,
    `summary.json` with the verdict; the folder is marked `INCOMPLETE` until then. Bad
    names or overrides raise `ValueError` before anything is written. In a distributed
    run (`jax.distributed` joined: the batched studies alone) process 0 writes, and
    the others return `(None, None)` (docs/usage/distributed.md).
    """
    experiment = get_experiment(name)
    if jax.process_count() > 1 and not experiment.distributable:
        raise ValueError(refuse_distributed(name))
    config = experiment_config(experiment, overrides or {}, seed)
    return run_into_folder(experiment, config, command=command_line(config, experiment),
                           out=out, progress=progress, log=log)


def refuse_distributed(name: str) -> str:
    """The one line refusing a distributed run of an experiment that does not batch."""
    takers = [n for n, entry in REGISTRY.items() if entry.distributable]
    return (f"{name} does not run across processes; --distributed is for the batched "
            f"studies ({', '.join(takers)}): drop --distributed.")
