"""What a sweep runs: `SweepSpec` (an experiment, its grid points, the instances per
point), read from TOML/JSON (`read_spec`) and checked and expanded into one full
config per grid point (`check_spec`)."""

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from .._validate import check_count, check_seed, machine_memory, refuse_first, too_big
from ..experiments import SWEEPABLE, Param, convert, experiment_config, get_experiment
from ._instances import EXCLUDED

#: The memory a row of a sweep's table takes while the table is assembled and read
#: (`_driver._assemble`, `load_table`): measured 166 B peak at 4 × 10⁶ rows (218 B at
#: 10⁶, where a block's text weighs more; tracemalloc, Python 3.11).
TABLE_ROW_BYTES = 170
_SPEC_KEYS = ("experiment", "grid", "points", "set", "instances", "seed", "chunk")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs: an experiment, its grid points and the instances per point.

    - `experiment`: a name of `jaxattn list` that has a sweep set-up
      (`thm41-sphere`, `thm51-causal`, `thm52-symmetric`, `thm32-gradient`).
    - `grid`: `{parameter: [values]}`, every combination (the last parameter varies
      fastest); or `points`: a list of `{parameter: value}`; not both.
    - `set`: parameters fixed for every point (e.g. `{"horizon": 5.0}`).
    - `instances`: random instances per point; `seed`: instance `i` uses `seed + i`.
    - `chunk`: instances per saved chunk (default: as many as take an eighth of this
      machine's memory, at most a whole point).
    """

    experiment: str
    grid: dict[str, list] = dataclasses.field(default_factory=dict)
    points: list[dict[str, Any]] | None = None
    set: dict[str, Any] = dataclasses.field(default_factory=dict)
    instances: int = 64
    seed: int = 0
    chunk: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sweep_params(experiment: str) -> tuple[Param, ...]:
    """The parameters a sweep of `experiment` can set or vary: exactly the overrides
    of `jaxattn run NAME` (`beta` among them), less `samples`, which a sweep's
    `instances` replace. So instance `i` of a point is `jaxattn run NAME --seed
    seed+i` with the point's values (and, for thm51-causal, `--samples 1`)."""
    if experiment not in SWEEPABLE:
        get_experiment(experiment)  # unknown name: its error lists the names
        raise ValueError(f"{experiment} has no sweep set-up; sweepable: {', '.join(SWEEPABLE)}.")
    return tuple(p for p in get_experiment(experiment).all_params() if p.name not in EXCLUDED)


def grid_keys(spec: SweepSpec) -> list[str]:
    """The parameters that vary between the points, in the table's column order."""
    if not spec.points:
        return list(spec.grid)
    return list(dict.fromkeys(k for pt in spec.points for k in pt))


def _points(spec: SweepSpec, params: dict[str, Param]) -> list[dict[str, Any]]:
    """The grid points, each `{parameter: value}` in the parameters' types (`convert`,
    the one check of a parameter value)."""
    if spec.points:
        return [{k: convert(params[k], v) for k, v in pt.items()} for pt in spec.points]
    axes = {}
    for k, values in spec.grid.items():
        axes[k] = [convert(params[k], v) for v in values]
        if len(set(axes[k])) != len(axes[k]):
            raise ValueError(f"grid {k} repeats a value: {values!r}.")
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def check_spec(spec: SweepSpec) -> list[dict[str, Any]]:
    """Check a spec and expand it into the full config of every grid point.

    **Arguments:**

    - `spec`: the `SweepSpec`.

    **Returns:**

    One config per point (every parameter of the experiment, plus `seed`), in
    the order the points run. A `ValueError` names any mistake.
    """
    params = {p.name: p for p in sweep_params(spec.experiment)}
    spec = with_counts(spec)
    varied = grid_keys(spec)
    names = [*spec.set, *varied]
    both = [name for name in varied if name in spec.set]
    checks = [(spec.grid and spec.points, "give either a grid or a list of points, not both."),
              (both, f"{', '.join(both)} is both fixed (`set`, --set) and varied (`grid` or "
               "`points`, --grid); give it in one of them.")]
    checks += [(name in EXCLUDED, f"{name} is set by the sweep's instances (use --instances).")
               for name in names]
    checks += [(name not in params, f"{spec.experiment} has no parameter {name!r}; a sweep "
                f"can vary {', '.join(params)}.") for name in names]
    checks += [(not isinstance(values, (list, tuple)) or not values,
                f"grid {k} needs a non-empty list of values, got {values!r}.")
               for k, values in spec.grid.items()]
    refuse_first(checks)
    fixed = {k: convert(params[k], v) for k, v in spec.set.items()}
    base = {p.name: p.default for p in params.values()} | fixed
    configs = [base | pt | {"seed": spec.seed} for pt in _points(spec, params)]
    experiment = get_experiment(spec.experiment)
    one = {p.name: 1 for p in experiment.all_params() if p.name in EXCLUDED}  # a sample
    for c in configs:  # each point checked as `jaxattn run` checks its instance (sizes too)
        experiment_config(experiment, {k: v for k, v in c.items() if k != "seed"} | one,
                          spec.seed)
    rows, memory = len(configs) * spec.instances, machine_memory()
    points = f"{len(configs)} point{'s' * (len(configs) > 1)}"
    refuse_first([too_big(
        rows * TABLE_ROW_BYTES, f"{points} × {spec.instances} instances = {rows:.3g} table "
        "rows need about", f"run at most {memory // TABLE_ROW_BYTES // len(configs)} instances "
        "a point, or split the grid over several sweeps (a table is assembled in memory)",
        memory)])
    return configs


def with_counts(spec: SweepSpec) -> SweepSpec:
    """`spec` with `instances`, `seed` and `chunk` checked, as Python ints."""
    instances = check_count(spec.instances, "instances", 1)
    return dataclasses.replace(
        spec, instances=instances, seed=check_seed(spec.seed, "seed", instances),
        chunk=None if spec.chunk is None else check_count(spec.chunk, "chunk", 1))


def read_spec(path) -> SweepSpec:
    """A `SweepSpec` from a TOML or JSON file (keys as the fields of `SweepSpec`).

    **Arguments:**

    - `path`: a `.toml` or `.json` file.

    **Returns:**

    The `SweepSpec`; a `ValueError` if the file cannot be read or has unknown keys.
    """
    path = Path(path)
    unreadable = None
    try:
        text = path.read_bytes()
        raw = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text.decode())
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        raw, unreadable = None, (
            f"cannot read the sweep spec {path}: {e.strerror or e}" if isinstance(e, OSError)
            else f"{path} is not valid {path.suffix.lstrip('.').upper()}: {e}")
    unknown = sorted(set(raw) - set(_SPEC_KEYS)) if isinstance(raw, dict) else []
    refuse_first((
        (unreadable, unreadable),
        (not isinstance(raw, dict) or "experiment" not in raw,
         f"{path} must name an experiment (experiment = \"thm41-sphere\")."),
        (unknown, f"{path}: unknown key(s) {unknown}; a spec takes {list(_SPEC_KEYS)}."),
    ))
    return SweepSpec(**raw)
