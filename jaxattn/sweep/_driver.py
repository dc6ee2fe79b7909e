"""Running a sweep: a grid of experiment parameters × random instances, saved chunk
by chunk so that a killed sweep resumes where it stopped (`run_sweep`), and reading
its table back (`load_table`). What a sweep runs is `_spec.py`.

A sweep folder holds `sweep.json` (written first), `chunks/NNNNN.csv` (one per batch
of instances, each written to a temporary name and renamed), and, once every chunk is
there, `table.csv`, `sweep.png`/`.pdf` and `summary.json`; it is marked `INCOMPLETE`
until then. The columns, and why a resumed table is byte for byte the same:
docs/usage/sweeps.md.
"""

import contextlib
import dataclasses
import itertools
import math
import shutil
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from .._artifacts.folders import (
    INCOMPLETE,
    RunFolderError,
    check_not_held,
    finish_run,
    folder_kind,
    folder_path,
    hold_folder,
    open_run_folder,
    read_json,
    reopen_run,
)
from .._batch import as_mesh
from .._files import atomic_write
from .._horizon import CONSENSUS_TOL
from .._process.distributed import agree, check_flags, initialize, is_writer
from .._validate import machine_memory, refuse_first, too_big
from ..experiments import redraw_run
from ..metrics import consensus_time
from ._instances import LANES, instance_bytes, simulate_chunk, theorem_of
from ._report import PREDICTION_HELD, instance_status, summarise, write_figure
from ._spec import SweepSpec, check_spec, grid_keys, read_spec, sweep_params, with_counts

#: The columns of a sweep table, after the grid parameters.
COLUMNS = ("point", "instance", "seed", "theorem", "final_E", "consensus_time", "in_domain",
           "outcome_reached", "prediction_held", "solver_success", "num_steps", "status")


#: A sweep that would take longer than this (seconds, at its first chunk's pace) says so.
LONG_SWEEP = 3600


