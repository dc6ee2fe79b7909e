"""Every figure jaxattn draws, rendered from small saved runs and checked as a reviewer
would: no two pieces of text overlap, no text leaves the figure, no curve is
silently dropped from a log axis, and none is painted over by a later one as wide.

The data are small real runs (`tests/data/figures/NAME/`: `config.json`, `data.npz`;
the sweep's `table.csv` and `sweep.json`), drawn again here by each experiment's own
`draw(config, data, folder)` and by the loop, sweep and demo figure functions.
`python tests/artifacts/test_figures.py --regenerate` runs them again at the same sizes.
"""

import itertools
import json
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib import rcParams
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.ticker import FixedFormatter, FuncFormatter, LogFormatterSciNotation

from jaxattn._artifacts import figures
from jaxattn._artifacts.figures import save_sphere_figure
from jaxattn.experiments import EXPERIMENTS
from jaxattn.experiments.loop_grid import loop_title, save_loop_figure
from jaxattn.sweep import SweepSpec, load_table
from jaxattn.sweep._report import write_figure

DATA = Path(__file__).parents[1] / "data" / "figures"
#: Pixels two text boxes may share (antialiasing at the edges), and text may stick out.
SLACK = 1.0


def _load(name: str) -> tuple[dict, dict]:
    config = json.loads((DATA / name / "config.json").read_text())
    if config.get("experiment") in EXPERIMENTS:  # as the experiment's Config
        config = EXPERIMENTS[config["experiment"]].config(config)
    with np.load(DATA / name / "data.npz") as f:
        return config, {k: f[k] for k in f.files}


def _draw_experiment(name, folder):
    config, data = _load(name)
    return EXPERIMENTS[name].draw(config, data, folder)


def _draw_other_run(name, folder):
    """A second saved run of an experiment (`config.json` names which)."""
    config, data = _load(name)
    return EXPERIMENTS[config["experiment"]].draw(config, data, folder)


def _draw_few_tokens(name, folder):
    """`adversarial-tokens` with a Gram map of 3 tokens, where matplotlib would put a
    tick at every half token."""
    config, data = _load("adversarial-tokens")
    data["causal_gram"] = data["causal_gram"][:3, :3]
    return EXPERIMENTS["adversarial-tokens"].draw(config, data, folder)


def _draw_loop(name, folder):
    config, data = _load(name)
    return save_loop_figure(data["E"], config["layers_per_pass"], folder / "loop",
                            title=loop_title(config), variant="full")


