"""What every command shares: `CLIError`, the one-line argument parser."""

import argparse


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


def printable(text: str) -> str:
    """`text` with control characters escaped, so that an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class OneLineParser(argparse.ArgumentParser):
    """argparse's mistakes (a bad flag, a missing argument) as a one-line `CLIError`
    instead of the usage text; `--help` still prints the full usage."""

    def error(self, message):
        raise CLIError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")
