"""Run folders: every command that computes something saves it the same way, through
`write_run` (or, for a resumable command, its stages one by one: `hold_folder`,
`reopen_run`, `finish_run`). What a folder holds, its `INCOMPLETE` marker, lock,
`run_id` and the rules of `--resume`: docs/usage/experiments.md.
"""

import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .._files import atomic_write, umask
from .._process.determinism import is_deterministic
from .._validate import SimulationError, refuse_first
from . import figures

INCOMPLETE = "INCOMPLETE"
#: The lock file a command holds inside its folder (removed when it ends).
LOCK = ".lock"
#: What made a folder, by the file that holds its settings.
KINDS = {"run": "config.json", "sweep": "sweep.json"}

class RunFolderError(RuntimeError):
    """A run folder that cannot be created, read or is incomplete."""


@contextlib.contextmanager
def os_errors(path, verb: str) -> Iterator[None]:
    """An `OSError` in the block (a name too long, a file where a folder should be,
    no permission) as the one-line `RunFolderError` "cannot `verb` the run folder"."""
    try:
        yield
    except OSError as e:
        raise RunFolderError(f"cannot {verb} the run folder {path}: {e.strerror or e}") from e


def package_versions() -> dict[str, str]:
    """Versions of jaxattn and the packages its results depend on."""
    out = {"python": platform.python_version()}
    for name in ("jaxattn", "jax", "jaxlib", "diffrax", "equinox", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def computed_on() -> dict[str, Any]:
    """How this process computes: `backend` (JAX's default: cpu, gpu, tpu) and
    `deterministic` (XLA_FLAGS hold the deterministic GPU flags)."""
    return {"backend": jax.default_backend(), "deterministic": is_deterministic()}


def stamp() -> str:
    """The local time now, to the second, as ISO 8601 with the UTC offset."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


#: The key under which `write_json` names the fields it wrote as `null`.
NULL_MEANS = "null_means"


def _jsonable(obj, where: str = "", nulls: dict[str, str] | None = None):
    """`obj` as JSON values: arrays as lists, and NaN and ±inf (which JSON lacks) as
    `None`, each recorded in `nulls` by its path (`points[0].consensus_time_median`)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, f"{where}.{k}" if where else str(k), nulls)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]", nulls) for i, v in enumerate(obj)]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # NumPy / JAX arrays and scalars
        return _jsonable(np.asarray(obj).tolist(), where, nulls)
    if isinstance(obj, float) and not np.isfinite(obj):
        if nulls is not None:
            nulls[where] = "not a number" if obj != obj else f"{'+' if obj > 0 else '-'}infinity"
        return None
    return obj


def write_json(path, obj: Any) -> Path:
    """Write `obj` as indented JSON, atomically: arrays become lists, and numbers JSON
    cannot hold (NaN, ±inf) become `null`, named with what they were under the key
    `null_means` (`{"numbers.decay_rate": "not a number"}`) when `obj` is a dict."""
    nulls: dict[str, str] = {}
    value = _jsonable(obj, "", nulls)
    if nulls and isinstance(value, dict):
        value[NULL_MEANS] = nulls | value.get(NULL_MEANS, {})
    text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return atomic_write(Path(path), lambda f: f.write(text.encode()))


def save_npz(path, **arrays) -> Path:
    """Save arrays to a compressed `.npz`, atomically."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    return atomic_write(Path(path), lambda f: np.savez_compressed(f, **arrays))


def folder_path(name: str, out: str | os.PathLike | None = None, *,
                resume: bool | None = False) -> Path:
    """`out`, or a new `runs/NAME/<timestamp>/` when `out` is not given; an empty
    `out` (which would be the current directory) is a `RunFolderError`, and so is
    `resume` without `out` (a `ValueError`: the arguments are refused)."""
    refuse_first((
        (resume and out is None, ValueError,
         "--resume needs --out DIR: the folder of the run to continue."),
        (out is not None and not str(out).strip(), RunFolderError,
         "--out is empty; name the run folder (e.g. --out runs/mine)."),
    ))
    if out is not None:
        return Path(out)
    return Path("runs") / name / _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet (what `mkdir -p`
    would make), or `None`."""
    missing = None
    with os_errors(path, "read"):
        for p in (path, *path.parents):
            if p.exists():
                break
            missing = p
    return missing


