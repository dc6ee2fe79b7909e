"""`jaxattn sweep NAME|SPEC [--grid K=V1,V2 …] [--set K=V …] [--instances N] [--resume]
[--out DIR]`: a parameter sweep with per-instance outcomes, resumable."""

import argparse
from pathlib import Path

from ._common import (
    CLIError,
    add_distributed_flags,
    count_checks,
    distributed_checks,
    launch_local,
    loaded_ahead,
    parse_value,
    refuse_first,
)
from .experiments import EXIT_AGAINST, EXIT_UNDECIDED


def _pair(text: str, flag: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise CLIError(f"{flag} takes NAME=VALUE{'S' if flag == '--grid' else ''}, e.g. "
                       f"{'beta=0.5,1,2' if flag == '--grid' else 'horizon=5'}; got {text!r}.")
    return key.strip().replace("-", "_"), value.strip()


def _grid(items: list[str]) -> dict[str, list[str]]:
    grid: dict[str, list[str]] = {}
    for text in items:
        key, values = _pair(text, "--grid")
        parts = [v.strip() for v in values.split(",")]
        refuse_first([(key in grid, f"--grid {key} is given twice; list all its values once."),
                      (not all(parts), f"--grid {key}: empty value in {values!r}.")])
        grid[key] = parts
    return grid


def _typed(experiment: str, fixed: dict[str, str], grid: dict[str, list[str]]):
    """The command line's texts as values of the experiment's parameters (a name it
    does not have stays text, for the sweep to report)."""
    from ..sweep import sweep_params

    params = {p.name: p for p in sweep_params(experiment)}

    def value(key: str, text: str):
        return parse_value(text, params[key].type, params[key].flag) if key in params else text

    return ({k: value(k, v) for k, v in fixed.items()},
            {k: [value(k, v) for v in values] for k, values in grid.items()})


def _precheck(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The values of `jaxattn sweep NAME` checked as `jaxattn run NAME` checks them,
    from the experiment's source, before JAX loads (a spec file is read by the sweep).

    **Returns:** the texts of `--set` and of `--grid`, by parameter."""
    from ..experiments import SWEEPABLE, declared_params
    from ..experiments.base import convert

    refuse_first([*count_checks(args, {"--instances": 1, "--chunk": 1, "--devices": 1}),
                  *distributed_checks(args)])
    sets = [_pair(t, "--set") for t in args.set]
    grid = _grid(args.grid)
    if Path(args.name).suffix.lower() in (".toml", ".json") or args.name not in SWEEPABLE:
        return dict(sets), grid  # the sweep reads the file, or names the experiments
    params = {p.name: p for p in declared_params(args.name) or ()}
    for key, text in sets + [(key, text) for key, texts in grid.items() for text in texts]:
        if key in params:  # a ValueError is the one line the user gets (`cli.main`)
            flag = params[key].type is bool  # its words as the command line reads them
            convert(params[key], parse_value(text, bool, params[key].flag) if flag else text)
    return dict(sets), grid


def _words(args: argparse.Namespace) -> list[str]:
    """The command line of `args` (for the processes `--launch-local` starts)."""
    flags = [(f"--{k}", v) for k in ("instances", "seed", "chunk", "out")
             if (v := getattr(args, k)) is not None]
    switches = [f"--{k.replace('_', '-')}" for k in ("resume", "no_progress") if getattr(args, k)]
    return [*(["--nondeterministic"] if args.nondeterministic else []), "sweep", args.name,
            *(w for g in args.grid for w in ("--grid", g)),
            *(w for t in args.set for w in ("--set", t)),
            *(w for k, v in flags for w in (k, str(v))), *switches]


def _sweep(args: argparse.Namespace) -> int:
    fixed, grid = _precheck(args)
    from .._process.distributed import check_flags, initialize

    if args.distributed or args.launch_local is not None:
        check_flags(args.coordinator, args.num_processes, args.process_id, devices=args.devices)
    if args.launch_local is not None:
        return launch_local(args, _words(args),
                            " (a --resume run continues from the saved chunks)")
    import jax

    jax.config.update("jax_enable_x64", True)
    if args.distributed:
        initialize(args.coordinator, args.num_processes, args.process_id)
    # the programs of its last run loaded while it imports and starts
    with loaded_ahead("sweep", args, args.distributed):
        from .._artifacts.folders import read_json
        from .._validate import check_seed
        from ..sweep import SweepSpec, format_table, read_spec
        from ..sweep import run as run_sweep

        is_file = Path(args.name).suffix.lower() in (".toml", ".json")
        spec = read_spec(args.name) if is_file else SweepSpec(args.name)
        fixed, grid = _typed(spec.experiment, fixed, grid)
        if args.seed is not None:  # instance i is drawn from seed + i
            check_seed(args.seed, "--seed", count=args.instances or spec.instances)
        if spec.points is None:  # a spec file's grid, its values replaced or joined
            grid = spec.grid | grid
        result = run_sweep(
            spec, grid or None, set=(spec.set | fixed) or None,
            instances=args.instances, seed=args.seed, chunk=args.chunk, out=args.out,
            resume=args.resume, devices=args.devices, distributed=args.distributed,
            progress=not args.no_progress,
        )
    if result is None:  # a process other than 0 of a distributed sweep
        print(f"process {jax.process_index()} of {jax.process_count()}: done "
              "(process 0 wrote the sweep)")
        return 0
    s = result.summary
    status, why = exit_status(s)
    print(format_table(s, read_json(result.folder / "sweep.json")["grid_keys"]))
    print(f"verdict{why}: {s['verdict']}")
    print(f"wrote {result.folder}/: sweep.json, table.csv, {', '.join(s['figures'])}, "
          "summary.json")
    return status


def exit_status(summary: dict) -> tuple[int, str]:
    """The exit status of a finished sweep, as `jaxattn run`'s: 3 when an instance
    contradicted its theorem, else 4 when instances were left undecided (still
    converging at T, or their solver failed: every instance failing is one such sweep),
    else 0; and the words that say so beside the verdict (none for 0)."""
    counts = {"still converging at T": summary.get("not_converged", 0),
              "solver failed": summary.get("solver_failed", 0)}
    if summary.get("contradicted", 0):
        return EXIT_AGAINST, f" (against the prediction: exit status {EXIT_AGAINST})"
    if any(counts.values()):
        left = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
        return EXIT_UNDECIDED, f" (undecided, {left}: exit status {EXIT_UNDECIDED})"
    return 0, ""


def register(sub) -> None:
    p = sub.add_parser(
        "sweep", help="sweep experiment parameters over random instances (resumable)",
        description="Run an experiment of `jaxattn list` over a grid of parameters with N "
        "random instances per point (instance i uses seed S + i), each point one vmapped "
        "batch. Writes sweep.json (config, versions), chunks/ (atomic), table.csv (one row "
        "per instance: final E, consensus time, whether the theorem's prediction held, "
        "solver status, and a status: held, not_converged, contradicted, solver_failed or "
        "outside_domain), sweep.png/.pdf and summary.json. NAME may be a TOML or JSON spec "
        "file with keys experiment, grid, points, set, instances, seed, chunk. Exit status, "
        "as `jaxattn run`'s: 0 when every instance inside its theorem's domain held, 3 when "
        "one contradicted it, 4 when instances were left undecided (still converging at T, "
        "or their solver failed), 2 for bad input (refused before any folder).")
    p.add_argument("name", help="experiment name (thm41-sphere, …) or a .toml/.json spec")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2,…",
                   help="a swept parameter and its values (repeat for a product grid; "
                   "with a spec file, added to its grid or replacing that parameter's values)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter fixed for every point (e.g. horizon=5)")
    p.add_argument("--instances", type=int, default=None,
                   help="random instances per point (default 64, or the spec's)")
    p.add_argument("--seed", type=int, default=None, help="first instance's seed (default 0)")
    p.add_argument("--chunk", type=int, default=None,
                   help="instances per saved chunk (default: as many as fit in an eighth of "
                        "this machine's memory, at most a whole point)")
    p.add_argument("--devices", type=int, default=None,
                   help="shard each batch over this many devices (default: all)")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweep-NAME/<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out, skipping its finished chunks")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_distributed_flags(p)
    p.set_defaults(func=_sweep)
