"""The `jaxattn` command line.

Each command lives in its own module with a `register(subparsers)` function that
adds its parser and sets `func`; `main` lists them in `COMMANDS`. A command
returns an exit code; user mistakes raise `CLIError` (or `ValueError`) and are
printed as one line with exit status 2.
"""

import argparse
import sys

from .._runs import RunFolderError
from . import bench, demo, experiments, models, sweep
from ._common import CLIError, OneLineParser, UsageError, printable

# The modules with a `register(subparsers)` function, in `jaxattn --help` order.
COMMANDS = (demo, models, experiments, bench, sweep)


def parser() -> argparse.ArgumentParser:
    """The `jaxattn` parser: one subparser per command of `COMMANDS`."""
    p = OneLineParser(
        prog="jaxattn", description="The consensus dynamics of self-attention, in JAX."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=OneLineParser)
    for command in COMMANDS:
        command.register(sub)
    return p


def _fail(line: str) -> int:
    print(printable(line), file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default `sys.argv[1:]`).

    **Returns:**

    The exit status: the command's (0 when it succeeded), 2 for a user mistake
    (printed as one line on stderr), 130 when interrupted.
    """
    try:
        args = parser().parse_args(argv)
    except UsageError as e:
        return _fail(str(e))
    try:
        return args.func(args)
    except UsageError as e:  # from a command's own parser (`jaxattn run NAME` overrides)
        return _fail(str(e))
    except (CLIError, RunFolderError, ValueError, FileNotFoundError) as e:
        return _fail(f"jaxattn {args.command}: error: {e}")
    except KeyboardInterrupt:
        print(f"jaxattn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