def folder_kind(path: Path) -> str | None:
    """Which command made the folder `path`: its recorded `kind`, else the kind
    whose settings file it holds; `None` for a folder no command has written."""
    for kind, name in KINDS.items():
        if (path / name).is_file():
            recorded = read_settings(path / name).get("kind", kind)
            return recorded if recorded in KINDS else kind
    return None


def _ours(name: str) -> bool:
    """Whether a file name is one jaxattn writes before a folder's settings: the lock,
    the marker, an atomic write's temporary file."""
    return name in (LOCK, INCOMPLETE) or (name.startswith(".") and name.endswith(".tmp"))


#: What a command writes into its folder besides `_ours`: its settings and results,
#: folders of resumable pieces (`chunks/`, …) and figures (`<stem>.png`, `.pdf`, the
#: stem each experiment's own: told by the suffix) and tables.
_RESULTS = ("summary.json", "data.npz", "table.csv", *KINDS.values())
_RESULT_SUFFIXES = (".png", ".pdf", ".csv", ".npz", ".json")
#: Files of commands that write no run folder, never in one: `jaxattn demo`'s figure
#: (`cli.demo.FIGURE`).
NOT_IN_A_RUN = ("demo_sphere.png",)


def _a_runs_file(entry: Path) -> bool:
    """Whether `entry`, in an unfinished folder, is something a run, loop or sweep writes."""
    if entry.name in NOT_IN_A_RUN:
        return False
    return (_ours(entry.name) or entry.name in _RESULTS or entry.is_dir()
            or entry.suffix in _RESULT_SUFFIXES)


def written_by_jaxattn(path: Path) -> bool:
    """Whether the folder `path` is empty or jaxattn's own: it holds only what jaxattn
    writes first (`_ours`); or it is marked `INCOMPLETE` and holds only what a command
    writes into its folder (`_a_runs_file`: an interrupted run's settings file may be
    damaged); or it holds a settings file (`KINDS`) that `write_config` wrote (its
    `kind` and `run_id`, or jaxattn's version)."""
    entries = list(path.iterdir())
    names = [p.name for p in entries]
    if all(_ours(name) for name in names):
        return True
    if INCOMPLETE in names:
        return all(map(_a_runs_file, entries))
    return _a_commands(path)


def _a_commands(path: Path) -> bool:
    """Whether the folder `path` holds a settings file (`KINDS`) a command wrote."""
    for name in KINDS.values():
        record = read_settings(path / name)
        if ((record.get("kind") in KINDS and "run_id" in record)
                or "jaxattn" in (record.get("versions") or {})):
            return True
    return False


def results_around(path: Path) -> Path | None:
    """The folder of a command's results that `path` is or lies inside (a settings
    file a command wrote, or the `INCOMPLETE` marker), or `None`."""
    path = Path(path).absolute()
    return next((p for p in (path, *path.parents)
                 if p.is_dir() and ((p / INCOMPLETE).is_file() or _a_commands(p))), None)


def read_data(folder: Path) -> dict:
    """The arrays of `folder`'s `data.npz`, or a `RunFolderError` in one line where the
    file is damaged (cut short, another format, objects that need pickle)."""
    import zipfile

    path = Path(folder) / "data.npz"
    try:
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
        raise RunFolderError(f"{path} is damaged or not a jaxattn data file "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:80]}); re-run "
                             "the run.") from None


