"""Run folders: every command that computes something saves it the same way.

A run folder holds `config.json` (everything needed to re-run it, with the seed
and package versions), `data.npz`, figures (PNG and PDF) and, written last,
`summary.json`. While a run is in progress the folder holds a file named
`INCOMPLETE`; it is removed only after everything else is written, so a folder
without it is complete. Every file is written to a temporary name and renamed,
so no file is ever half-written.
"""

import datetime as _dt
import json
import os
import platform
import tempfile
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


def _atomic_write(path: Path, write) -> Path:
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
    return _atomic_write(Path(path), lambda f: f.write(text.encode()))


def save_npz(path, **arrays) -> Path:
    """Save arrays to a compressed `.npz`, atomically."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    return _atomic_write(Path(path), lambda f: np.savez_compressed(f, **arrays))


def create_run_folder(name: str, out: str | os.PathLike | None = None, root="runs") -> Path:
    """Make `runs/NAME/<timestamp>/` (or `out`), marked `INCOMPLETE` until finished.

    Raises `RunFolderError` with the reason when the folder cannot be written, or
    when `out` already holds a complete run (results are never overwritten).
    """
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        path = Path(root) / name / stamp
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


def finish_run(path, summary: dict[str, Any]) -> Path:
    """Write `summary.json` and remove the `INCOMPLETE` marker: the run is complete."""
    path = Path(path)
    write_json(path / "summary.json", summary)
    (path / INCOMPLETE).unlink(missing_ok=True)
    return path


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
    with open(path, encoding="utf-8") as f:
        return json.load(f)
