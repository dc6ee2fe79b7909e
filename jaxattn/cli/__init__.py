"""The `jaxattn` command line.

Each command lives in a module with a `register(subparsers)` function; `COMMANDS`
lists them, and only the module of the command being run is imported, so `--help`,
`list` and argument errors answer without loading JAX. A user mistake (`CLIError`,
`ValueError`) or a run that stops on its values (`SimulationError`) is one line, exit
status 2; Ctrl-C at any moment (start-up, the command, exit) is exit status 130
(`quit_on_sigint`, `_on_sigint`, `_exit`). `COMPUTING` commands run XLA
deterministically unless `--nondeterministic` (docs/determinism.md); `COMPILING`
commands keep their programs in the compilation cache (docs/usage/speed.md).
"""

import argparse
import atexit
import errno
import gc
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from .._process.determinism import OPT_OUT
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
    "doctor": ("doctor", "check the install on this machine: versions, device, float32, "
               "speed"),
    "animate": ("animate", "a run folder's token trajectories as a movie (MP4 or GIF)"),
    "view": ("view", "a run folder's token trajectories as one HTML page to turn and scrub"),
    "cache": ("cache", "the compilation cache: where it is and its size, or clear it"),
}
#: The commands whose results are bit-identical from run to run on a GPU too (and
#: `doctor`, which checks the device as they use it).
COMPUTING = ("demo", "loop", "run", "sweep", "doctor")
#: The commands that compile programs, which they keep in the compilation cache
#: (`_cache.enable_cache`: docs/usage/speed.md).
COMPILING = (*COMPUTING, "bench")


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


#: A path the user named that the system cannot use: one line, not a traceback.
_PATH_ERRORS = (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.ELOOP,
                errno.EEXIST, errno.EROFS, errno.EPERM, errno.ENOENT)


def _step_budget_fix(words: list[str]) -> str:
    """What a run out of flow steps can change, in the flags its experiment has."""
    flags: set[str] = set()
    if len(words) > 1 and words[0] in ("run", "sweep"):
        from ..experiments import EXPERIMENTS

        if words[1] in EXPERIMENTS:
            flags = {p.flag for p in EXPERIMENTS[words[1]].all_params()}
    ways = [way for flag, way in (("--horizon", "a shorter --horizon"),
                                  ("--max-steps", "a larger --max-steps"),
                                  ("--discrete", "--discrete (layers)")) if flag in flags]
    return "choose " + " or ".join(ways) if ways else "shorten the run"


def _out_of_memory(text: str, words: list[str]) -> str:
    """The line for a run whose arrays did not fit in memory, with the sizes to cut: the
    flags of the experiment's memory estimate (`runner.FOOTPRINT`) where it has them."""
    from .._validate import machine_memory, memory_text
    from ..experiments.runner import FOOTPRINT, size_params

    asked = re.search(r"(\d+) bytes", text)
    entries = FOOTPRINT.get(words[1] if len(words) > 1 and words[0] == "run" else "", ())
    flags = dict.fromkeys(f"--{f.replace('_', '-')}" for entry in entries
                          for f in size_params(entry))
    return (f"the computation ran out of memory: it asked for "
            f"{memory_text(int(asked[1])) if asked else 'an array'} at once, on a machine of "
            f"{memory_text(machine_memory())}; choose smaller sizes"
            + (f" ({', '.join(flags)})" if flags else "") + ".")