def check_writable_place(path: Path) -> None:
    """Refuse, before anything is written, to write into an existing folder that is
    neither empty nor jaxattn's (`written_by_jaxattn`: a model's folder, the current
    directory, any user's files) or that this process may not write."""
    with os_errors(path, "read"):
        foreign = path.is_dir() and not written_by_jaxattn(path)
        inside = next((p for p in path.absolute().parents if p.is_dir() and _a_commands(p)),
                      None)
    refuse_first((
        (path.is_file() or path.is_symlink() and not path.is_dir(),
         f"{path} is a file{' or a broken link' if path.is_symlink() else ''}, not a folder: "
         "a run writes a folder; choose another --out."),
        (inside is not None, f"{path} is inside the folder of another command's results "
                             f"({inside}), which a run does not write into; choose an "
                             "--out outside it."),
        (foreign, f"{path} holds files jaxattn did not write; a run writes only into a new "
                  "or empty folder or its own (choose another --out)."),
        (path.is_dir() and not os.access(path, os.W_OK | os.X_OK),
         f"cannot write the run folder {path}: permission denied."),
    ), RunFolderError)


@contextlib.contextmanager
def hold_folder(path, kind: str) -> Iterator[Path]:
    """Make the folder `path` if needed and hold an exclusive lock on it for the
    `with` block, for a command of `kind` (`"run"` or `"sweep"`).

    Raises `RunFolderError`, before anything is written, when the folder holds files
    jaxattn did not write (`check_writable_place`), cannot be written, is held by
    another command, or was made by another kind of command. A folder this call made
    and left empty (the block failed before writing) is removed again.
    """
    path = Path(path)
    check_writable_place(path)
    made = first_missing(path)
    with os_errors(path, "write"):
        path.mkdir(parents=True, exist_ok=True)
    fd = _lock(path)
    failed = True
    try:
        made_by = folder_kind(path)
        if made_by is not None and made_by != kind:
            command = (_settings_command(read_settings(path / KINDS["run"]))
                       if made_by == "run" else f"`jaxattn {made_by}`")
            raise RunFolderError(f"{path} holds a {command} folder; `jaxattn {kind}` does not "
                                 "write into it (choose another --out).")
        yield path
        failed = False
    finally:
        (path / LOCK).unlink(missing_ok=True)  # while locked: the next one makes a new one
        os.close(fd)
        if failed and made is not None:
            _remove_empty(path, made)


#: The settings that name the command of a run folder: `jaxattn run NAME` records its
#: experiment, `jaxattn loop` its model and passes.
_IDENTITY = ("experiment", "model", "passes")


def _settings_command(settings: dict[str, Any]) -> str:
    """The command that wrote a run folder's `settings`: `jaxattn loop` writes a
    config.json without an experiment, for its model and passes."""
    if "experiment" not in settings and "model" in settings and "passes" in settings:
        return "`jaxattn loop`"
    return "`jaxattn run`"


def _remove_empty(path: Path, top: Path) -> None:
    """Remove the folder `path` and its parents up to `top` while they are empty."""
    for p in (path, *path.parents):
        try:
            p.rmdir()
        except OSError:
            return
        if p == top:
            return


def check_not_held(path, *, writing: bool = False) -> None:
    """`RunFolderError`, naming its process id, when a live command holds the folder
    `path` (`hold_folder`): its files are still being written (so it is neither
    finished nor interrupted), or, `writing` into it, it is in use."""
    try:
        fd = os.open(Path(path) / LOCK, os.O_RDONLY)
    except OSError:
        return
    pid = None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.read(fd, 64).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # releases the shared lock taken when nobody held it
    if pid is not None:
        raise RunFolderError(
            f"{path} is in use by another jaxattn command (process {pid}); wait for it to end "
            "or choose another --out." if writing else f"{path} is being written by a "
            f"running jaxattn command (process {pid}); wait for it to end.")


