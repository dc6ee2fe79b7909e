"""What every command shares: `CLIError`, the one argument parser (`OneLineParser`),
the one check of a command's arguments (`refuse_first` over a table of mistakes, with
`count_checks` for its count flags) and the one reading of a command-line text as a
parameter's value (`parse_value`; the value itself is checked by
`experiments.base.convert`)."""

import argparse
import contextlib
import difflib
import os
import re
import sys
from pathlib import Path

#: The actions a flag may be given more than once for (`--grid A=… --grid B=…`).
_REPEATABLE = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction,
               argparse._ExtendAction, argparse._HelpAction)


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


class UsageError(CLIError):
    """A mistake argparse found: its message is already the whole line, with the
    command's name (`jaxattn run thm41-sphere: error: …`)."""


def refuse_first(checks) -> None:
    """Refuse the first mistake of a command's arguments: `checks` is its table of
    `(wrong, line)` pairs, checked in order; the first wrong one is a `CLIError`."""
    for wrong, line in checks:
        if wrong:
            raise CLIError(line)


def file_refusals(out: Path, example: str) -> list[tuple]:
    """`refuse_first`'s entries for the output file `--out out`: its folder exists and
    takes files, and `out` is not a folder (`example`: a file name to suggest in it)."""
    folder = out.parent
    return [(not folder.is_dir(), f"cannot write {out}: there is no folder {folder}."),
            (out.is_dir(), f"--out {out} is a folder; name a file (e.g. {out / example})."),
            (folder.is_dir() and cannot_write_in(folder),
             f"cannot write {out}: folder {folder} is not writable; choose another --out.")]


def cannot_write_in(folder) -> bool:
    """Whether a file cannot be made in the existing folder `folder`: tried (and removed at
    once), as permissions alone do not tell (root may write anywhere but `/proc`)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError:
        return True


def count_checks(args, minimums: dict[str, int]) -> list[tuple[bool, str]]:
    """The checks of a command's count flags (flag → least value; a flag not given
    passes), worded as `_validate.check_count` words them, for `refuse_first`: they
    answer before JAX loads."""
    values = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in minimums}
    return [(values[flag] is not None and values[flag] < low,
             f"`{flag}` must be a whole number ≥ {low}, got {values[flag]!r}.")
            for flag, low in minimums.items()]


def printable(text: str) -> str:
    """`text` with control characters escaped, so that an error stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