def _runtime_message(error: Exception, words: list[str] = ()) -> str | None:
    """The one line a command prints for `error`: a `SimulationError` or a check
    that failed inside `jit` (a solver out of steps, a NaN) as "the computation
    stopped: …", a user mistake as its message; `None` for anything else (a bug,
    shown with its traceback)."""
    if isinstance(error, CLIError):
        return str(error)
    if isinstance(error, OSError) and error.errno in _PATH_ERRORS and error.filename:
        return f"cannot use the path {error.filename}: {error.strerror}"
    if "jax" not in sys.modules:  # nothing computed yet: a mistake in the arguments
        return str(error) if isinstance(error, ValueError | FileNotFoundError) else None
    # Loaded by every command that gets this far with such an error.
    from .._artifacts.folders import RunFolderError
    from .._validate import runtime_message

    if "RESOURCE_EXHAUSTED" in str(error):  # XLA could not allocate an array
        return _out_of_memory(str(error), words)
    text = runtime_message(error)
    if text is None:  # not a failed computation: a mistake, or a bug (its traceback)
        mistake = isinstance(error, RunFolderError | ValueError | FileNotFoundError)
        return str(error) if mistake else None
    if "`max_steps`" in text:  # the library's fix names arguments: say the command's flags
        text = ("the flow solver reached its step budget before the final time; "
                + _step_budget_fix(words))
    return f"the computation stopped: {text}"


def _end_process(code: int) -> None:
    """End the process at once with `code`, skipping Python's teardown. After
    Ctrl-C, XLA may still be compiling or running on its own threads; Python
    tearing JAX down under them crashed the process at exit (a segfault in 3 of 22
    interrupts). Every file is already complete or absent (atomic writes), the
    folder's lock is released and `INCOMPLETE` marks it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: Set once the command has caught Ctrl-C; until then, `_on_sigint` raises it again.
_NOTICED = threading.Event()
#: Set by every Ctrl-C the `jaxattn` program receives, caught or not.
_INTERRUPTED = threading.Event()
#: Seconds between two raises of one Ctrl-C that the command has not yet caught.
_AGAIN_S = 1.0
#: Seconds a Ctrl-C that came during an import waits before it is tried again.
_DEFER_S = 0.2
#: The exit status of an interrupted command (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def _on_sigint(signum, frame) -> None:
    """Ctrl-C for the `jaxattn` program: raise `KeyboardInterrupt`, and raise it again
    every `_AGAIN_S` seconds until `main` has caught it. Python drops an exception
    raised while a garbage-collector callback runs (JAX installs one), so one Ctrl-C
    could otherwise be lost and a long run go on. During an import (a command loads
    JAX first) it waits `_DEFER_S` seconds and tries again: raised inside an
    extension's initialisation, it aborted the process or left JAX half-imported."""
    _INTERRUPTED.set()
    importing = _importing(frame)
    if importing or not _NOTICED.is_set():
        again = threading.Timer(_DEFER_S if importing else _AGAIN_S, _raise_again)
        again.daemon = True
        again.start()
    if not importing:
        raise KeyboardInterrupt


def _importing(frame) -> bool:
    """Whether `frame` runs inside an import (Python's import machinery is below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise_again() -> None:
    if not _NOTICED.is_set():
        os.kill(os.getpid(), signal.SIGINT)


def quit_on_sigint(signum=None, frame=None) -> None:
    """Ctrl-C before the command starts or after it has finished (start-up, exit):
    nothing to undo, so end the process at once with exit status 130. Installed by
    `jaxattn/__main__.py` and the `jaxattn` program first thing (`_started_as_program`)
    and again by `main` for the exit."""
    _INTERRUPTED.set()
    os.write(2, b"jaxattn: interrupted\n")
    os._exit(INTERRUPTED)


def _started_as_program() -> bool:
    """Whether this process is the `jaxattn` program (its console script), not Python
    importing the package."""
    return os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".exe") == "jaxattn"


if _started_as_program() and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, quit_on_sigint)


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default `sys.argv[1:]`).

    **Returns:**

    The exit status: the command's (0 when it succeeded), 2 for a user mistake
    (printed as one line on stderr), 130 when interrupted. With `argv` not given,
    as the `jaxattn` program, the process ends in `main` (`_exit`): a Ctrl-C at any
    moment, start-up and exit included, ends it with 130.
    """
    program = argv is None and threading.current_thread() is threading.main_thread()
    words = sys.argv[1:] if argv is None else list(argv)
    if program:
        signal.signal(signal.SIGINT, _on_sigint)
        # Python's full collections, each over every object the imports made, are rare:
        # one per 100 younger ones, not 10 (BENCHMARKS.md, "The collector at start-up").
        gc.set_threshold(*gc.get_threshold()[:2], 100)
    try:
        code = _main(words)
    except KeyboardInterrupt:  # outside a command: parsing, importing its module
        _NOTICED.set()
        print("jaxattn: interrupted", file=sys.stderr)
        code = INTERRUPTED
    except SystemExit as e:  # `--help`
        if not program:
            raise
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BrokenPipeError:  # `jaxattn … | head`: the reader left; nothing more to say
        if not program:
            raise
        code = _reader_gone()
    if program:
        try:
            _exit(code)
        except KeyboardInterrupt:  # before `_exit` took Ctrl-C over
            _end_process(INTERRUPTED)
    return code