def _lock(path: Path) -> int:
    """An exclusive `flock` on `path/LOCK`, or `RunFolderError` naming the holder."""
    while True:
        with os_errors(path, "write"):
            fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o666 & ~umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            check_not_held(path, writing=True)  # else its holder has just let it go
            continue
        try:  # the holder before us may have removed the file while we opened it
            same = os.fstat(fd).st_ino == os.stat(path / LOCK).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def start_run(path: Path) -> Path:
    """Mark the held folder `path` `INCOMPLETE` (`reopen_run` refuses a finished run)."""
    with os_errors(path, "write"):
        (path / INCOMPLETE).write_text("this run has not finished; its results are partial\n")
    return path


def finish_run(folder, summary: dict[str, Any], *, figures=None,
               seconds: float | None = None, run_id: str | None = None) -> dict[str, Any]:
    """Write `summary.json` and remove the `INCOMPLETE` marker: the run is complete.

    **Arguments:**

    - `summary`: what the run found.
    - `figures`: the figures' paths, recorded by name as `figures`.
    - `seconds`: the computing time, recorded as `seconds`.
    - `run_id`: the run's id, as in its `config.json` (recorded as `run_id`).

    **Returns:**

    The summary as written, with `seconds`, `figures`, `run_id` and `finished` added.
    """
    folder = Path(folder)
    names = None if figures is None else [Path(p).name for p in figures]
    added = {"seconds": seconds, "figures": names, "run_id": run_id}
    summary = {**summary, **{k: v for k, v in added.items() if v is not None}, "finished": stamp()}
    write_json(folder / "summary.json", summary)
    (folder / INCOMPLETE).unlink(missing_ok=True)
    return summary


