"""The commands `jaxattn list`, `jaxattn run NAME [--out DIR] [--seed S] [overrides]`
and `jaxattn plot DIR` (paper 001 §6.1 as one-command experiments)."""

import argparse
import difflib
from pathlib import Path
from typing import NamedTuple

from ._common import (
    CLIError,
    OneLineParser,
    add_distributed_flags,
    distributed_checks,
    launch_local,
    loaded_ahead,
    parse_value,
    refuse_first,
)

EXIT_AGAINST = 3  # the run finished but its outcome contradicts the theorem
EXIT_UNDECIDED = 4  # the run finished, too noisy to agree or contradict


def _list(args) -> int:
    from ..experiments import REGISTRY  # names and titles, without importing the experiments

    print("experiments (run one with `jaxattn run NAME`; its overrides: "
          "`jaxattn run NAME --help`):")
    width = max(len(name) for name in REGISTRY)
    for name, entry in REGISTRY.items():
        ref = f"Theorem {entry.theorem}" if entry.theorem[:1].isdigit() else entry.theorem
        print(f"  {name:<{width}}  {f'[{ref}] ' if ref else ''}{entry.title}")
    return 0


class Declared(NamedTuple):
    """An experiment as `jaxattn run NAME`'s parser needs it, read from its source."""

    name: str
    title: str
    params: tuple

    def all_params(self) -> tuple:
        return self.params


def declared_experiment(name: str):
    """The experiment `name` as its parser needs it (name, title, parameters), read
    from its source without importing it nor JAX (`ja.experiments.declared_params`): help
    and argument errors answer at once. Imported when its source does not declare its
    parameters plainly (`name` is one of `REGISTRY`: `_run` checked it)."""
    from ..experiments import REGISTRY, declared_params, get_experiment

    params = declared_params(name)
    if params is None:
        return get_experiment(name)
    return Declared(name, REGISTRY[name].title, params)