def _draw_sweep(name, folder):
    sidecar = json.loads((DATA / "sweep" / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps(sidecar))
    spec = SweepSpec(**sidecar["spec"])
    return write_figure(folder, spec, sidecar["grid_keys"], load_table(DATA / "sweep"))


def _draw_demo(name, folder):
    with np.load(DATA / "demo" / "data.npz") as f:
        return [save_sphere_figure(f["ys"], f["ts"], f["E"], folder / "demo_sphere.png")]


def _decaying(E, decades: float) -> np.ndarray:
    """`E` (prompts × depth) falling by `decades` over its depth, in its dtype: the
    saved run barely moves, and a log axis spanning a few decades is where matplotlib
    labels minor ticks."""
    return (E * 10.0 ** (-decades * np.linspace(0, 1, E.shape[-1]))).astype(E.dtype)


def _draw_loop_decades(name, folder):
    config, data = _load("loop")
    decades = float(name.split("-")[-2])
    return save_loop_figure(_decaying(data["E"], decades), config["layers_per_pass"],
                            folder / "loop", title=loop_title(config), variant="full")


def _draw_grid_decades(name, folder):
    config, data = _load("loop-grid")
    decades = float(name.split("-")[-2])
    data = {k: (_decaying(v, decades) if k.startswith("E") else v) for k, v in data.items()}
    return EXPERIMENTS["loop-grid"].draw(config, data, folder)


#: More runs of an experiment, as `jaxattn run` arguments (the first word names it).
OTHER_RUNS = {
    # one cell: one placement, one mask, one kernel, one β, one size
    "variants-one-cell": "variants --size 1 --norm post --mask full --kernel softmax --beta 1 "
                         "--instances 2 --layers 20",
}
FIGURES = {name: _draw_experiment for name in EXPERIMENTS if (DATA / name).is_dir()}
FIGURES |= {name: _draw_other_run for name in OTHER_RUNS}
FIGURES |= {"adversarial-tokens-3-tokens": _draw_few_tokens}
FIGURES |= {"loop": _draw_loop, "sweep": _draw_sweep, "demo": _draw_demo}
FIGURES |= {f"loop-{d}-decades": _draw_loop_decades for d in ("0.5", "1.5", "3")}
FIGURES |= {f"loop-grid-{d}-decades": _draw_grid_decades for d in ("1.5", "3")}


@pytest.fixture
def drawn(monkeypatch):
    """The figures closed while the test runs (each is closed once it is saved). The
    PDFs are skipped (the same figure, twice the time)."""
    figures = []
    close, savefig = plt.close, Figure.savefig

    def keep(fig=None):
        if fig is not None and not isinstance(fig, (str, int)):
            figures.append(fig)
        return close(fig)

    def png_only(fig, fname, *args, **kwargs):
        if kwargs.get("format") == "pdf":
            return fname.write(b"%PDF-skipped")
        return savefig(fig, fname, *args, **kwargs)

    monkeypatch.setattr(plt, "close", keep)
    monkeypatch.setattr(Figure, "savefig", png_only)
    return figures


def _rendered_texts(fig) -> list[tuple[Text, object]]:
    """Every non-empty text the renderer drew, with its box in pixels."""
    texts = []
    draw = Text.draw

    def record(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            texts.append((self, self.get_window_extent(renderer)))

    Text.draw = record
    try:
        FigureCanvasAgg(fig).draw()  # a closed figure's canvas draws nothing
    finally:
        Text.draw = draw
    return texts


def _overlaps(texts) -> list[str]:
    """Pairs of texts whose boxes share more than `SLACK` pixels each way."""
    found = []
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > SLACK and h > SLACK:
            found.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return found


#: Pixels a text keeps from the figure's edge (a title flush with it reads as cut off).
MARGIN = 2.0


def _outside(texts, fig) -> list[str]:
    """Texts that stick out of the figure or touch its edge (cut off in the saved file)."""
    width, height = fig.get_figwidth() * fig.dpi, fig.get_figheight() * fig.dpi
    return [f"{t.get_text()!r} leaves the figure" for t, b in texts
            if b.x0 < MARGIN or b.y0 < MARGIN or b.x1 > width - MARGIN
            or b.y1 > height - MARGIN]


def _clipped_markers(fig) -> list[str]:
    """Markers cut in half by the edge of their axis (a point at the axis limit)."""
    found = []
    for ax in fig.axes:
        if ax.name != "rectilinear":
            continue
        box = ax.get_window_extent()
        for artist in _drawn_in_order(ax):
            if not (artist.get_clip_on() and (m := _markers(fig, artist))):
                continue
            (x, y), r = m[0].T, m[1]
            cut = np.minimum.reduce([x - box.x0, box.x1 - x, y - box.y0, box.y1 - y])
            clipped = (cut > -r) & (cut < r / 2)  # a point drawn, but half of it cut off
            if clipped.any():
                found.append(f"{ax.get_title()!r}: {clipped.sum()} {artist.get_label()!r} "
                             "markers cut by the axis edge")
    return found


def _upside_down(texts) -> list[str]:
    """Texts that read top to bottom or upside down (3-D axis labels can)."""
    return [f"{t.get_text()!r} is upside down ({t.get_rotation():.0f}°)"
            for t, _ in texts if 95 < t.get_rotation() % 360 < 275]


def _dropped_from_log_axes(fig) -> list[str]:
    """Lines on a log axis with no positive finite point inside the axis limits."""
    found = []
    for ax in fig.axes:
        if not isinstance(ax, Axes) or ax.name != "rectilinear":
            continue
        logx, logy = ax.get_xscale() == "log", ax.get_yscale() == "log"
        if not (logx or logy):
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for line in ax.lines:
            x = np.asarray(line.get_xdata(), float)
            y = np.asarray(line.get_ydata(), float)
            x, y = np.broadcast_arrays(x, y)
            # a coordinate in axes units (axhline, axvline) is no data on the log axis
            in_x, in_y = line.get_transform().contains_branch_seperately(ax.transData)
            x, y = (x if in_x else np.full_like(x, x0)), (y if in_y else np.full_like(y, y0))
            ok = np.isfinite(x) & np.isfinite(y) & (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)
            ok &= (x > 0) if logx else True
            ok &= (y > 0) if logy else True
            if not ok.any():
                found.append(f"{ax.get_title()!r}: line {line.get_label()!r} has no positive "
                             "point inside the log axis")
    return found


def _drawn_in_order(ax) -> list:
    """`ax`'s visible children in the order the last draw painted them (zorder, then
    the order they were added; a 3-D axis sets each collection's zorder by depth)."""
    children = [a for a in ax.get_children() if a.get_visible()]
    return [a for _, _, a in sorted((a.get_zorder(), i, a) for i, a in enumerate(children))]


def _markers(fig, artist):
    """Where `artist` (a scatter or a line with markers) put its markers, in pixels,
    their radii, and whether they are filled (a hollow marker hides nothing)."""
    if isinstance(artist, PathCollection):
        offsets = np.asarray(artist.get_offsets(), float)
        if not len(offsets):
            return None
        xy = artist.get_offset_transform().transform(offsets)
        sizes = artist.get_sizes()
        sizes = sizes if len(sizes) else [rcParams["lines.markersize"] ** 2]
        radius = np.broadcast_to(np.sqrt(np.asarray(sizes, float)) / 2 * fig.dpi / 72, len(xy))
        faces = artist.get_facecolors()
        filled = len(faces) > 0 and bool(np.all(faces[:, 3] > 0.5))
    elif isinstance(artist, Line2D) and artist.get_marker() not in (None, "", " ", "None", "none"):
        xy = artist.get_transform().transform(np.asarray(artist.get_xydata(), float))
        radius = np.full(len(xy), artist.get_markersize() / 2 * fig.dpi / 72)
        face = artist.get_markerfacecolor()
        filled = not (isinstance(face, str) and face.lower() == "none")
    else:
        return None
    keep = np.all(np.isfinite(xy), axis=1)
    return xy[keep], radius[keep], filled


#: The share of a marker's disc that a later filled marker may cover (a small dot on
#: a large ring covers a third of it: both read).
HIDDEN = 0.6


def _covered(d, ra, rb):
    """The share of a disc of radius `ra` that one of radius `rb` at distance `d` covers."""
    d, ra, rb = np.broadcast_arrays(np.asarray(d, float), ra, rb)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.clip((d**2 + ra**2 - rb**2) / (2 * d * ra), -1, 1)
        b = np.clip((d**2 + rb**2 - ra**2) / (2 * d * rb), -1, 1)
        lens = (ra**2 * np.arccos(a) + rb**2 * np.arccos(b)
                - 0.5 * np.sqrt(np.clip((-d + ra + rb) * (d + ra - rb) * (d - ra + rb)
                                        * (d + ra + rb), 0, None)))
    area = np.where(d >= ra + rb, 0.0, np.where(d <= np.abs(ra - rb),
                                                np.pi * np.minimum(ra, rb) ** 2, lens))
    return area / (np.pi * ra**2)


def _hidden_markers(fig) -> list[str]:
    """Markers mostly painted over (`HIDDEN`) by a later filled marker: an end point
    under a start point, a star over the point it names, one curve's points under
    another's."""
    found = []
    for ax in fig.axes:
        drawn = [(a, m) for a in _drawn_in_order(ax) if (m := _markers(fig, a))]
        for (i, (a, (xa, ra, _))), (b, (xb, rb, filled)) in itertools.product(
                enumerate(drawn), drawn):
            if not filled or drawn.index((b, (xb, rb, filled))) <= i:
                continue
            dist = np.linalg.norm(xa[:, None] - xb[None], axis=-1)
            covered = (_covered(dist, ra[:, None], rb[None]) > HIDDEN).any(axis=1)
            if covered.any():
                found.append(f"{ax.get_title()!r}: {covered.sum()} of the {a.get_label()!r} "
                             f"markers hidden under {b.get_label()!r}")
    return found


def _data_points(ax) -> np.ndarray:
    """The pixels of `ax`'s data: its lines (every 2 px along each segment), scatter
    points and bars, inside the axis; lines placed in axes units (`axhline`) are no data."""
    pts = []
    for line in ax.lines:
        in_x, in_y = line.get_transform().contains_branch_seperately(ax.transData)
        if not (line.get_visible() and in_x and in_y):
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
        for p, q in itertools.pairwise(xy):
            if np.all(np.isfinite([p, q])):
                n = int(np.ceil(np.linalg.norm(q - p) / 2)) + 1
                pts.append(p + np.linspace(0, 1, n)[:, None] * (q - p))
            elif np.all(np.isfinite(p)):
                pts.append(p[None])
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible() and len(coll.get_offsets()):
            pts.append(coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), float)))
    for patch in ax.patches:
        in_x, in_y = patch.get_transform().contains_branch_seperately(ax.transData)
        if isinstance(patch, Rectangle) and patch.get_visible() and in_x and in_y:
            box = patch.get_window_extent()
            xs, ys = np.linspace(box.x0, box.x1, 9), np.linspace(box.y0, box.y1, 9)
            pts.append(np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2))
    if not pts:
        return np.zeros((0, 2))
    pts = np.concatenate(pts)
    box = ax.get_window_extent()
    inside = ((pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0)
              & (pts[:, 1] <= box.y1))
    return pts[inside & np.all(np.isfinite(pts), axis=1)]


