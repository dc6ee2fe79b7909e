"""`jaxattn view DIR --out FILE.html`: a trajectory as one self-contained web page.

The page holds its data and a small canvas renderer (nothing fetched); what it shows:
see docs/usage/animations.md. It exposes `window.jaxattnView` (`frame()`,
`setFrame(i)`, `positions()`: the tokens' screen coordinates) for the tests that
drive it in a headless browser.
"""

import html
import json
import re
from pathlib import Path

import numpy as np

from .._files import atomic_write
from .animate import as_written, frame_unit, thinned, trajectory_arrays, unit_ball
from .figures import resolution
from .trajectories import tokens_title

#: The most numbers (saves × tokens × 3) a page embeds: its saves are thinned to fit.
MAX_NUMBERS = 1_500_000
#: The page: HTML and its canvas renderer, with `__TITLE__`, `__HINT__` and `__DATA__`
#: (the trajectory as JSON) filled in by `view_html`.
_PAGE = Path(__file__).with_name("view.html")


def view_html(xs, ts=None, *, E=None, title: str = "", layers: bool = False) -> str:
    """The page for the trajectory `xs (T, n, d)` at times `ts` (default: steps)."""
    unit = frame_unit(ts, layers)
    xs, ts, E, dtype = trajectory_arrays(xs, ts, E, per="save")
    title = title or tokens_title(xs)
    count, n, d = xs.shape
    xs, note = unit_ball(xs)
    picks = thinned(count, max(2, MAX_NUMBERS // (n * min(d, 3))))
    xs, ts, E = xs[picks], ts[picks], E[picks]
    if xs.shape[2] == 2:
        xs = np.concatenate([xs, np.zeros(xs.shape[:2] + (1,))], axis=-1)
    data = {
        "xs": np.round(xs, 4).reshape(-1).tolist(), "T": int(xs.shape[0]), "n": int(n),
        "flat": d == 2, "ts": [float(f"{v:.7g}") for v in ts],
        "E": [float(f"{v:.4g}") for v in E], "unit": unit, "note": note,
        "floor": resolution(dtype), "dtype": np.dtype(dtype).name,
    }
    hint = ("Filled dots: the tokens on the circle." if d == 2 else
            "Drag the sphere to turn it. Filled dots: near side; rings: far side.")
    fills = {"__TITLE__": html.escape(title), "__HINT__": hint,
             "__DATA__": json.dumps(data, separators=(",", ":"))}
    # one pass: a title that reads "__DATA__" stays a title
    return re.sub("|".join(fills), lambda m: fills[m.group(0)],
                  _PAGE.read_text(encoding="utf-8"))


def write_view(path, xs, ts=None, **kwargs) -> Path:
    """Write `view_html(xs, ts, …)` to `path` (whole or not at all)."""
    page = view_html(xs, ts, **kwargs).encode("utf-8")
    with as_written(Path(path)):
        return atomic_write(path, lambda f: f.write(page))