def _override_parser(experiment) -> OneLineParser:
    from ..experiments import REGISTRY

    p = OneLineParser(prog=f"jaxattn run {experiment.name}", description=experiment.title)
    p.add_argument("--out", default=None, help="run folder (default: runs/NAME/<timestamp>/)")
    p.add_argument("--seed", default="0", help="random seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # The batched studies alone take them (`_distributed_run`); the others parse them
    # to refuse them in words, without listing them.
    add_distributed_flags(p, shown=REGISTRY[experiment.name].distributable)
    for param in experiment.all_params():
        if param.type is bool:
            p.add_argument(param.flag, dest=param.name, action="store_const", const=True,
                           default=None, help=param.help)
        else:
            # Read as text, converted and checked by experiment_config (one error style).
            p.add_argument(param.flag, dest=param.name, default=None, metavar="VALUE",
                           help=f"{param.help} (default {param.default})")
    return p


def parse_overrides(experiment, argv: list[str]):
    """`jaxattn run NAME`'s arguments after the name: the parsed options and the
    overrides given, as values of the experiment's parameters (`--beta 2` → 2.0)."""
    opts = _override_parser(experiment).parse_args(argv)
    overrides = {}
    for param in experiment.all_params():
        value = getattr(opts, param.name)
        if value is not None:
            overrides[param.name] = value if param.type is bool else parse_value(
                value, param.type, param.flag)
    return opts, overrides


def _name_mistake(name: str | None) -> str | None:
    """What is wrong with `jaxattn run NAME`'s name, if anything: none given, or one no
    experiment has (with the closest name if one is near: `thm41sphere` → `thm41-sphere`)."""
    from ..experiments import REGISTRY

    if name is None:
        return "name an experiment: jaxattn run NAME (see `jaxattn list`)."
    if name in REGISTRY:
        return None
    close = difflib.get_close_matches(name, list(REGISTRY), n=1, cutoff=0.6)
    if close:
        return (f"unknown experiment {name!r}; did you mean {close[0]!r}? (`jaxattn list` "
                f"shows the {len(REGISTRY)} experiments)")
    return (f"unknown experiment {name!r}; the experiments are {', '.join(REGISTRY)} (see "
            "`jaxattn list`).")


def _run(args) -> int:
    mistake = _name_mistake(args.name)
    if mistake:
        raise CLIError(mistake)
    experiment = declared_experiment(args.name)
    opts, overrides = parse_overrides(experiment, args.overrides)
    seed = parse_value(opts.seed, int, "--seed")
    from ..experiments.base import convert

    params = {param.name: param for param in experiment.all_params()}
    for name, value in overrides.items():  # each value's own check, before JAX loads
        convert(params[name], value)
    if _distributed_run(args, opts):
        from .._process.distributed import launch_argv

        return launch_local(opts, [*(["--nondeterministic"] if args.nondeterministic else []),
                                   "run", args.name, *launch_argv(args.overrides)])
    import jax

    jax.config.update("jax_enable_x64", True)
    if opts.distributed:
        from .._process.distributed import initialize

        initialize(opts.coordinator, opts.num_processes, opts.process_id)
    # the programs of its last run loaded while it imports and starts
    with loaded_ahead("run", (args.name, sorted(overrides.items()), seed), opts.distributed):
        from ..experiments import run_experiment

        folder, summary = run_experiment(args.name, overrides, seed=seed, out=opts.out,
                                         progress=not opts.no_progress)
    if folder is None:  # a process other than 0 of a distributed run
        print(f"process {jax.process_index()} of {jax.process_count()}: done "
              "(process 0 wrote the run)")
        return 0
    status, against = verdict_status(summary)
    print(f"verdict{against}: {summary['verdict']}")
    table = "table.csv, " if (Path(folder) / "table.csv").is_file() else ""
    print(f"wrote {folder}/: config.json, data.npz, {', '.join(summary['figures'])}, "
          f"{table}summary.json ({summary['simulation_seconds']:.1f} s)")
    return status


def verdict_status(summary: dict) -> tuple[int, str]:
    """The exit status of a finished run (`jaxattn run`, `jaxattn loop --grid`): 4 when
    its verdict is undecided, else 3 when it contradicts the theory, else 0; and the
    words that say so beside the verdict (none for 0)."""
    undecided = summary.get("undecided")
    if undecided:
        return EXIT_UNDECIDED, f" (undecided, {undecided}: exit status {EXIT_UNDECIDED})"
    if summary.get("agrees_with_theory") is False:  # None: nothing judged
        return EXIT_AGAINST, f" (against the prediction: exit status {EXIT_AGAINST})"
    return 0, ""


def _distributed_run(args, opts) -> bool:
    """Refuse distributed flags that do not go together, or that name an experiment
    that does not batch, in one line before any work.

    **Returns:** whether `--launch-local N` asks to start the processes here."""
    refuse_first(distributed_checks(opts))
    if not (opts.distributed or opts.launch_local is not None):
        return False
    from .._process.distributed import check_flags
    from ..experiments import REGISTRY
    from ..experiments.runner import refuse_distributed

    refuse_first([(not REGISTRY[args.name].distributable,
                   refuse_distributed(args.name))])
    check_flags(opts.coordinator, opts.num_processes, opts.process_id)
    return opts.launch_local is not None


def _plot(args) -> int:
    import jax

    from ..sweep import redraw

    jax.config.update("jax_enable_x64", True)
    paths = redraw(Path(args.folder))
    print(f"redrew {', '.join(str(p) for p in paths)}")
    return 0


def register(sub) -> None:
    ls = sub.add_parser("list", help="the named experiments and studies")
    ls.set_defaults(func=_list)
    run = sub.add_parser(
        "run", help="run an experiment: jaxattn run NAME [--out DIR] [--seed S] [overrides]",
        description="Run an experiment of paper 001 §6.1 into runs/NAME/<timestamp>/ (or "
        "--out): config.json, data.npz, figures (PNG, PDF), summary.json with the verdict. "
        "Overrides follow the name (jaxattn run NAME --help lists them). Exit status: 0 "
        "when the outcome agrees with what the experiment tests (a theorem, or the paper's "
        "claim a study checks: `jaxattn list` names it) or when its theorem does not cover "
        "the run; 3 only when the run measurably contradicts it (convergence stalled, a "
        "predicted rate, threshold or share missed); 4 when it cannot decide: its errors "
        "are too large, or it has not converged by its horizon (verdict_kind "
        "not_converged); the verdict says what decides it, e.g. raise --seeds; 2 for bad "
        "input.",
    )
    run.add_argument("name", nargs="?", help="experiment name (see `jaxattn list`)")
    run.add_argument("overrides", nargs=argparse.REMAINDER,
                     help="--out DIR, --seed S, --discrete, --tau T, --tokens N, …")
    run.set_defaults(func=_run)
    plot = sub.add_parser(
        "plot", help="redraw the figures of a finished run, loop or sweep folder",
        description="Draw the figures of a folder again from its saved data, without "
        "recomputing: a `jaxattn run` folder, a `jaxattn loop` folder (with or without "
        "--grid) or a `jaxattn sweep` folder.")
    plot.add_argument("folder", help="a finished run, loop or sweep folder")
    plot.set_defaults(func=_plot)