def _legends_over_data(fig) -> list[str]:
    """Legends drawn over data: a line, a point or a bar of any axis under the box."""
    found = []
    legends = [(ax, ax.get_legend()) for ax in fig.axes] + [(None, g) for g in fig.legends]
    for owner, legend in legends:
        if legend is None or not legend.get_visible():
            continue
        box = legend.get_window_extent().padded(-SLACK)
        for ax in fig.axes:
            pts = _data_points(ax)
            under = ((pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0)
                     & (pts[:, 1] < box.y1))
            if under.any():
                where = owner.get_title() if owner is not None else "figure"
                found.append(f"the legend of {where!r} covers {under.sum()} data pixels of "
                             f"{ax.get_title()!r}")
    return found


def _fractional_ticks(fig) -> list[str]:
    """Ticks between two cells of an image (a token `0.5`): an image's rows and
    columns are counted, so its ticks are whole numbers."""
    found = []
    for ax in fig.axes:
        if not ax.images:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            if isinstance(axis.get_major_formatter(), FixedFormatter):
                continue  # labels of the cells' own (a β per column), at whole positions
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks():
                x = tick.get_loc()
                if (lo <= x <= hi and tick.label1.get_visible() and tick.label1.get_text()
                        and x != round(x)):
                    found.append(f"{ax.get_title()!r}: tick {tick.label1.get_text()!r} "
                                 "between two cells")
    return found


#: The least contrast of a text with what lies under it (WCAG's 4.5:1; black or white
#: on any colour reaches it).
CONTRAST = 4.5


def _luminance(rgb) -> np.ndarray:
    """The relative luminance (WCAG) of colours `(..., 3)` in [0, 1]."""
    c = np.asarray(rgb, float)
    c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return c @ [0.2126, 0.7152, 0.0722]