def plan(spec: SweepSpec, configs) -> list[tuple[int, int, int]]:
    """The chunks, in order: `(point, first instance, stop)`. A chunk holds `spec.chunk`
    instances, by default as many as take an eighth of this machine's memory
    (`instance_bytes`; a multiple of `LANES`, at most a whole point), so that a large
    sweep neither runs out of memory nor loses more than one chunk's work to a kill."""
    memory = machine_memory()
    plans = []
    for p, config in enumerate(configs):
        size = min(spec.chunk or spec.instances, spec.instances)
        need = instance_bytes(spec.experiment, config) if memory else 0
        point = ", ".join(f"{k} = {_fmt(config[k])}" for k in grid_keys(spec)) or "its point"
        refuse_first([too_big(need, f"one instance at {point} needs about", "choose fewer "
                              "tokens, a smaller dimension or fewer saves", memory)])
        if spec.chunk:
            refuse_first([too_big(size * need, f"chunk = {spec.chunk} (--chunk): a chunk of "
                                  f"{size} instances needs about", f"take a smaller chunk (at "
                                  f"most {memory // max(need, 1)}), or leave it to the sweep",
                                  memory)])
        if not spec.chunk and memory:
            size = min(size, max(memory // 8 // need // LANES * LANES, LANES))
        plans += [(p, lo, min(lo + size, spec.instances))
                  for lo in range(0, spec.instances, size)]
    return plans


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (float, np.floating)):
        return repr(float(v))  # shortest text that reads back to the same float
    return str(v)


def _rows(spec, config, keys, point, lo, out, theorem) -> list[list[str]]:
    """One table row per instance of a chunk (`out` from `simulate_chunk`)."""
    E = out["E"]
    t_cons = np.asarray(consensus_time(out["ts"][0], E, CONSENSUS_TOL))
    residual = out.get("residual", E)
    rows = []
    for j in range(E.shape[0]):
        inside, reached = bool(out["in_domain"][j]), bool(out["reached"][j])
        success = bool(out["success"][j])
        status = instance_status(success, inside, reached, out["ts"][j], residual[j],
                                 theorem)
        # a failed solve measured nothing: its E and consensus time are empty (NaN)
        final, when = (E[j, -1], t_cons[j]) if success else (math.nan, math.nan)
        rows.append([_fmt(config[k]) for k in keys] + [
            str(point), str(lo + j), str(spec.seed + lo + j), theorem, _fmt(final),
            _fmt(when), _fmt(inside), _fmt(reached), PREDICTION_HELD[status], _fmt(success),
            str(int(out["num_steps"][j])), status])
    return rows


def _csv(header, rows) -> bytes:
    """The text of a CSV file: `header` and `rows` (lists of cells)."""
    return "".join(",".join(r) + "\n" for r in [header, *rows]).encode()


def _header(grid_keys) -> list[str]:
    return list(grid_keys) + list(COLUMNS)


def _chunk_path(folder: Path, index: int) -> Path:
    return folder / "chunks" / f"{index:05d}.csv"


def _fits_plan(path: Path, header: list[str], expected: int) -> bool:
    """Whether a saved chunk has `header` and `expected` rows."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return bool(lines) and lines[0] == ",".join(header) and len(lines) - 1 == expected


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """A finished sweep: its folder, the table (column → array) and the summary."""

    folder: Path
    table: dict[str, np.ndarray]
    summary: dict[str, Any]


def _sidecar(spec: SweepSpec, configs, keys, chunks) -> dict[str, Any]:
    """`sweep.json`: everything needed to re-run or resume the sweep, and the
    consensus tolerance its table and report use."""
    return {"spec": spec.to_json(), "points": configs, "grid_keys": keys,
            "columns": _header(keys), "chunks": [list(c) for c in chunks],
            "tolerance": CONSENSUS_TOL, "dtype": str(jax.numpy.result_type(float)),
            "devices": jax.device_count(), "processes": jax.process_count()}


def run_sweep(
    spec: SweepSpec | str | Path,
    grid: dict[str, list] | None = None,
    *,
    points: list[dict[str, Any]] | None = None,
    set: dict[str, Any] | None = None,
    instances: int | None = None,
    seed: int | None = None,
    chunk: int | None = None,
    out=None,
    resume: bool = False,
    devices=None,
    distributed: bool = False,
    progress: bool = True,
    log=print,
) -> SweepResult | None:
    """Run a sweep: every grid point's instances as vmapped batches, saved chunk by chunk.

    **Arguments:**

    - `spec`: a `SweepSpec`, an experiment name (`"thm41-sphere"`) or the path of a
      TOML/JSON spec file. The keyword arguments override its fields.
    - `grid`, `points`, `set`, `instances`, `seed`, `chunk`: as in `SweepSpec`.
    - `out`: the sweep folder (default `runs/sweep-NAME/<timestamp>/`).
    - `resume`: continue the sweep already in `out`, skipping its finished chunks
      (its spec must be the same); without it an existing sweep is an error.
    - `devices`: shard each batch over devices (`None`: all of them when there are
      several); results equal the one-device run.
    - `distributed`: run as one of several processes (`jax.distributed`, joined from
      the environment unless joined already): each batch is sharded over the devices
      of every process, process 0 alone writes (docs/usage/distributed.md).
    - `progress`: show a progress bar (instances, rate, time left); `log`: where
      messages go.

    **Returns:**

    A `SweepResult(folder, table, summary)`; `None` on a process other than 0 of a
    distributed sweep.
    """
    spec = _as_spec(spec, grid=grid, points=points, set=set, instances=instances, seed=seed,
                    chunk=chunk)
    path = folder_path(f"sweep-{spec.experiment}", out, resume=resume)
    configs = check_spec(spec)
    if resume:
        spec, configs = _as_saved(spec, configs, path)
    params = sweep_params(spec.experiment)
    keys = grid_keys(spec)
    chunks = plan(spec, configs)
    as_mesh(devices)  # every argument is checked before the folder is made
    if distributed:
        check_flags(devices=devices)
        initialize()
        devices = as_mesh(jax.devices())  # every process's devices
        flat = agree(lambda: [v for c in chunks for v in c])  # process 0's: memories differ
        chunks = [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]
    writer = is_writer()
    log, progress = (log, progress) if writer else (lambda *_: None, False)
    sidecar = _sidecar(spec, configs, keys, chunks)
    run_id = None

    def reopen():  # on process 0: the check for an existing sweep, sweep.json written
        nonlocal run_id
        finished, run_id = reopen_run(folder, sidecar, resume, what="sweep", command="sweep",
                                      filename="sweep.json", same=("spec", "points", "dtype"))
        return [finished]

    # process 0 alone holds and writes the folder; the others follow its plan
    with hold_folder(path, "sweep") if writer else contextlib.nullcontext(path) as folder:
        finished = agree(reopen)[0]
        if finished:
            log(f"{folder} holds this sweep, finished; nothing to run")
        else:
            _run_chunks(folder, spec, configs, params, keys, chunks, devices, progress, log,
                        simulate_chunk)
        if not writer:
            return None
        table = load_table(folder) if finished else _assemble(folder, keys, chunks)
        summary = summarise(spec, configs, keys, table)
        if not finished:
            figures = write_figure(folder, spec, keys, table)
            finish_run(folder, summary, figures=figures, run_id=run_id)
        return SweepResult(folder, table, read_json(folder / "summary.json"))


def _as_spec(spec, **overrides) -> SweepSpec:
    if isinstance(spec, (str, Path)) and Path(spec).suffix.lower() in (".toml", ".json"):
        spec = read_spec(spec)
    elif isinstance(spec, str):
        spec = SweepSpec(spec)
    elif not isinstance(spec, SweepSpec):
        raise TypeError(f"a sweep takes a SweepSpec, an experiment name or a spec file, "
                        f"got {type(spec).__name__}.")
    given = {k: v for k, v in overrides.items() if v is not None and (k != "grid" or v)}
    return with_counts(dataclasses.replace(spec, **given))


def _as_saved(spec: SweepSpec, configs, path: Path):
    """`(spec, configs)` as the sweep saved in `path` recorded them, where they differ
    from the resumed one only in how it was written (a `set` value given or taken by
    default, `5` for `5.0`) or in an omitted `chunk` (the saved plan's); otherwise as
    given, for `reopen_run` to name what differs."""
    try:
        saved = SweepSpec(**read_json(path / "sweep.json")["spec"])
        if spec.chunk is None:
            spec = dataclasses.replace(spec, chunk=saved.chunk)
        same = (saved.experiment == spec.experiment and grid_keys(saved) == grid_keys(spec)
                and (saved.instances, saved.seed, saved.chunk)
                == (spec.instances, spec.seed, spec.chunk) and check_spec(saved) == configs)
    except (OSError, ValueError, TypeError, KeyError):  # no sweep there, or another's
        return spec, configs
    return (saved, configs) if same else (spec, configs)


def _run_chunks(folder, spec, configs, params, keys, chunks, devices, progress, log, simulate):
    """Run and save every chunk of the plan that is not saved yet (which ones: process
    0 reads its folder and tells the others)."""
    header = _header(keys)
    todo = [(i, chunks[i]) for i in agree(lambda: _unsaved(folder, header, chunks))]
    done = sum(c[2] - c[1] for c in chunks) - sum(c[2] - c[1] for _, c in todo)
    if len(todo) < len(chunks):
        log(f"resuming {folder}: {len(chunks) - len(todo)} of {len(chunks)} chunks done")
    else:
        log(f"jaxattn sweep {spec.experiment} → {folder} ({len(configs):,} point"
            f"{'s' * (len(configs) > 1)} × {spec.instances:,} instances, {len(chunks):,} "
            f"chunk{'s' * (len(chunks) > 1)})")
    if devices is None and jax.device_count() > 1:
        devices = jax.device_count()
    total = len(configs) * spec.instances
    start = time.monotonic()
    with tqdm(total=total, initial=done, unit="inst", desc=f"sweep {spec.experiment}",
              disable=not progress, smoothing=0.1) as bar:
        for k, (index, (point, lo, hi)) in enumerate(todo):
            config = configs[point]
            out = simulate(spec.experiment, config, params, range(spec.seed + lo, spec.seed + hi),
                           devices)
            rows = _rows(spec, config, keys, point, lo, out, theorem_of(spec.experiment))
            data = _csv(header, rows)
            if is_writer():
                atomic_write(_chunk_path(folder, index), lambda f, data=data: f.write(data))
            bar.update(hi - lo)
            if k == 0 and len(todo) > 1:  # its compilation included: an upper bound
                left = (time.monotonic() - start) / (hi - lo) * (total - done - (hi - lo))
                if left > LONG_SWEEP:
                    log(f"about {left / 3600:.3g} hours left at the first chunk's pace; a "
                        "stopped sweep continues with the same command and --resume")


def _unsaved(folder: Path, header: list[str], chunks) -> list[int]:
    """The indexes of the chunks not saved (or not fitting the plan) in `folder`."""
    (folder / "chunks").mkdir(exist_ok=True)
    for stale in (folder / "chunks").glob(".*.tmp"):  # a write cut off by a kill
        stale.unlink(missing_ok=True)
    return [i for i, (_, lo, hi) in enumerate(chunks)
            if not (_chunk_path(folder, i).exists()
                    and _fits_plan(_chunk_path(folder, i), header, hi - lo))]


def _assemble(folder: Path, keys, chunks) -> dict[str, np.ndarray]:
    """Concatenate the chunks, in plan order, into `table.csv` (atomically), one file at
    a time: the table is never held whole as text."""
    def write(table):
        table.write(_csv(_header(keys), []))
        for i in range(len(chunks)):  # each fits the plan: `_run_chunks` made sure
            with _chunk_path(folder, i).open("rb") as chunk:
                chunk.readline()  # its header
                shutil.copyfileobj(chunk, table)

    atomic_write(folder / "table.csv", write)
    return load_table(folder)


def redraw(folder) -> list[Path]:
    """Draw any finished jaxattn folder's figures again (`jaxattn plot DIR`), by its
    kind: a sweep folder's by `redraw_sweep`, a run or loop folder's by
    `ja.experiments.redraw_run`. It lives here, the lowest layer that knows both.

    **Arguments:**

    - `folder`: a sweep, run or loop folder.

    **Returns:**

    The paths of the figures written; a `RunFolderError` (one line) for a folder
    that is no jaxattn folder, is held by a live command or holds no finished run.
    """
    folder = Path(folder)
    check_not_held(folder)  # a live command's folder is neither finished nor interrupted
    kind = folder_kind(folder) if folder.is_dir() else "run"  # "run": redraw says why not
    if kind is None and not (folder / INCOMPLETE).exists():
        raise RunFolderError(f"{folder} is not a jaxattn folder (no config.json or "
                             "sweep.json); `jaxattn plot` redraws run, loop and sweep folders.")
    return redraw_sweep(folder) if kind == "sweep" else redraw_run(folder)


def redraw_sweep(folder) -> list[Path]:
    """Draw a finished sweep's figure again from its `sweep.json` and `table.csv`.

    **Arguments:**

    - `folder`: the sweep folder.

    **Returns:**

    The paths of `sweep.png` and `sweep.pdf`; a `RunFolderError` (one line) for a
    folder that holds no finished sweep.
    """
    folder = open_run_folder(folder, "sweep", needs=("table.csv",))
    sidecar = read_json(folder / "sweep.json")
    spec = SweepSpec(**sidecar["spec"])
    return write_figure(folder, spec, sidecar["grid_keys"], load_table(folder))


def _labels(cells: np.ndarray) -> np.ndarray:
    """Text cells as an object array, each distinct text one string (8 bytes a row)."""
    texts, index = np.unique(cells, return_inverse=True)
    return texts.astype(object)[index.reshape(cells.shape)]


def _parse(cells: np.ndarray) -> np.ndarray:
    """A column of the grid's values: flags as bool, whole numbers as int, else float."""
    if np.isin(cells, ("true", "false")).all():
        return cells == "true"
    try:
        return cells.astype(np.int64)
    except ValueError:
        return cells.astype(np.float64)


#: How `load_table` reads a column, by name; any other column by `_parse`.
_READERS = {
    **dict.fromkeys(("theorem", "status"), _labels),
    **dict.fromkeys(("in_domain", "outcome_reached", "solver_success"),
                    lambda cells: cells == "true"),
    # `None` where undecided (an empty cell)
    "prediction_held": lambda cells: np.array([None, False, True], dtype=object)[
        (cells == "false") + 2 * (cells == "true")],
    **dict.fromkeys(("point", "instance", "seed", "num_steps"),
                    lambda cells: cells.astype(np.int64)),
}
#: The rows `load_table` parses at once (its text is held only a block at a time).
BLOCK_ROWS = 2**16


def load_table(folder) -> dict[str, np.ndarray]:
    """A sweep's `table.csv` as columns: numbers as float/int arrays, flags as bool
    arrays (`prediction_held`: an object array with `None` where undecided), `theorem`
    and `status` as object arrays of text. A table written before the `status` column
    existed is read as it is (without it)."""
    path = Path(folder) / "table.csv"
    if not path.exists():
        raise RunFolderError(f"{folder} has no table.csv; it is not a finished sweep.")
    with path.open(encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split(",")
        blocks = [_block(path, header, lines)
                  for lines in iter(lambda: list(itertools.islice(f, BLOCK_ROWS)), [])]
    blocks = blocks or [_block(path, header, [])]
    return {name: np.concatenate([block[i] for block in blocks])
            for i, name in enumerate(header)}


def _block(path: Path, header: list[str], lines: list[str]) -> list[np.ndarray]:
    """The columns of a block of a table's lines, each read by its reader."""
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    cells = np.array(text.replace("\n", ",").split(",")[:-1], dtype=str)
    if cells.size != len(lines) * len(header):
        raise RunFolderError(f"{path} has rows of other lengths than its header's "
                             f"{len(header)} columns; run the sweep again.")
    cells = cells.reshape(len(lines), len(header))
    return [_READERS.get(name, _parse)(cells[:, i]) for i, name in enumerate(header)]