def _resume_hint(args) -> str:
    """How an interrupted sweep or loop goes on: its saved chunks stay (in its --out
    folder's `chunks/`; without --out, in a folder of its own it named as it started)."""
    if args.command not in ("sweep", "loop") or (args.command == "loop" and args.grid) \
            or getattr(args, "launch_local", None) is not None:
        return ""  # (a sweep's launcher says it in its own line; `loop --grid` has no resume)
    if args.out and not _saved_chunks(args.out):
        return ""  # interrupted before its first chunk: nothing to continue
    more = ([] if args.out else ["--out FOLDER (named as it started)"]) + \
        ([] if args.resume else ["--resume"])
    return ("; its finished chunks are saved: the same command"
            + (f" with {' '.join(more)}" if more else "") + " continues it")


def _saved_chunks(out: str) -> bool:
    """Whether the folder `out` holds a saved chunk (`chunks/`: a sweep's `NNNNN.csv`, a
    loop's `NNNNNN.npz`; an unfinished write is a hidden `.*.tmp`)."""
    try:
        return any(not p.name.startswith(".") for p in (Path(out) / "chunks").iterdir())
    except OSError:
        return False


def _reader_gone() -> int:
    """After a write to a closed pipe: stdout to /dev/null, so that flushing it at
    the exit writes nowhere (no second error), and the status of a SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _main(words: list[str]) -> int:
    try:
        args = parser(_command(words)).parse_args(words)
    except UsageError as e:
        return _fail(str(e))
    if args.command in COMPUTING:  # before the backend starts, or it has no effect
        from .._process.determinism import use_deterministic_xla

        use_deterministic_xla(not args.nondeterministic)
    try:
        if args.command in COMPILING:
            from .._process.cache import enable_cache

            enable_cache()
        return args.func(args)
    except UsageError as e:  # from a command's own parser (`jaxattn run NAME` overrides)
        return _fail(str(e))
    except KeyboardInterrupt:
        _NOTICED.set()
        print(f"jaxattn {args.command}: interrupted{_resume_hint(args)}", file=sys.stderr)
        return INTERRUPTED
    except Exception as e:
        line = _runtime_message(e, words)
        if line is None:
            raise
        return _fail(f"jaxattn {args.command}: error: {line}")


def _exit(code: int) -> None:
    """End the `jaxattn` program with `code`, or 130 if a Ctrl-C came at any time:
    the exit callbacks and the other threads finish under `quit_on_sigint`, then the
    process ends without Python's teardown (`_end_process`), where a Ctrl-C could be
    dropped and the exit status be 0."""
    signal.signal(signal.SIGINT, quit_on_sigint)
    if _INTERRUPTED.is_set() and not _NOTICED.is_set():  # it came as the command ended
        print("jaxattn: interrupted", file=sys.stderr)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what Python's own exit would run first
    _end_process(INTERRUPTED if _INTERRUPTED.is_set() else code)


if __name__ == "__main__":
    sys.exit(main())
