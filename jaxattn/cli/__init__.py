"""The `jaxattn` command line.

Each command lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`; `main` lists them in `COMMANDS`. A command
returns an exit code; user mistakes raise `CLIError` (or `ValueError`) and are
printed as one line with exit status 2.

The commands that compute results (`COMPUTING`) run XLA deterministically: `main`
puts the deterministic GPU flags into `XLA_FLAGS` before JAX's backend starts
(`_runs.use_deterministic_xla`), unless `--nondeterministic` or
`JAXATTN_NONDETERMINISTIC=1` says not to (docs/determinism.md).
"""

import argparse
import os
import sys

import equinox as eqx

from .._runs import OPT_OUT, RunFolderError, use_deterministic_xla
from . import bench, demo, experiments, models, sweep
from ._common import CLIError, OneLineParser, UsageError, printable

# The modules with a `register(subparsers)` function, in `jaxattn --help` order.
COMMANDS = (demo, models, experiments, bench, sweep)
#: The commands whose results are bit-identical from run to run on a GPU too.
COMPUTING = ("demo", "loop", "run", "sweep")


def parser() -> argparse.ArgumentParser:
    """The `jaxattn` parser: one subparser per command of `COMMANDS`."""
    p = OneLineParser(
        prog="jaxattn", description="The consensus dynamics of self-attention, in JAX."
    )
    p.add_argument("--nondeterministic", action="store_true",
                   help=f"let XLA pick GPU kernels freely (faster; results may differ in "
                   f"the last bits from run to run); the same as {OPT_OUT}=1")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=OneLineParser)
    for command in COMMANDS:
        command.register(sub)
    return p


def _fail(line: str) -> int:
    print(printable(line), file=sys.stderr)
    return 2


def _runtime_message(error: Exception) -> str:
    """The one line of an `eqx.error_if` failure (a solver out of steps, a NaN)
    that says what happened, without equinox's advice on debugging."""
    lines = str(error).splitlines()
    said = [ln.split("EquinoxRuntimeError:", 1)[1].strip() for ln in lines
            if "EquinoxRuntimeError:" in ln]
    text = said[0] if said else next((ln for ln in lines if ln.strip()), "failed")
    if "maximum number of solver steps" in text:
        text = ("the flow solver reached its step budget before the final time; choose a "
                "shorter --horizon (or --discrete)")
    return f"the computation stopped: {text}"


def _end_process(code: int) -> None:
    """End the process at once with `code`, skipping Python's teardown. After
    Ctrl-C, XLA may still be compiling or running on its own threads; Python
    tearing JAX down under them crashed the process at exit (a segfault in 3 of 22
    interrupts, issue 14). Every file is already complete or absent (atomic writes),
    the folder's lock is released and `INCOMPLETE` marks it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default `sys.argv[1:]`).

    **Returns:**

    The exit status: the command's (0 when it succeeded), 2 for a user mistake
    (printed as one line on stderr), 130 when interrupted (with `argv` not given,
    as the `jaxattn` program, the process then ends at once: `_end_process`).
    """
    try:
        args = parser().parse_args(argv)
    except UsageError as e:
        return _fail(str(e))
    if args.command in COMPUTING:  # before the backend starts, or it has no effect
        use_deterministic_xla(not args.nondeterministic)
    try:
        return args.func(args)
    except UsageError as e:  # from a command's own parser (`jaxattn run NAME` overrides)
        return _fail(str(e))
    except (CLIError, RunFolderError, ValueError, FileNotFoundError) as e:
        return _fail(f"jaxattn {args.command}: error: {e}")
    except eqx.EquinoxRuntimeError as e:
        return _fail(f"jaxattn {args.command}: error: {_runtime_message(e)}")
    except KeyboardInterrupt:
        print(f"jaxattn {args.command}: interrupted", file=sys.stderr)
        if argv is None:  # the `jaxattn` process itself, not a caller in Python
            _end_process(130)
        return 130


if __name__ == "__main__":
    sys.exit(main())
