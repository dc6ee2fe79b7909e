"""Parameter sweeps with per-instance outcomes, saved chunk by chunk and resumable.

A sweep is the plain function `ja.sweep.run` (`run_sweep`); `SWEEPABLE` names the
experiments it runs (the objects are `ja.experiments.EXPERIMENTS`).

```python
import jaxattn as ja

result = ja.sweep.run("thm41-sphere", {"beta": [0.5, 1, 2, 4], "heads": [1, 2, 4]},
                      instances=512, set={"horizon": 5.0}, out="runs/my-sweep")
result.table["consensus_time"]           # one row per instance
ja.sweep.run("runs/my-sweep/spec.toml")  # or from a TOML/JSON spec file
```

The older spellings stay as aliases: `ja.sweep(...)` calls `ja.sweep.run(...)`,
and `ja.sweep.EXPERIMENTS` is `SWEEPABLE`.

Each grid point's instances run as one `jax.vmap`ped batch, instance `i` as
`jaxattn run NAME --seed seed+i`. The command line, the table's `COLUMNS` and its
statuses: docs/usage/sweeps.md.

`ja.sweep.redraw(folder)` (`jaxattn plot DIR`) is jaxattn's one `redraw`: a sweep's
`sweep.png` from `table.csv` (`redraw_sweep`), a run or loop folder's figures through
`ja.experiments.redraw_run`.
"""

import sys as _sys
import types as _types

from ..experiments import SWEEPABLE as _SWEEPABLE
from ._driver import COLUMNS as COLUMNS
from ._driver import SweepResult as SweepResult
from ._driver import load_table as load_table
from ._driver import redraw as redraw
from ._driver import redraw_sweep as redraw_sweep
from ._driver import run_sweep as run
from ._report import format_table as format_table
from ._spec import SweepSpec as SweepSpec
from ._spec import check_spec as check_spec
from ._spec import read_spec as read_spec
from ._spec import sweep_params as sweep_params

#: The names of the experiments that can be swept (`ja.experiments.SWEEPABLE`).
SWEEPABLE: tuple[str, ...] = _SWEEPABLE
#: The older name of `SWEEPABLE` (names, not the objects of `ja.experiments.EXPERIMENTS`).
EXPERIMENTS = SWEEPABLE

__all__ = ["COLUMNS", "EXPERIMENTS", "SWEEPABLE", "SweepResult", "SweepSpec", "check_spec",
           "format_table", "load_table", "read_spec", "redraw", "redraw_sweep", "run",
           "sweep_params"]


class _RunOnCall(_types.ModuleType):
    """The older spelling `ja.sweep(...)`, an alias of `ja.sweep.run(...)`."""

    def __call__(self, *args, **kwargs) -> SweepResult:
        return run(*args, **kwargs)


_sys.modules[__name__].__class__ = _RunOnCall
