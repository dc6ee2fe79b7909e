"""Drawing a finished run folder's figures again (`redraw_run`): a `jaxattn run NAME`
folder by its experiment's own `draw`, a `jaxattn loop` folder by the loop figures
(`loop_grid.redraw_loop`), from their `config.json` and `data.npz` alone.
`ja.sweep.redraw`, the one `redraw` of any folder (what `jaxattn plot DIR` runs),
takes these through `redraw_run` and sweep folders through `redraw_sweep`."""

from pathlib import Path

from .._artifacts.folders import RunFolderError, open_run_folder, read_data, read_json
from . import EXPERIMENTS
from .loop_grid import is_loop_config, redraw_loop


def redraw_run(folder) -> list[Path]:
    """Draw a finished run's figures again from its `config.json` and `data.npz`:
    a `jaxattn run NAME` folder (`loop --grid` included: it is the `loop-grid`
    experiment) or a `jaxattn loop` folder (`ja.sweep.redraw` takes these and sweep
    folders). Any other folder, a sweep's included: `RunFolderError`, one line.

    **Arguments:**

    - `folder`: the run or loop folder.

    **Returns:**

    The paths of the figures written.
    """
    folder = open_run_folder(folder)
    config = read_json(folder / "config.json")
    saved = (folder / "data.npz").exists()
    data = read_data(folder) if saved else {}
    if saved and config.get("experiment") in EXPERIMENTS:
        experiment = EXPERIMENTS[config["experiment"]]
        try:
            return experiment.draw(experiment.config(config), data, folder)
        except KeyError as e:  # another experiment's arrays
            raise RunFolderError(f"{folder}/data.npz has no {e}, which "
                                 f"{config['experiment']} draws: it is not this run's data; "
                                 "re-run it.") from None
    if is_loop_config(config) and "E" in data:
        return redraw_loop(config, data, folder)
    raise RunFolderError(f"{folder} has no data.npz; it holds no data to draw." if not saved
                         else f"{folder} was not made by `jaxattn run`, `jaxattn loop` or "
                         "`jaxattn sweep` (its config.json names no known experiment).")


#: The older name of `redraw_run`: run and loop folders only (`ja.sweep.redraw`
#: draws any folder).
redraw = redraw_run
