"""The `jaxattn` command line.

Each command lives in a module with a `register(subparsers)` function that adds
its parser and sets `func`; `COMMANDS` lists every command with its module and
its one-line help. A command returns an exit code; user mistakes raise
`CLIError` (or `ValueError`) and are printed as one line with exit status 2; a
run that stops on its values (`jaxattn.SimulationError`) likewise.

Only the module of the command being run is imported (`parser(commands)`):
`jaxattn --help` and `jaxattn list` answer without loading JAX.

The commands that compute results (`COMPUTING`) run XLA deterministically: `main`
puts the deterministic GPU flags into `XLA_FLAGS` before JAX's backend starts
(`_determinism.use_deterministic_xla`), unless `--nondeterministic` or
`JAXATTN_NONDETERMINISTIC=1` says not to (docs/determinism.md).
"""

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterable

from .._determinism import OPT_OUT
from ._common import CLIError, OneLineParser, UsageError, printable

#: Every command, in `jaxattn --help` order: the module of `jaxattn.cli` whose
#: `register(subparsers)` adds it, imported only when the command runs, and its
#: one-line help (the same as the module gives it; a test compares them).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "10 tokens on S² under 2 time-varying heads"),
    "loop": ("models", "loop a real transformer (GPT-2, GPT-Neo, BERT, ALBERT, Llama) and "
             "record the misalignment E after every block"),
    "list": ("experiments", "the named experiments and studies"),
    "run": ("experiments", "run an experiment: jaxattn run NAME [--out DIR] [--seed S] "
            "[overrides]"),
    "plot": ("experiments", "redraw the figures of a finished run, loop or sweep folder"),
    "bench": ("bench", "run the benchmark suite (table + JSON)"),
    "sweep": ("sweep", "sweep experiment parameters over random instances (resumable)"),
}
#: The commands whose results are bit-identical from run to run on a GPU too.
COMPUTING = ("demo", "loop", "run", "sweep")


def parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The `jaxattn` parser, one subparser per command of `COMMANDS`.

    **Arguments:**

    - `commands`: the commands whose modules are imported and registered in full
      (default: all). Every other command gets a parser with only its one-line
      help: enough for `jaxattn --help` and to refuse an unknown name.
    """
    wanted = set(COMMANDS) if commands is None else set(commands)
    p = OneLineParser(
        prog="jaxattn", description="The consensus dynamics of self-attention, in JAX."
    )
    p.add_argument("--nondeterministic", action="store_true",
                   help=f"let XLA pick GPU kernels freely (faster; results may differ in "
                   f"the last bits from run to run); the same as {OPT_OUT}=1")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=OneLineParser)
    modules = {COMMANDS[name][0] for name in wanted if name in COMMANDS}
    for name, (module, help_line) in COMMANDS.items():
        if name in sub.choices:  # added with its module's other commands
            continue
        if module in modules:
            importlib.import_module(f"{__name__}.{module}").register(sub)
        else:
            sub.add_parser(name, help=help_line).set_defaults(func=None)
    return p


def _command(argv: list[str]) -> list[str]:
    """The command named in `argv` (the first word that is no option), if any."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return [word] if word in COMMANDS else []


def _fail(line: str) -> int:
    print(printable(line), file=sys.stderr)
    return 2


def _runtime_message(error: Exception) -> str | None:
    """The one line a command prints for `error`: a `SimulationError` or a check
    that failed inside `jit` (a solver out of steps, a NaN) as "the computation
    stopped: …", a user mistake as its message; `None` for anything else (a bug,
    shown with its traceback)."""
    if isinstance(error, CLIError):
        return str(error)
    # Loaded by every command that gets this far with such an error.
    from .._app.folders import RunFolderError
    from .._validate import runtime_message

    text = runtime_message(error)
    if text is None:
        if isinstance(error, RunFolderError | ValueError | FileNotFoundError):
            return str(error)
        return None
    if "`max_steps`" in text:  # the library's fix names arguments the CLI has not
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


#: Set once the command has caught Ctrl-C; until then, `_on_sigint` raises it again.
_NOTICED = threading.Event()
#: Seconds between two raises of one Ctrl-C that the command has not yet caught.
_AGAIN_S = 1.0


def _on_sigint(signum, frame) -> None:
    """Ctrl-C for the `jaxattn` program: raise `KeyboardInterrupt`, and raise it again
    every `_AGAIN_S` seconds until `main` has caught it. Python drops an exception
    raised while a garbage-collector callback runs (JAX installs one), so one Ctrl-C
    could otherwise be lost and a long run go on."""
    if not _NOTICED.is_set():
        again = threading.Timer(_AGAIN_S, _raise_again)
        again.daemon = True
        again.start()
    raise KeyboardInterrupt


def _raise_again() -> None:
    if not _NOTICED.is_set():
        os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default `sys.argv[1:]`).

    **Returns:**

    The exit status: the command's (0 when it succeeded), 2 for a user mistake
    (printed as one line on stderr), 130 when interrupted (with `argv` not given,
    as the `jaxattn` program, the process then ends at once: `_end_process`).
    """
    words = sys.argv[1:] if argv is None else list(argv)
    if argv is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        args = parser(_command(words)).parse_args(words)
    except UsageError as e:
        return _fail(str(e))
    if args.command in COMPUTING:  # before the backend starts, or it has no effect
        from .._determinism import use_deterministic_xla

        use_deterministic_xla(not args.nondeterministic)
    try:
        return args.func(args)
    except UsageError as e:  # from a command's own parser (`jaxattn run NAME` overrides)
        return _fail(str(e))
    except KeyboardInterrupt:
        _NOTICED.set()
        print(f"jaxattn {args.command}: interrupted", file=sys.stderr)
        if argv is None:  # the `jaxattn` process itself, not a caller in Python
            _end_process(130)
        return 130
    except Exception as e:
        line = _runtime_message(e)
        if line is None:
            raise
        return _fail(f"jaxattn {args.command}: error: {line}")


if __name__ == "__main__":
    sys.exit(main())