def _low_contrast(texts, fig) -> list[str]:
    """Texts inside an axis (cell labels, annotations) hard to read on what is drawn
    under them: the median colour of the ring of pixels around each text's box."""
    from matplotlib.colors import to_rgb

    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    height = pixels.shape[0]
    boxes = [ax.get_window_extent() for ax in fig.axes]
    found = []
    for t, b in texts:
        if not any(a.x0 <= b.x0 and b.x1 <= a.x1 and a.y0 <= b.y0 and b.y1 <= a.y1
                   for a in boxes):
            continue
        x0, x1 = int(np.floor(b.x0)) - 1, int(np.ceil(b.x1)) + 1
        y0, y1 = height - int(np.ceil(b.y1)) - 1, height - int(np.floor(b.y0)) + 1
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, pixels.shape[1] - 1), min(y1, height - 1)
        ring = np.concatenate([pixels[y0, x0:x1], pixels[y1, x0:x1], pixels[y0:y1, x0],
                               pixels[y0:y1, x1]])
        lo, hi = sorted([_luminance(np.median(ring, axis=0)), _luminance(to_rgb(t.get_color()))])
        if (hi + 0.05) / (lo + 0.05) < CONTRAST:
            found.append(f"{t.get_text()!r} hardly shows on its background "
                         f"({(hi + 0.05) / (lo + 0.05):.1f}:1)")
    return found


def _line_pixels(line) -> np.ndarray:
    """The pixels along `line`, one every pixel of its length."""
    xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
    pts = [p + np.linspace(0, 1, int(np.ceil(np.linalg.norm(q - p))) + 1)[:, None] * (q - p)
           for p, q in itertools.pairwise(xy) if np.all(np.isfinite([p, q]))]
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def _lines_under_lines(fig) -> list[str]:
    """Lines mostly (`HIDDEN`) painted over by a later opaque line as wide or wider
    along the same path (the layers' curve under the flow's): the later line must
    be the thinner one, so that both show."""
    from scipy.spatial import cKDTree

    found = []
    for ax in fig.axes:
        if ax.name != "rectilinear":
            continue
        box = ax.get_window_extent()
        lines = []
        for line in _drawn_in_order(ax):
            in_x, in_y = (line.get_transform().contains_branch_seperately(ax.transData)
                          if isinstance(line, Line2D) else (False, False))
            if in_x and in_y and line.get_linestyle() not in ("None", " ", ""):
                pts = _line_pixels(line)
                pts = pts[(pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1)
                          & (pts[:, 1] >= box.y0) & (pts[:, 1] <= box.y1)]
                if len(pts) > 1:
                    lines.append((line, pts, line.get_linewidth() * fig.dpi / 72))
        for (i, (a, pa, wa)), (j, (b, pb, wb)) in itertools.combinations(enumerate(lines), 2):
            if (b.get_alpha() if b.get_alpha() is not None else 1.0) < 1 or wb < wa:
                continue
            dist, _ = cKDTree(pb).query(pa)
            share = np.mean(dist <= (wb - wa) / 2 + 1.0)
            if share > HIDDEN:
                found.append(f"{ax.get_title()!r}: {share:.0%} of line {a.get_label()!r} "
                             f"hidden under {b.get_label()!r}")
    return found


def _repeated_colorbars(fig) -> list[str]:
    """Colour bars that say the same thing twice (panels on one scale share one)."""
    seen = {}
    for ax in fig.axes:
        bar = getattr(ax, "_colorbar", None)
        if bar is None:
            continue
        m = bar.mappable
        key = (m.get_cmap().name, *m.get_clim(), type(m.norm).__name__, ax.get_ylabel())
        seen[key] = seen.get(key, 0) + 1
    return [f"{n} identical colour bars {key[-1]!r}" for key, n in seen.items() if n > 1]


DIVERGING = {"RdBu", "RdBu_r", "coolwarm", "bwr", "seismic", "PiYG", "PRGn", "BrBG", "PuOr",
             "RdGy", "RdYlBu", "RdYlGn", "Spectral"}


def _diverging_maps_of_one_sign(fig) -> list[str]:
    """A diverging colour map (a middle, two directions) over a quantity that never
    changes sign, such as a density from 0 to 1."""
    found = []
    for ax in fig.axes:
        for m in ax.collections:
            data = m.get_array() if hasattr(m, "get_cmap") else None
            if data is None or m.get_cmap().name not in DIVERGING:
                continue
            values = np.ma.compressed(np.ma.asarray(data))
            if values.size and (values.min() >= 0 or values.max() <= 0):
                found.append(f"diverging map {m.get_cmap().name} over values of one sign "
                             f"({ax.get_title()!r})")
    return found


def _brackets_read_as_doubled(texts) -> list[str]:
    """A closing angle bracket right before a closing parenthesis (`⟩)`) reads as a
    stray parenthesis `))` at figure size."""
    return [f"'⟩)' reads as '))' in {t.get_text()!r}" for t, _ in texts
            if re.search(r"(\\rangle|⟩)\s*\\?\)", t.get_text())]


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_is_readable(name, tmp_path, drawn):
    paths = FIGURES[name](name, tmp_path)
    assert paths and all(Path(p).stat().st_size > 0 for p in paths)
    assert drawn, "the figure was not closed after saving"
    fig = drawn[0]
    texts = _rendered_texts(fig)
    problems = (_overlaps(texts) + _outside(texts, fig) + _upside_down(texts)
                + _dropped_from_log_axes(fig) + _hidden_markers(fig) + _legends_over_data(fig)
                + _clipped_markers(fig) + _fractional_ticks(fig) + _low_contrast(texts, fig)
                + _repeated_colorbars(fig) + _lines_under_lines(fig)
                + _brackets_read_as_doubled(texts) + _diverging_maps_of_one_sign(fig))
    assert not problems, f"{name}: " + "; ".join(problems[:8])