_NEGATIVE_NUMBER = re.compile(
    r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class OneLineParser(argparse.ArgumentParser):
    """argparse's mistakes (a bad flag, a missing argument) as a one-line `UsageError`
    instead of the usage text; `--help` still prints the full usage. Every parser
    of the command line is one of these (the commands' and `jaxattn run NAME`'s
    overrides). Abbreviated flags are refused (`--q` is not `--quick`), and so are a
    flag given twice (`--seed 1 --seed 2`: which one did the user mean?) and a number
    written in other than ASCII digits (Python's `int("٣")` is 3)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: set[int] = set()
        # A value that starts with "-" and reads as a number is a value, not a flag:
        # `--beta -inf` and `--beta -1e3` get the value's own check, as `--beta inf`.
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        self._given = set()
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        # Words no parser took are refused by the command's own parser, not by
        # `jaxattn`'s: the line names the command, its flags and its `--help`.
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            innermost = self
            while (sub := next((a for a in innermost._actions
                                if isinstance(a, argparse._SubParsersAction)), None)):
                innermost = sub.choices[getattr(parsed, sub.dest)]
            innermost.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _get_values(self, action, arg_strings):
        # Called once for each time a flag is given, before its action.
        if action.option_strings and not isinstance(action, _REPEATABLE):
            if id(action) in self._given:
                self.error(f"{action.option_strings[-1]} is given twice; give it once")
            self._given.add(id(action))
        return super()._get_values(action, arg_strings)

    def _get_value(self, action, arg_string):
        mistake = number_mistake(arg_string) if action.type not in (None, str) else None
        if mistake:
            self.error(f"argument {'/'.join(action.option_strings) or action.dest}: {mistake}")
        return super()._get_value(action, arg_string)

    def error(self, message):
        if message.startswith("unrecognized arguments:"):
            message += _closest_flags(self, message.split(":", 1)[1].split())
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


def _closest_flags(parser: argparse.ArgumentParser, words: list[str]) -> str:
    """"; did you mean --instances?" for each unknown flag in `words` that is close to
    a flag of `parser` or of its commands (the top parser reports a command's
    unknown flags)."""
    flags, todo = set(), [parser]
    while todo:
        p = todo.pop()
        for action in p._actions:
            flags.update(f for f in action.option_strings if f.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    hints = []
    for word in words:
        word = word.split("=")[0]
        if word.startswith("--") and word not in flags:
            # a flag it begins (abbreviations are refused), else the closest spelling
            close = sorted(f for f in flags if f.startswith(word))[:3] or \
                difflib.get_close_matches(word, sorted(flags), n=1, cutoff=0.6)
            hints += [f"{word}: did you mean {' or '.join(close)}?"] if close else []
    return f"; {'; '.join(hints)}" if hints else ""


def number_mistake(text: str, numeric: bool = True) -> str | None:
    """What is wrong with `text` written as a value on a command line, if anything: a
    digit other than 0-9 (`int()` and `float()` also read Arabic-Indic, Devanagari,
    full-width … digits, which a user rarely means) or, for a `numeric` value, an
    underscore (Python reads `1_0` as 10; on a command line it is a typo)."""
    if any(c.isdigit() and not c.isascii() for c in text):
        return f"write numbers in ASCII digits 0-9, got {text!r}"
    if numeric and "_" in text:
        return f"write numbers without underscores (10, not 1_0), got {text!r}"
    return None


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_value(text: str, kind: type, name: str | None = None):
    """A command-line text as a value of `kind` (`int`, `float` or `bool`: true/false,
    yes/no, on/off, 1/0, any case); a number in other than ASCII digits or with underscores
    (Python's `float("1_0")` is 10) is a `CLIError` (naming `name`, the flag, when
    given).

    **Returns:**

    The value, or `text` unchanged when it does not read as one, so that the
    check that follows (`convert`, `check_count`) reports it with the
    parameter's name.
    """
    word = text.strip()
    mistake = number_mistake(word, kind in (int, float))
    refuse_first([(mistake, f"{name or 'a number'}: {mistake}.")])
    if kind is bool:
        low = word.lower()
        return True if low in _TRUE else False if low in _FALSE else text
    try:
        return kind(word)
    except ValueError:
        return text


def add_distributed_flags(p: argparse.ArgumentParser, shown: bool = True) -> None:
    """The flags of a run across processes (`jaxattn sweep`, the batched studies of
    `jaxattn run`): docs/usage/distributed.md. Not `shown` in the help of a run that
    does not take them (still parsed, so that using one is refused in words)."""
    def helped(text):
        return text if shown else argparse.SUPPRESS

    p.add_argument("--distributed", action="store_true",
                   help=helped("one of several processes (jax.distributed; SLURM, Open MPI or "
                   "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID, or the flags "
                   "below): each batch sharded over every process's devices, process 0 writes"))
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help=helped("process 0's address (with --distributed)"))
    p.add_argument("--num-processes", type=int, default=None, metavar="N",
                   help=helped("how many processes (with --distributed)"))
    p.add_argument("--process-id", type=int, default=None, metavar="K",
                   help=helped("this process's number, 0 … N-1 (with --distributed)"))
    p.add_argument("--launch-local", type=int, default=None, metavar="N",
                   help=helped("start N processes on this machine, 2 CPU devices each "
                               "(gloo), for trying a distributed run"))


def distributed_checks(args) -> list[tuple[bool, str]]:
    """How the distributed flags go together, for `refuse_first` (their values, and
    `--devices` beside them: `_distributed.check_flags`)."""
    joined = [f for f, v in (("--coordinator", args.coordinator),
                             ("--num-processes", args.num_processes),
                             ("--process-id", args.process_id)) if v is not None]
    launch = args.launch_local
    return [
        (launch is not None and launch < 1,
         f"--launch-local must be a whole number ≥ 1, got {launch}."),
        (launch is not None and launch > max(os.cpu_count() or 1, 2),
         f"--launch-local {launch} would start more processes than this machine has cores "
         f"({os.cpu_count()}): at most {max(os.cpu_count() or 1, 2)}."),
        (launch is not None and args.distributed,
         "--launch-local starts the processes of a distributed run itself; drop --distributed."),
        (launch is not None and joined,
         f"--launch-local numbers its processes itself; drop {', '.join(joined)}."),
        (joined and launch is None and not args.distributed,
         f"{', '.join(joined)} go with --distributed (or use --launch-local N)."),
    ]


def launch_local(args, words: list[str], after: str = "") -> int:
    """Run `jaxattn WORDS --distributed` as `args.launch_local` processes on this
    machine (`_distributed.launch_local`; `after` ends the line of a failure)."""
    from .._process.distributed import launch_local as launch

    return launch([sys.executable, "-m", "jaxattn", *words, "--distributed"],
                  args.launch_local, log=lambda line: print(line, file=sys.stderr),
                  after=after)


def loaded_ahead(command: str, settings, distributed: bool = False):
    """`_programs.loaded_ahead` for this command with these `settings` (its arguments
    less where it writes and how it shows progress; `vars(args)` less those when
    `settings` is an `argparse.Namespace`): the kept programs its last run took are
    loaded while it imports and starts. A distributed run has JAX's cache alone
    (docs/usage/speed.md)."""
    from .._programs import loaded_ahead as ahead

    if distributed:
        return contextlib.nullcontext()
    if isinstance(settings, argparse.Namespace):
        settings = sorted((k, v) for k, v in vars(settings).items()
                          if k not in ("out", "no_progress") and not callable(v))
    return ahead(f"{command} {settings}")
