"""Run folders: every command that computes something saves it the same way.

A run folder holds `config.json` (everything needed to re-run it, with the seed,
package versions, start time and command-line arguments), `data.npz`, figures
(PNG and PDF) and, written last, `summary.json` (with the computing time and the
figures' names). While a run is in progress the folder holds a file named
`INCOMPLETE`; it is removed only after everything else is written, so a folder
without it is complete. Every file is written to a temporary name and renamed,
so no file is ever half-written.

`write_run` is the one writer of these stages; a command whose folder differs
(the resumable sweep: `sweep.json`, chunks, `table.csv`) calls them one by one:
`create_run_folder`, `write_config`, `finish_run`.
"""

import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

INCOMPLETE = "INCOMPLETE"


class RunFolderError(RuntimeError):
    """A run folder that cannot be created, read or is incomplete."""


def package_versions() -> dict[str, str]:
    """Versions of jaxattn and the packages its results depend on."""
    out = {"python": platform.python_version()}
    for name in ("jaxattn", "jax", "jaxlib", "diffrax", "equinox", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def stamp() -> str:
    """The local time now, to the second, as ISO 8601 with the UTC offset."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def atomic_write(path, write: Callable[[Any], object]) -> Path:
    """Write a file through `write(binary_file)` under a temporary name, then rename
    it to `path`: a reader never sees it half-written.

    **Returns:**

    `path`.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # NumPy / JAX arrays and scalars
        return _jsonable(np.asarray(obj).tolist())
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)  # JSON has no inf/nan
    return obj


def write_json(path, obj: Any) -> Path:
    """Write `obj` as indented JSON, atomically (arrays become lists)."""
    text = json.dumps(_jsonable(obj), indent=2, ensure_ascii=False) + "\n"
    return atomic_write(Path(path), lambda f: f.write(text.encode()))


def save_npz(path, **arrays) -> Path:
    """Save arrays to a compressed `.npz`, atomically."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    return atomic_write(Path(path), lambda f: np.savez_compressed(f, **arrays))


def create_run_folder(name: str, out: str | os.PathLike | None = None, root="runs") -> Path:
    """Make `runs/NAME/<timestamp>/` (or `out`), marked `INCOMPLETE` until finished.

    Raises `RunFolderError` with the reason when the folder cannot be written, or
    when `out` already holds a complete run (results are never overwritten).
    """
    if out is None:
        path = Path(root) / name / _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    else:
        path = Path(out)
    if (path / "summary.json").exists() and not (path / INCOMPLETE).exists():
        raise RunFolderError(f"{path} already holds a finished run; choose another --out.")
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / INCOMPLETE).write_text("this run has not finished; its results are partial\n")
    except OSError as e:
        raise RunFolderError(f"cannot write the run folder {path}: {e.strerror or e}") from e
    return path


def write_config(folder, config: dict[str, Any], filename: str = "config.json") -> Path:
    """Write a run's settings with the package versions, the start time and the
    command-line arguments (`versions`, `started`, `argv`) added.

    **Returns:**

    The path written.
    """
    record = config | {"versions": package_versions(), "started": stamp(), "argv": sys.argv[1:]}
    return write_json(Path(folder) / filename, record)


def finish_run(folder, summary: dict[str, Any], *, figures=None,
               seconds: float | None = None) -> dict[str, Any]:
    """Write `summary.json` and remove the `INCOMPLETE` marker: the run is complete.

    **Arguments:**

    - `summary`: what the run found.
    - `figures`: the figures' paths, recorded by name as `figures`.
    - `seconds`: the computing time, recorded as `seconds`.

    **Returns:**

    The summary as written, with `seconds`, `figures` and `finished` added.
    """
    folder = Path(folder)
    summary = dict(summary)
    if seconds is not None:
        summary["seconds"] = seconds
    if figures is not None:
        summary["figures"] = [Path(p).name for p in figures]
    summary["finished"] = stamp()
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
) -> tuple[Path, dict[str, Any]]:
    """Compute into a run folder: the one writer of `jaxattn run`, `jaxattn loop`.

    The stages, in order: the folder (`runs/NAME/<timestamp>/` or `out`) marked
    `INCOMPLETE`; `config.json` (`write_config`); `data = compute()`, timed;
    `data.npz`; `draw(data, folder)`; `summary.json` from `summarise(data,
    seconds)` (`finish_run`), which removes the marker. A failure at any stage
    leaves the folder marked `INCOMPLETE`.

    **Arguments:**

    - `name`: the folder's name under `runs/` when `out` is not given.
    - `config`: the run's settings (JSON-able; arrays become lists).
    - `compute`: the work; returns the arrays saved as `data.npz`.
    - `draw`: writes the figures into the folder and returns their paths.
    - `summarise`: what the run found, from the data and the computing time.
    - `announce`: called with the folder once its config is written.

    **Returns:**

    The folder and the summary as written.
    """
    folder = create_run_folder(name, out)
    write_config(folder, config)
    if announce is not None:
        announce(folder)
    start = time.perf_counter()
    data = compute()
    seconds = time.perf_counter() - start
    save_npz(folder / "data.npz", **data)
    figures = draw(data, folder)
    return folder, finish_run(folder, summarise(data, seconds), figures=figures, seconds=seconds)


def open_run_folder(path) -> Path:
    """A finished run folder, or `RunFolderError` saying why it cannot be used."""
    path = Path(path)
    if not path.is_dir():
        raise RunFolderError(f"{path} is not a run folder (no such directory).")
    if (path / INCOMPLETE).exists():
        raise RunFolderError(f"{path} is an incomplete run (it was interrupted); re-run it.")
    for required in ("config.json", "summary.json"):
        if not (path / required).exists():
            raise RunFolderError(f"{path} has no {required}; it is not a finished jaxattn run.")
    return path


def read_json(path) -> Any:
    """The JSON value in the file `path`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)