def test_every_experiment_has_a_saved_run():
    """A new experiment gets its figure checked too: add it to `RUNS` and regenerate."""
    assert sorted(n for n in EXPERIMENTS if not (DATA / n).is_dir()) == []
    assert sorted(n for n in EXPERIMENTS if n != "loop-grid") == sorted(RUNS)


def test_the_checks_catch_what_they_look_for():
    """A figure with every fault: overlapping labels, a title cut off at the edge, an
    upside-down label, a curve of zeros on a log axis."""
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1e-3, 1e-1], label="fine")
    ax.plot([1, 2], [0.0, 0.0], label="zeros")
    ax.set_yscale("log")
    ax.text(1.5, 1e-2, "one label")
    ax.text(1.5, 1e-2, "another label")
    ax.set_title("a title far too long to fit into a figure only three inches wide")
    ax.set_ylabel("upside down", rotation=180)
    try:
        texts = _rendered_texts(fig)
        assert any("'one label' overlaps 'another label'" in p for p in _overlaps(texts))
        assert any("leaves the figure" in p for p in _outside(texts, fig))
        assert any("'upside down' is upside down" in p for p in _upside_down(texts))
        assert [p for p in _dropped_from_log_axes(fig) if "'zeros'" in p]
        assert not [p for p in _dropped_from_log_axes(fig) if "'fine'" in p]
    finally:
        plt.close(fig)


def _toy(draw):
    """A small figure drawn by `draw(fig, ax)` and rendered, as the checks expect it."""
    fig = Figure(figsize=(3, 2), dpi=100)
    draw(fig, fig.add_subplot())
    _rendered_texts(fig)
    return fig


def test_overlapping_tick_labels_are_caught():
    """Every minor tick labelled on a log axis spanning a few decades: the smear."""
    def draw(fig, ax):
        ax.semilogy([0, 1], [1e-4, 1])
        # wrapped, matplotlib no longer tells the formatter which minor ticks to skip
        ax.yaxis.set_minor_formatter(FuncFormatter(LogFormatterSciNotation(labelOnlyBase=False)))
    fig = _toy(draw)
    assert any("overlaps" in p for p in _overlaps(_rendered_texts(fig)))


def test_an_angle_bracket_before_a_parenthesis_is_caught():
    """thm51's label `max_i (1 − ⟨x_i(t), x_1(0)⟩)` read as a stray `))`."""
    def draw(fig, ax):
        ax.set_ylabel(r"$\max_i\,(1-\langle x_i(t), x_1(0)\rangle)$")
    assert _brackets_read_as_doubled(_rendered_texts(_toy(draw)))

    def square(fig, ax):
        ax.set_ylabel(r"$\max_i\,[\,1-\langle x_i(t),\, x_1(0)\rangle\,]$")
    assert not _brackets_read_as_doubled(_rendered_texts(_toy(square)))


def test_a_density_map_is_sequential_measured_cells_only_and_marks_half():
    """phase-diagram's map: no diverging colours for a 0–1 density, no β band below
    the smallest β measured, and the density ½ (t½ of the verdict) drawn."""
    from matplotlib.contour import ContourSet

    from jaxattn.experiments import pair_density

    betas, ts = np.array([0.1, 3.0, 6.0, 9.0]), np.linspace(0.0, 30.0, 20)
    density = np.clip(ts[None, :] / (10 * betas[:, None]), 0, 1)
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    pair_density.draw_map(ax, fig, betas, ts, density, log=False, title="t")
    assert not _diverging_maps_of_one_sign(fig)
    assert ax.get_ylim() == (0.1, 9.0) and ax.get_xlim() == (0.0, 30.0)
    assert any(isinstance(c, ContourSet) for c in ax.collections)

    def diverging(fig, ax):
        ax.pcolormesh(density, cmap="RdBu_r")
    assert _diverging_maps_of_one_sign(_toy(diverging))


def test_hidden_markers_are_caught():
    """An end marker drawn first, at the start marker's place, and painted over."""
    def draw(fig, ax):
        ax.scatter([0, 1], [0, 1], s=60, c="0.5", zorder=2, label="end")
        ax.scatter([0, 1.5], [0, 1.5], s=60, c="white", edgecolors="k", zorder=3, label="start")
        ax.scatter([1], [1], s=60, facecolors="none", edgecolors="r", zorder=4, label="ring")
        ax.scatter([1.5], [1.5], s=15, c="k", zorder=5, label="dot")
    found = _hidden_markers(_toy(draw))
    assert found == ["'': 1 of the 'end' markers hidden under 'start'"], found


def test_legends_over_data_are_caught():
    def draw(fig, ax):
        ax.plot(np.linspace(0, 1, 50), np.linspace(1, 0, 50), label="data")
        ax.legend(loc="upper left")
    assert _legends_over_data(_toy(draw))

    def clear(fig, ax):
        ax.plot(np.linspace(0, 1, 50), np.linspace(0, 1, 50), label="data")
        ax.legend(loc="lower right")
    assert not _legends_over_data(_toy(clear))