def write_run(
    name: str,
    config: dict[str, Any],
    compute: Callable[[], dict[str, Any]],
    draw: Callable[[dict[str, Any], Path], list[Path]],
    summarise: Callable[[dict[str, Any], float], dict[str, Any]],
    *,
    out=None,
    announce: Callable[[Path], object] | None = None,
    resume: bool | None = None,
    same: tuple[str, ...] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Compute into a run folder, as `jaxattn run` does (`jaxattn loop`, which
    resumes in chunks, takes the same stages one by one).

    The stages, in order, all under the folder's lock (`hold_folder`): the folder
    (`runs/NAME/<timestamp>/` or `out`) marked `INCOMPLETE` and its `config.json`
    written (`reopen_run`: a folder of another command or other settings is
    refused); `data = compute()`, timed, while matplotlib is imported on another
    thread (`figures.import_ahead`); `data.npz`; `draw(data, folder)`;
    `summary.json` from `summarise(data, seconds)` (`finish_run`), which removes
    the marker. A failure at any stage leaves the folder marked `INCOMPLETE`,
    except a `ValueError` from `compute` that is no `SimulationError` (the
    arguments were refused): then a folder this call made is removed again.

    **Arguments:**

    - `name`: the folder's name under `runs/` when `out` is not given.
    - `config`: the run's settings (JSON-able; arrays become lists).
    - `compute`: the work; returns the arrays saved as `data.npz`.
    - `draw`: writes the figures into the folder and returns their paths.
    - `summarise`: what the run found, from the data and the computing time.
    - `announce`: called with the folder once its config is written.
    - `resume`: `None` for a computation that cannot resume (an unfinished run of
      the same settings in `out` is started over); else whether to continue the
      unfinished run in `out` (`compute` finds its pieces in the folder).
    - `same`: the keys of `config` a run already in `out` must share (default all).

    **Returns:**

    The folder and the summary as written.
    """
    path = folder_path(name, out, resume=resume)
    made = first_missing(path)
    with hold_folder(path, "run") as folder:
        finished, run_id = reopen_run(folder, config, resume, what="run", command="run",
                                      same=same)
        if finished:  # resumed, and nothing left to run
            return folder, read_json(folder / "summary.json")
        if announce is not None:
            announce(folder)
        start = time.perf_counter()
        figures.import_ahead()  # beside the simulation, which mostly waits on XLA
        try:
            data = compute()
        except ValueError as error:
            # refused arguments leave nothing behind; a simulation that failed while it
            # ran (a SimulationError) keeps its folder, marked INCOMPLETE
            if made is not None and not isinstance(error, SimulationError):
                shutil.rmtree(made, ignore_errors=True)
            raise
        seconds = time.perf_counter() - start
        save_npz(folder / "data.npz", **data)
        figures.imported()
        drawn = draw(data, folder)
        summary = summarise(data, seconds)
        return folder, finish_run(folder, summary, figures=drawn, seconds=seconds,
                                  run_id=run_id)


#: What to do with an unfinished folder, by its kind.
_UNFINISHED = {"run": "is an incomplete run (it was interrupted); re-run it (`jaxattn loop … "
                      "--resume --out DIR` continues a loop).",
               "sweep": "is an unfinished sweep; continue it with `jaxattn sweep … --resume "
                        "--out DIR`."}


def open_run_folder(path, kind: str = "run", needs: tuple[str, ...] = ()) -> Path:
    """A finished folder of `kind` (`"run"`, `"sweep"`: its settings file, then
    `summary.json` of the same `run_id`, and the files `needs`), or a `RunFolderError`
    saying why it cannot be used."""
    path = Path(path)
    check_not_held(path)
    files = (KINDS[kind], "summary.json", *needs)
    missing = [name for name in files if not (path / name).exists()]
    ids = [read_settings(path / name).get("run_id") for name in files[:2]]
    refuse_first((
        (not path.is_dir(), f"{path} is not a {kind} folder ("
         + ("a file" if path.exists() else "no such directory") + ")."),
        ((path / INCOMPLETE).exists(), f"{path} {_UNFINISHED[kind]}"),
        (missing, f"{path} has no {', '.join(missing)}; it is not a finished jaxattn {kind}."),
        (ids[0] != ids[1], f"{path} mixes two {kind}s ({files[0]} and summary.json have run "
                           f"ids {ids[0]} and {ids[1]}); re-run it into a new folder."),
    ), RunFolderError)
    return path


def read_json(path) -> Any:
    """The JSON value in the file `path`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_settings(path) -> dict[str, Any]:
    """The JSON object in the file `path`: `{}` when it is missing, unreadable or no
    object (a folder's settings file, read to tell who made the folder)."""
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def reopen_run(folder: Path, config: dict[str, Any], resume: bool | None, *, what: str,
               command: str, filename: str = "config.json",
               same: tuple[str, ...] | None = None) -> tuple[bool, str]:
    """Start a run in the held folder (`hold_folder`), or reopen the one it holds.

    A run already there must record the same value for every key of `config` (the
    run's settings; only the keys `same` when given) in its settings file `filename`:
    a folder of another command or other settings is refused, finished or not, unless
    a command that cannot resume finds an unfinished run there that saved nothing but
    its settings (it starts over). A
    resumable command (`resume` a bool) refuses it without `resume`, and continues
    an unfinished one on the same backend (`computed_elsewhere`); with `resume`, a
    folder that holds no run is refused. A command that cannot resume (`resume`
    `None`) starts an unfinished run of the same settings over, and refuses a
    finished one. `what`, `command`: its name in messages (`"loop"`, `"sweep"`).

    **Returns:**

    Whether the folder holds the finished run, and the run's id.
    """
    why, finished, old = [], False, {}  # what the folder holds that this run is not
    held = (folder / filename).exists()
    # an unfinished run that saved nothing but its settings (stopped by an error, e.g.
    # its step budget) holds no result: a command that cannot resume starts it over,
    # whatever its settings were
    bare = held and resume is None and (folder / INCOMPLETE).exists() and {
        p.name for p in folder.iterdir()} <= {filename, INCOMPLETE, LOCK}
    held = held and not bare
    if not held and resume:
        why.append(f"{folder} holds no {what} to resume (no {filename}); run it without "
                   "--resume.")
    if held:
        old = read_settings(folder / filename)
        if not old:  # damaged (a traceback, or a bare JSON error), or not a settings file
            raise RunFolderError(f"{folder / filename} is not a settings file jaxattn can "
                                 "read (damaged?): choose another --out.")
        finished = not (folder / INCOMPLETE).exists() and (folder / "summary.json").exists()
        holds = f"{folder} holds {'a finished' if finished else 'an unfinished'}"
        made_by, ours = _settings_command(old), _settings_command(config)
        if filename == KINDS["run"] and made_by != ours:  # which command first
            why.append(f"{holds} {made_by} run; {ours} does not write into it (choose "
                       "another --out).")
        for key in sorted(config if same is None else same, key=lambda k: k not in _IDENTITY):
            was, now = _jsonable(old.get(key)), _jsonable(config[key])
            if key not in old:
                why.append(f"{holds} run of another command (its {filename} has no {key}); "
                           "choose another --out.")
            elif json.dumps(was, sort_keys=True) != json.dumps(now, sort_keys=True):
                if isinstance(was, dict) and isinstance(now, dict):  # name the entry that differs
                    sub = next(k for k in sorted({*was, *now}, key=str)
                               if json.dumps(was.get(k), sort_keys=True)
                               != json.dumps(now.get(k), sort_keys=True))
                    key, was, now = f"{key} entry {sub!r}", was.get(sub), now.get(sub)
                values = f" ({was!r}, not {now!r})" if len(repr(was) + repr(now)) < 60 else ""
                why.append(f"{holds} {what} with another {key}{values}; one folder holds one "
                           f"{what} (choose another --out).")
        if not resume and (resume is False or finished):  # results are never overwritten
            # a finished one has nothing to continue
            advice = "pass --resume to continue it or " if resume is False and not finished \
                else ""
            why.append(f"{holds} {what}; {advice}choose another --out.")
        if resume is not None and not finished and (how := computed_elsewhere(old, command)):
            why.append(f"{folder} was computed {how}.")
    if why:
        raise RunFolderError(why[0])
    if held and (finished or resume is not None):
        return finished, old.get("run_id")
    start_run(folder)
    # the settings with what every run records: the command's `kind` (by its settings
    # file), the id `finish_run` writes into summary.json, how it computes
    run_id = uuid.uuid4().hex
    kind = {name: k for k, name in KINDS.items()}.get(filename, "run")
    write_json(folder / filename, config | {
        "versions": package_versions(), "started": stamp(), "argv": sys.argv[1:],
        "kind": kind, "run_id": run_id} | computed_on())
    return False, run_id


def computed_elsewhere(old: dict[str, Any], command: str) -> str | None:
    """How a run recorded in `old` (its settings file) was computed, when it cannot
    be continued here (else `None`): on another backend, or on a GPU with the other
    determinism setting, its results would mix parts computed two ways (`command`:
    the `jaxattn` command that resumes it)."""
    now = computed_on()
    backend = old.get("backend", now["backend"])
    deterministic = old.get("deterministic", now["deterministic"])
    if backend != now["backend"]:
        return (f"on {backend}, this process runs on {now['backend']}; resume it on {backend} "
                "(or choose another --out)")
    if backend != "cpu" and deterministic != now["deterministic"]:
        return (f"with XLA's deterministic GPU flags: resume it with `jaxattn {command} "
                "--resume` (in Python, set XLA_FLAGS=ja.deterministic_xla_flags() first)"
                if deterministic else "without XLA's deterministic GPU flags: resume it with "
                f"`jaxattn --nondeterministic {command} --resume`")
    return None


def clear_partial_writes(directory: Path) -> None:
    """Remove the temporary files of writes a kill cut off (`atomic_write`'s `.*.tmp`)."""
    for stale in Path(directory).glob(".*.tmp"):
        stale.unlink(missing_ok=True)
