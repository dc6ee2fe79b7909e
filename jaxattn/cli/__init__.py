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
from ._common import CLIError, OneLineParser, printable

# The modules with a `register(subparsers)` function, in `jaxattn --help` order.
COMMANDS = (demo, models, experiments, bench, sweep)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="jaxattn", description="The consensus dynamics of self-attention, in JAX."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=OneLineParser)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except CLIError as e:
        print(printable(e), file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except (CLIError, RunFolderError, ValueError, FileNotFoundError) as e:
        print(f"jaxattn {args.command}: error: {printable(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxattn {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