def test_text_at_the_edge_and_clipped_markers_are_caught():
    def draw(fig, ax):
        ax.scatter([0, 1], [0, 1], s=80, label="points")
        ax.set_xlim(0, 1)
        fig.tight_layout()
        fig.text(1.0, 0.5, "flush", ha="right")
    fig = _toy(draw)
    assert _outside(_rendered_texts(fig), fig) == ["'flush' leaves the figure"]
    assert _clipped_markers(fig) == ["'': 2 'points' markers cut by the axis edge"]


def test_contrast_ticks_and_lines_under_lines_are_caught():
    def draw(fig, ax):
        ax.imshow(np.zeros((2, 2)), cmap="gray", vmin=-1, vmax=1)  # mid grey cells
        ax.text(0, 0, "grey on grey", color="0.6", ha="center", fontsize=7)
        ax.text(1, 1, "ok", color="black", ha="center", fontsize=7)
    fig = _toy(draw)
    assert [p.split(" hardly")[0] for p in _low_contrast(_rendered_texts(fig), fig)] == [
        "'grey on grey'"]
    assert _fractional_ticks(fig)  # 2 cells: matplotlib ticks every half cell

    def lines(fig, ax):
        t = np.linspace(0, 1, 30)
        ax.plot(t, t, lw=1.5, label="under")
        ax.plot(t, t, lw=1.5, ls=":", label="dotted, as wide")
        ax.plot(t, 1 - t, lw=2.4, label="wide")
        ax.plot(t, 1 - t, lw=1.0, ls="--", label="thin over wide")
    assert _lines_under_lines(_toy(lines)) == ["'': 100% of line 'under' hidden under "
                                               "'dotted, as wide'"]


def test_cell_labels_contrast_with_their_cells(tmp_path, drawn):
    """Every cell of the variants map, from the floor to 0 and overflowed (blank),
    keeps its label readable."""
    from types import SimpleNamespace

    from jaxattn.experiments.variants_plot import draw_study

    betas = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    rows = [dict(tokens=10, dim=3, norm="post", mask="full", kernel="softmax", beta=b,
                 final_E_median=E, outcome=o, theorem="none", reached=0.0,
                 consensus_layer_median=7.0, clusters_median=2.0)
            for b, E, o in zip(betas, [1e-16, 1e-9, 1e-8, 1e-7, 1e-2, np.inf],
                               ["consensus"] * 4 + ["apart", "overflow"])]
    grid = SimpleNamespace(norms=["post"], masks=["full"], kernels=["softmax"], betas=betas,
                           sizes=[(10, 3)])
    config = EXPERIMENTS["variants"].config(instances=2, heads=2, tau=0.25, window=2, keep=0.3,
                                            layers=20)
    draw_study(config, grid, {}, rows, tmp_path / "variants")
    texts = _rendered_texts(drawn[0])
    assert sorted(t.get_text() for t, _ in texts if t.get_fontsize() == 7) == sorted(
        ["7"] * 4 + ["k2", "∞"])
    assert not _low_contrast(texts, drawn[0])


def test_figures_are_byte_identical_when_drawn_again(tmp_path, monkeypatch):
    """A run folder drawn twice, a day apart, is the same, bytes and all: no date in
    the PDF (matplotlib takes the time from `SOURCE_DATE_EPOCH` when set)."""
    def draw(folder, day):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", str(86400 * day))
        folder.mkdir()
        return _draw_experiment("phase-diagram", folder)

    first, second = draw(tmp_path / "a", 0), draw(tmp_path / "b", 1)
    assert sorted(p.suffix for p in first) == [".pdf", ".png"]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


# --- regenerating the saved runs ---------------------------------------------------

#: The runs behind `tests/data/figures`, as `jaxattn` command lines.
RUNS = {
    "thm41-sphere": "--tokens 5 --horizon 8 --saves 40 --tau 0.05 --discrete",
    "thm51-causal": "--tokens 6 --dim 12 --samples 5 --horizon 14 --saves 40 --tau 0.2 "
                    "--discrete",
    "thm52-symmetric": "--tokens 4 --horizon 20 --saves 40 --tau 0.1 --discrete",
    "thm32-gradient": "--tokens 4 --horizon 60 --saves 60 --tau 0.1 --discrete",
    "adversarial-tokens": "--steps 5 --restarts 2 --tokens 5 --dim 6 --causal-tokens 5 "
                          "--saves 10",
    "adversarial-weights": "--steps 5 --restarts 2 --tokens 4 --saves 10",
    "conjecture-multihead": "--steps 5 --restarts 2 --tokens 4 --saves 10",
    "conjecture-bipartite": "--steps 10 --restarts 2 --tokens 4 --split 2 --layers 50",
    "power-shared": "--hidden 16 --heads 2 --prompts 3 --tokens 4 --depth 3 --std 0.3",
    "power-layers": "--hidden 16 --heads 2 --prompts 3 --tokens 4",
    "steer": "--hidden 16 --heads 2 --prompts 3 --tokens 4",
    "oja-bipartite": "--instances 2 --tokens 4",
    "phase-diagram": "--betas 4 --systems 8 --tokens 6 --times 20",
    "norm-beta": "--betas 3 --systems 4 --tokens 6 --dim 4 --heads 2 --horizon 5 --times 20",
    "variants": "--instances 2 --layers 20",
    "long-context": "--n-max 1000 --dim 512 --gammas 9 --gamma-min 1 --gamma-max 3",
    "metastability": "--saves 80",
    "hardmax": "--vertices 5 --tokens 12 --steps 40 --betas 9 --nsd-steps 400",
    "equiangular": "--horizon 12 --saves 60",
    "antipodal": "--dims 2 --betas 4 --runs 100 --horizon 4 --tau 0.05",
    "noisy-transition": "--tokens 200 --couplings 5 --burn 0.5 --window 1 --rates 5 "
                        "--quench 0.5 --seeds 1 --blocks 4",
    "mean-field": "--modes 16 --max-tokens 100000 --seeds 48 --betas 3 --couplings 13 --settle 40",
}
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 4, "n_embd": 24, "n_head": 3, "vocab_size": 37,
             "n_positions": 16}
