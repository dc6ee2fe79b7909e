"""What every command shares: `CLIError`, the one argument parser (`OneLineParser`)
and the one reading of a command-line text as a parameter's value (`parse_value`).

Integers are checked by `_validate.check_count`, and a parameter's value by
`experiments.runner.convert`; this module only turns text into values."""

import argparse


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


class UsageError(CLIError):
    """A mistake argparse found: its message is already the whole line, with the
    command's name (`jaxattn run thm41-sphere: error: …`)."""


def printable(text: str) -> str:
    """`text` with control characters escaped, so that an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class OneLineParser(argparse.ArgumentParser):
    """argparse's mistakes (a bad flag, a missing argument) as a one-line `UsageError`
    instead of the usage text; `--help` still prints the full usage. Every parser
    of the command line is one of these (the commands' and `jaxattn run NAME`'s
    overrides). Abbreviated flags are refused (`--q` is not `--quick`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def parse_value(text: str, kind: type):
    """A command-line text as a value of `kind` (`int`, `float` or `bool`: true/false,
    yes/no, 1/0, any case).

    **Returns:**

    The value, or `text` unchanged when it does not read as one, so that the
    check that follows (`convert`, `check_count`) reports it with the
    parameter's name.
    """
    word = text.strip()
    if kind is bool:
        low = word.lower()
        return True if low in _TRUE else False if low in _FALSE else text
    try:
        return kind(word)
    except ValueError:
        return text