_NOISE = ("versions", "started", "argv", "run_id", "backend", "deterministic", "kind",
          "model_config", "command")


def _keep(folder: Path, name: str, **extra) -> None:
    import shutil

    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in _NOISE} | extra
    (DATA / name).mkdir(parents=True, exist_ok=True)
    (DATA / name / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    shutil.copy(folder / "data.npz", DATA / name / "data.npz")


def regenerate(work: Path) -> None:
    """Run every saved run again into `work` and copy its data to `tests/data/figures`."""
    import jax
    import jax.numpy as jnp

    from jaxattn import solve_flow
    from jaxattn.cli import main
    from jaxattn.experiments import paper
    from jaxattn.metrics import misalignment

    for name, args in RUNS.items():
        assert main(["run", name, "--out", str(work / name), "--no-progress",
                     *args.split()]) in (0, 3, 4)
        _keep(work / name, name)
    for name, args in OTHER_RUNS.items():
        assert main(["run", *args.split()[:1], "--out", str(work / name), "--no-progress",
                     *args.split()[1:]]) in (0, 3, 4)
        _keep(work / name, name)
    (work / "tiny-gpt2.json").write_text(json.dumps(TINY_GPT2))
    loop = ["--model", str(work / "tiny-gpt2.json"), "--passes", "8", "--prompts", "4",
            "--tokens", "6"]
    assert main(["loop", *loop, "--weights", "random", "--out", str(work / "loop")]) == 0
    assert main(["loop", *loop, "--grid", "--out", str(work / "loop-grid")]) == 0
    for name in ("loop", "loop-grid"):
        # a model path as long as a user's: the title must still fit
        _keep(work / name, name, model="models/tiny-gpt2/config.json",
              layers_per_pass=TINY_GPT2["n_layer"])
    assert main(["sweep", "thm41-sphere", "--grid", "beta=0.5,1,2", "--grid", "heads=1,2",
                 "--instances", "4", "--set", "horizon=3", "--set", "saves=20", "--set",
                 "tokens=5", "--out", str(work / "sweep"), "--no-progress"]) == 0
    sidecar = json.loads((work / "sweep" / "sweep.json").read_text())
    (DATA / "sweep").mkdir(parents=True, exist_ok=True)
    (DATA / "sweep" / "sweep.json").write_text(json.dumps(
        {k: sidecar[k] for k in ("spec", "grid_keys", "tolerance")}, indent=1) + "\n")
    (DATA / "sweep" / "table.csv").write_bytes((work / "sweep" / "table.csv").read_bytes())
    with jax.enable_x64(False):  # as `jaxattn demo` runs: float32
        k_model, k_x = jax.random.split(jax.random.PRNGKey(0))
        dyn = paper.sphere_dynamics(k_model)
        ts = jnp.linspace(0.0, 10.0, 401)
        ys = solve_flow(dyn, paper.hemisphere_tokens(k_x, 10, 3), ts)
        (DATA / "demo").mkdir(parents=True, exist_ok=True)
        np.savez_compressed(DATA / "demo" / "data.npz", ts=np.asarray(ts), ys=np.asarray(ys),
                            E=np.asarray(misalignment(ys)))


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        regenerate(Path(tmp))


def test_a_loop_draws_the_median_and_a_band_its_prompts_can_fill():
    """On a log axis the mean sits at the top of the band (the largest prompts pull it
    there): the line is the median. A 10–90 % band needs ≥ 10 prompts; fewer show
    their range, and the legend says which."""
    from jaxattn.experiments.loop_grid import BAND_PROMPTS, draw_loop

    rng = np.random.default_rng(0)
    for prompts, words in ((3, "range of 3"), (BAND_PROMPTS, "10–90 %")):
        E = np.exp(rng.normal(-2.0, 2.0, (prompts, 9)))  # spread over decades
        fig, ax = plt.subplots()
        draw_loop(ax, E, 4, label="full blocks")
        line, = [ln for ln in ax.lines if ln.get_label() == f"full blocks: median, {words}"]
        np.testing.assert_array_equal(line.get_ydata(), np.median(E, axis=0))
        plt.close(fig)


def test_a_study_of_one_cell_draws_its_curve_not_a_one_cell_map(tmp_path, drawn):
    _draw_other_run("variants-one-cell", tmp_path)
    fig = drawn[0]
    (ax,) = fig.axes  # no colour bar: nothing to scale
    assert not ax.images and ax.get_yscale() == "log" and ax.get_xlabel() == "layer"
    _, data = _load("variants-one-cell")
    curve = ax.lines[0].get_ydata()
    np.testing.assert_allclose(curve, np.asarray(data["E_median"]).ravel())
    assert ax.get_title().count("\n") <= 2 and "still converging" in ax.get_title()


def test_the_demo_end_dot_stands_out_and_the_sphere_fills_its_panel(tmp_path, drawn):
    from matplotlib.colors import to_rgba

    _draw_demo("demo", tmp_path)
    ax3 = drawn[0].axes[0]
    starts, ends = ax3.collections[-2:]
    assert np.allclose(ends.get_facecolors()[0], to_rgba("tab:red"))
    assert ends.get_sizes()[0] >= 0.5 * starts.get_sizes()[0]
    plain = Figure().add_subplot(projection="3d")
    plain.set_box_aspect((1, 1, 1))  # matplotlib's own size leaves a third blank
    assert np.linalg.norm(ax3._box_aspect) > 1.2 * np.linalg.norm(plain._box_aspect)


def test_many_tokens_draw_thinner_paths_and_smaller_rings():
    """Past 20 tokens the rings and paths shrink by the square root of their number,
    so that 300 start rings do not cover the sphere; 20 or fewer are drawn as before."""
    from jaxattn._artifacts.figures import draw_sphere_trajectories

    def drawn_with(n):
        ax = Figure().add_subplot(projection="3d")
        ys = np.random.default_rng(0).normal(size=(5, n, 3))
        draw_sphere_trajectories(ax, ys / np.linalg.norm(ys, axis=-1, keepdims=True))
        starts, ends = ax.collections[-2:]
        return starts.get_sizes()[0], ends.get_sizes()[0], ax.lines[-1].get_linewidth()

    assert drawn_with(10) == drawn_with(20) == (60, 30, 1.2)
    start, end, lw = drawn_with(320)
    assert start == pytest.approx(15) and end == 30 and lw == pytest.approx(0.3)


@pytest.mark.slow  # warm: over ~4 s (make test stays the fast loop)
def test_the_gallery_prints_no_numbers_from_a_run_too_small_for_them(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gallery", Path(__file__).parents[2] / "docs" / "gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    monkeypatch.setattr(gallery, "CACHE", tmp_path)
    for name in gallery.NO_NUMBERS:
        line = json.loads((gallery.draw(name, "source") / "verdict.json").read_text())["line"]
        assert not re.search(r"\d|nan|±", line.replace(gallery.NO_NUMBERS[name], "")), line
        assert gallery.NO_NUMBERS[name] in line
    # the saved run is on the current grid: its transition couplings are numbers
    config, data = _load("noisy-transition")
    verdict = EXPERIMENTS["noisy-transition"].verdict(
        EXPERIMENTS["noisy-transition"].config(config), data)
    assert "K_c/K_# = nan" not in verdict.line


def test_thm41_gives_its_sphere_room_and_a_short_y_label(tmp_path, drawn):
    _draw_experiment("thm41-sphere", tmp_path)
    fig = drawn[0]
    ax3, _, decay = fig.axes[:3]
    assert ax3.name == "3d"
    # wider than an equal third (0.23 of the figure before), zoomed past matplotlib's own
    assert ax3.get_position(original=True).width > 1.2 * decay.get_position(original=True).width
    assert ax3._box_aspect is not None and np.linalg.norm(ax3._box_aspect) > 1.1 * 3**0.5
    assert len(decay.get_ylabel()) <= 12, decay.get_ylabel()  # the formula is in the title
    assert "min" in decay.get_title()


def test_plain_log_labels_write_plain_numbers_on_a_narrow_axis():
    """Under two decades the ticks read as plain numbers (`1000`, not `1e+03`; `0.5`);
    a wider axis keeps matplotlib's powers of ten."""
    plt = figures.pyplot()
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(100, 1000)
    figures.plain_log_labels(ax.xaxis)
    assert ax.xaxis.get_major_formatter()(1000.0) == "1000"
    assert ax.xaxis.get_major_formatter()(100.0) == "100"
    ax.set_xlim(0.2, 1)
    assert ax.xaxis.get_minor_formatter()(0.5) in ("0.5", "")
    ax.set_xlim(1, 10**5)
    assert "10" in ax.xaxis.get_major_formatter()(1000.0)  # mathtext 10^3
    plt.close(fig)


def test_the_mean_field_map_from_uniform_has_its_own_log_scale(tmp_path, monkeypatch):
    """From uniform, r ends between ~1e-8 and ~0.2: on the cap map's linear 0–1 scale
    the map was one dark colour, K_# invisible in it."""
    from matplotlib.colors import LogNorm

    from jaxattn._artifacts import figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, *a, **k: drawn.append(fig))
    _draw_experiment("mean-field", tmp_path)
    uniform, cap = drawn[0].axes[1], drawn[0].axes[2]
    assert isinstance(uniform.collections[0].norm, LogNorm)
    assert not isinstance(cap.collections[0].norm, LogNorm)
    assert len(drawn[0].axes) == 5  # three panels, a colour bar for each map


def test_a_noisy_transition_case_without_an_estimate_says_so(tmp_path, monkeypatch):
    """The saved run's d = 2, β = β* case has no zero crossing at τ = 0.02: its panel
    read "K/K_# = nan ± nan"."""
    from jaxattn._artifacts import figures

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, *a, **k: drawn.append(fig))
    _draw_experiment("noisy-transition", tmp_path)
    titles = [ax.get_title() for fig in drawn for ax in fig.axes]
    assert not any("nan ± nan" in t for t in titles), titles
    assert any("no zero crossing" in t for t in titles), titles
