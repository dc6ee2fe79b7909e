"""Figures: one consistent matplotlib style for every plot jaxattn writes."""

import math
import re
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np

from .._files import atomic_write

#: matplotlib's import under way on another thread (`import_ahead`).
_AHEAD: list[threading.Thread] = []


def import_ahead() -> None:
    """Start importing matplotlib (pyplot and the PNG and PDF backends, half a second)
    on another thread, where a run's figures will follow its simulation: the import
    overlaps the simulation's wait on XLA. `imported` waits for it."""
    if _AHEAD or "matplotlib.backends.backend_pdf" in sys.modules:
        return
    _AHEAD.append(threading.Thread(target=_import_matplotlib, daemon=True,
                                   name="jaxattn-matplotlib"))
    _AHEAD[0].start()


def _import_matplotlib() -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.backends.backend_pdf  # noqa: F401
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # the figure's own import says what is wrong
        pass


def imported() -> None:
    """Wait for `import_ahead`'s import, before any figure code imports matplotlib."""
    while _AHEAD:
        _AHEAD.pop().join()


def pyplot():
    """`matplotlib.pyplot` on the file-only Agg backend, in jaxattn's style.

    Imported here, at the first figure, not at the top of the module: selecting Agg
    on `import jaxattn` would switch a notebook's interactive backend, and a
    simulation never pays for matplotlib.
    """
    imported()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "savefig.dpi": 150, "font.size": 10,
                         "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def tidy_3d(ax, labels=("$x_1$", "$x_2$", "$x_3$")) -> None:
    """Readable 3-D axes: at most three ticks per axis in small type (crowded tick
    labels collide at any view angle) and horizontal axis labels (matplotlib turns
    them along the axis, which at some views reads upside down)."""
    from matplotlib.ticker import MaxNLocator

    for axis, label in zip((ax.xaxis, ax.yaxis, ax.zaxis), labels):
        axis.set_major_locator(MaxNLocator(nbins=2, steps=[1, 2, 5, 10]))
        axis.set_rotate_label(False)
        axis.set_label_text(label, rotation=0)
        axis.labelpad = 2
        axis.set_tick_params(labelsize=7, pad=1)


#: The zorders of the token markers: a mark (`v₁`) lies over the starts and under the
#: ends, so that a token that ends on it, or where it started, still shows.
START_Z, MARK_Z, END_Z = 5, 6, 7


def draw_sphere_trajectories(ax, ys, axes=None) -> None:
    """Token paths `(T, n, 3)` over the wireframe of the unit sphere mapped by `axes`
    (its columns; default: S² itself). Start a white ring, end a red dot drawn over
    it (a token that hardly moves shows both; a consensus, one dot among the start
    rings, stands out by its colour); `title_3d` names the markers."""
    u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
    pts = np.stack([np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v)], -1)
    pts = pts if axes is None else pts @ axes.T
    ax.plot_wireframe(pts[..., 0], pts[..., 1], pts[..., 2], color="0.85", lw=0.4)
    ys = np.asarray(ys)
    ax.computed_zorder = False  # markers by zorder, not by depth: the ends stay on top
    # past 20 tokens, thinner paths and smaller rings (by the square root of their
    # number: the area they cover stays about that of 20 tokens' rings)
    scale = min(1.0, math.sqrt(20 / ys.shape[1]))
    for i in range(ys.shape[1]):
        ax.plot(*ys[:, i].T, color="tab:blue", lw=1.2 * scale)
    thin = {} if scale == 1 else {"lw": max(1.5 * scale, 0.3)}
    ax.scatter(*ys[0].T, s=60 * scale, c="white", edgecolors="k", depthshade=False,
               zorder=START_Z, label="start", **thin)
    ax.scatter(*ys[-1].T, s=30, c="tab:red", edgecolors="k", lw=0.6, depthshade=False,
               zorder=END_Z, label="end (red)")
    ax.set_box_aspect((1, 1, 1) if axes is None else np.ptp(pts.reshape(-1, 3), axis=0))
    tidy_3d(ax)


#: The symbols of a 3-D panel's markers in its title's key (`title_3d`).
KEY_SYMBOLS = {"start": "○", "end (red)": "●"}


def title_3d(ax, title: str, **kw) -> None:
    """`title` over a 3-D panel, with its markers' key as a second line (`○ start
    ● end ☆ v₁`): a legend inside a 3-D axis covers its box, one below it meets the
    tick labels wherever the view puts them."""
    labels = [label for label in ax.get_legend_handles_labels()[1] if label]
    key = "   ".join(f"{KEY_SYMBOLS.get(label, '☆')} {label}" for label in labels)
    ax.set_title(f"{title}\n{key}" if key else title, **kw)


def resolution(dtype, order: int = 2, scale: float = 1.0) -> float:
    """The smallest value of a quantity computed in `dtype` that is not rounding noise.

    Token coordinates carry a few units of rounding `ε` each, so a quantity of
    `order` in the differences of unit tokens (2: the misalignment `E`, `V`,
    `1 − cos`; 1: a speed `max |ẋ|`) is noise below `scale · (16 ε)^order`:
    `3.6e-12` for `E` in float32, `1.3e-29` in float64.

    **Arguments:**

    - `dtype`: the dtype the quantity was computed in.
    - `order`: its order in the token differences; `scale`: its size at `O(1)` differences.

    **Returns:**

    The floor, a float.
    """
    return float(scale) * (16 * float(np.finfo(dtype).eps)) ** order


#: The gid of the line that marks an axis's resolution floor (drawn once per axis).
FLOOR_GID = "resolution-floor"


def mark_floor(ax, floor: float, dtype) -> None:
    """A dotted line at `floor` labelled as the resolution of `dtype`, once per axis."""
    if any(line.get_gid() == FLOOR_GID for line in ax.lines):
        return
    ax.axhline(floor, color="0.45", lw=0.9, ls=(0, (1, 2)), zorder=1, gid=FLOOR_GID,
               label=f"{np.dtype(dtype).name} resolution (below: not drawn)")


def above_floor(values, floor: float, *, stop: bool = True) -> tuple[np.ndarray, bool]:
    """`values` (a curve per row, time last) with the samples at or below `floor` set
    to NaN and, with `stop`, everything after each curve's first such sample too: a
    decaying quantity that has reached rounding noise says nothing more. Also whether
    any sample was hidden."""
    values = np.array(values, dtype=np.float64)
    below = ~(values > floor) & ~np.isnan(values)
    cut = np.cumsum(below, axis=-1) > 0 if stop else below
    values[cut] = np.nan
    return values, bool(cut.any())


def label_first(lines, label: str | None) -> None:
    """One legend entry for a bundle of curves: `label` on the first line only."""
    for i, line in enumerate(lines):
        line.set_label(label if i == 0 and label is not None else "_nolegend_")


def draw_decay(ax, ts, values, *, label=None, order: int = 2, scale: float = 1.0,
               stop: bool = True, **kw) -> None:
    """A nonnegative quantity tending to zero, on a log scale, drawn down to the
    resolution of its dtype (`resolution(dtype, order, scale)`): below it, where
    rounding noise would show as spikes and zeros would fall off the axis, each
    curve stops, and a dotted line marks the floor (labelled for the legend).

    **Arguments:**

    - `ax`: a matplotlib axis; `ts`: times `(T,)`; `values`: `(T,)` or `(curves, T)`.
    - `label`, `**kw`: for `ax.semilogy`; `order`, `scale`: see `resolution`.
    - `stop`: end each curve at its first sample below the floor (`False`, for a
      quantity that may rise again: hide only the samples below it).
    """
    raw = np.asarray(values)
    dtype = raw.dtype if np.issubdtype(raw.dtype, np.floating) else np.float64
    floor = resolution(dtype, order, scale)
    values, cut = above_floor(raw, floor, stop=stop)
    lines = ax.semilogy(np.asarray(ts), values.T if values.ndim > 1 else values, **kw)
    label_first(lines, label)
    if cut:
        mark_floor(ax, floor, dtype)
        ts = np.asarray(ts, np.float64)  # the time axis still spans the whole run
        ax.update_datalim([(ts.min(), floor), (ts.max(), floor)])
        ax.autoscale_view()
    ax.set_xlabel("time $t$ (depth)")


def save_sphere_figure(ys, ts, E, path) -> Path:
    """Trajectories on the sphere beside `E(t)`, written as PNG."""
    plt = pyplot()
    fig = plt.figure(figsize=(10, 4.5))
    ax3 = fig.add_subplot(1, 2, 1, projection="3d")
    draw_sphere_trajectories(ax3, ys)
    # the box fills its half: at zoom 1 matplotlib leaves 40 % of it blank (at this
    # view the zoomed box's labels stay inside; a panel among others may not)
    ax3.set_box_aspect((1, 1, 1), zoom=1.25)
    title_3d(ax3, "tokens on $S^2$")
    ax = fig.add_subplot(1, 2, 2)
    draw_decay(ax, ts, E, color="tab:blue", label="$E(t)$")  # down to E's resolution
    ax.set_xlabel("time $t$")
    ax.set_ylabel(r"misalignment $E(x(t))$")
    ax.set_title("consensus: $E(t) \\to 0$")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path = Path(path)
    atomic_write(path, lambda f: fig.savefig(f, format="png", metadata=REPRODUCIBLE["png"]))
    plt.close(fig)
    return path


# --- the experiments of paper 001 §6.1 (`jaxattn run`) ------------------------------


def draw_head_norms(ax, ts, norms, *, upto=None) -> None:
    """`‖P_η(t)‖_F` per head (paper 001 Fig. 1), over `[0, upto]` if given."""
    ts, norms = np.asarray(ts), np.asarray(norms)
    keep = ts <= upto if upto is not None else slice(None)
    for h in range(norms.shape[1]):
        ax.plot(ts[keep], norms[keep, h], lw=1.2, label=rf"$\|P_{h + 1}(t)\|_F$")
    ax.set_xlabel("time $t$ (depth)")
    ax.set_ylabel("Frobenius norm")
    span = f" (first {upto:g} time units)" if upto is not None and ts[-1] > upto else ""
    ax.set_title("time-varying query–key products" + span)
    legend_below(ax, ncol=min(norms.shape[1], 4))


def draw_ellipsoid_trajectories(ax, ys, W=None, *, mark=None, mark_label=None) -> None:
    """Token paths on `E_W` (start: white, end: red) over its wireframe, in the style
    of `draw_sphere_trajectories`; `mark` (a point or `(k, 3)` points) is drawn as
    red stars, e.g. the eigenvector `v₁`."""
    axes = None
    if W is not None:
        lam, vec = np.linalg.eigh(np.asarray(W))
        axes = vec / np.sqrt(lam)  # W^{-1/2} maps S² onto E_W
    draw_sphere_trajectories(ax, ys, axes)
    if mark is not None:
        mark = np.atleast_2d(np.asarray(mark))
        # hollow, so that the end points it predicts stay visible inside it
        ax.scatter(*mark.T, s=220, marker="*", facecolors="none", edgecolors="tab:red",
                   linewidths=1.4, depthshade=False, zorder=MARK_Z, label=mark_label)


def draw_sphere_density(ax, density, *, relative: bool = True, cmap: str = "viridis",
                        vmax: float | None = None):
    """A `ja.metrics.sphere_density` as a map: longitude × sin(latitude), the
    cylindrical equal-area (Lambert) projection, where its equal-area cells are equal
    rectangles and the picture's areas are the sphere's. The colour bar is left to
    the caller (`fig.colorbar(mesh, ax=ax, label=…)`).

    **Arguments:**

    - `ax`: a 2-D matplotlib axis.
    - `density`: a `SphereDensity` of one system (counts `(bands, sectors)`).
    - `relative`: colour by density over the uniform one (`4π ·` density: 1 is
      uniform); `False` colours by the counts.
    - `cmap`, `vmax`: the colour map and the top of its scale (default: the largest
      value).

    **Returns:**

    The `QuadMesh`, for a colour bar.
    """
    counts = np.asarray(density.counts)
    if counts.ndim != 2:
        raise ValueError(f"draw_sphere_density draws one map: `density.counts` must be "
                         f"(bands, sectors), got {counts.shape}; index the batch first.")
    values = np.asarray(density.density) * 4 * np.pi if relative else counts
    lon, z = np.asarray(density.lon_edges), np.asarray(density.z_edges)
    mesh = ax.pcolormesh(lon, z, values, cmap=cmap, vmin=0, vmax=vmax, shading="flat")
    ax.set_aspect("equal")  # x in radians, y = sin(latitude): Lambert's projection
    ax.grid(False)
    lon_ticks = np.arange(-180, 181, 90)
    ax.set_xticks(np.radians(lon_ticks), [f"{t}°" for t in lon_ticks])
    lat_ticks = np.array([-60, -30, 0, 30, 60])  # ±90° would crowd: sin flattens there
    ax.set_yticks(np.sin(np.radians(lat_ticks)), [f"{t}°" for t in lat_ticks])
    ax.set_xlim(-np.pi, np.pi)
    ax.set_ylim(-1, 1)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    return mesh


#: Minor ticks to label on a narrow log axis (by their leading digit), the densest
#: whose labels keep a line of space between them.
_LOG_SUBSETS = ((2, 3, 4, 5, 6, 7, 8, 9), (2, 3, 4, 5, 6, 8), (2, 3, 4, 6), (2, 3, 5), (2, 5), (3,),
                ())


def plain_log_labels(axis) -> None:
    """Plain numbers (`0.72`) on a log axis that spans less than two decades, where
    matplotlib would label minor ticks `7.2×10⁻¹`; wider axes keep powers of ten
    and matplotlib's choice of minor labels (none beyond a decade). On a narrow axis
    the minor ticks labelled are the most that leave a label's height between two
    labels, at the axis's size in the figure."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import LogFormatterSciNotation

    def narrow() -> tuple[float, float] | None:  # asked at every draw
        lo, hi = sorted(axis.get_view_interval())
        return (lo, hi) if lo > 0 and hi / lo < 100 else None

    class Plain(LogFormatterSciNotation):
        # a subclass, not a wrapper: matplotlib tells it the axis span (`set_locs`),
        # from which it picks the minor ticks to label; a wrapper labelled them all
        def __init__(self, minor: bool):
            super().__init__(labelOnlyBase=False)
            self.minor = minor

        def __call__(self, x, pos=None):
            span = narrow()
            if span is None:
                return super().__call__(x, pos)
            digit = round(x / 10 ** np.floor(np.log10(x) + 1e-9))
            text = f"{x:.3g}"  # 1000, not 1e+03
            text = f"{float(text):.0f}" if "e+" in text else text
            return text if not self.minor or digit in room(*span) else ""

    def room(lo, hi) -> tuple[int, ...]:
        box = axis.axes.bbox
        pixels = (box.height if axis.axis_name == "y" else box.width) / np.log10(hi / lo)
        points = FontProperties(size=rcParams[f"{axis.axis_name}tick.labelsize"])
        size = axis.get_figure(root=True).dpi / 72 * points.get_size_in_points()
        for subset in _LOG_SUBSETS:
            marks = np.log10([1, *subset, 10])
            if np.diff(marks).min() * pixels >= 2 * size:
                return subset
        return ()

    axis.set_major_formatter(Plain(minor=False))
    axis.set_minor_formatter(Plain(minor=True))


def text_color_on(background) -> str:
    """`"black"` or `"white"`, whichever contrasts more with `background` (any
    matplotlib colour) by its relative luminance (WCAG): the colour of a label
    written on a cell of a heat map."""
    from matplotlib.colors import to_rgb

    c = np.asarray(to_rgb(background))
    c = np.where(c <= 0.03928, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    luminance = float(c @ [0.2126, 0.7152, 0.0722])
    # contrast with black (L + 0.05) / 0.05 against white 1.05 / (L + 0.05)
    return "black" if (luminance + 0.05) ** 2 > 0.05 * 1.05 else "white"


def integer_ticks(axis) -> None:
    """Whole-number ticks on `axis` (`ax.xaxis`, `ax.yaxis`), for counts."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def opaque(legend):
    """`legend` with its line and patch keys drawn opaque (faint bundles of curves
    would otherwise give faint keys); returns it."""
    for handle in legend.legend_handles:
        if handle is not None:
            handle.set_alpha(1.0)
    return legend


def legend_under_panels(fig, ax, ncol: int = 2, **kw):
    """`ax`'s legend centred under all the panels, for lines that every panel draws
    (`save_figure` makes room for it)."""
    handles, labels = ax.get_legend_handles_labels()
    return fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0),
                      ncol=ncol, fontsize=kw.pop("fontsize", 8), frameon=False, **kw)


def legend_below(ax, ncol: int = 2, **kw):
    """The legend under the axis, off the data (for panels whose curves fill them)."""
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol,
                     fontsize=kw.pop("fontsize", 8), frameon=False, **kw)


def view_towards(ax, point) -> None:
    """Turn a 3-D axis towards `point` (a direction), so that it faces the viewer."""
    p = np.asarray(point, dtype=float)
    p = p / np.linalg.norm(p)
    # Seen from 10°–35° above, so that the axes and title stay readable.
    ax.view_init(elev=float(np.clip(np.degrees(np.arcsin(np.clip(p[2], -1, 1))), 10, 35)),
                 azim=float(np.degrees(np.arctan2(p[1], p[0]))))


def wrap(text: str, width_inches: float, fontsize: float = 10) -> str:
    """`text` broken into lines that fit `width_inches` at `fontsize` points (a long
    title, e.g. one naming a model's path, would otherwise run off the figure)."""
    per_line = max(20, int(width_inches * 72 / (0.6 * fontsize)))
    # never break inside mathtext: its spaces are held back while wrapping
    held = re.sub(r"\$[^$]*\$", lambda m: m.group().replace(" ", "\0"), text)
    count = -(-len(held) // per_line)  # lines needed; then lines of even length
    lines = textwrap.wrap(held, min(per_line, -(-len(held) // count) + 8),
                          break_on_hyphens=False)
    return "\n".join(lines).replace("\0", " ") or text


#: Metadata that keeps a figure's bytes the same from one run to the next: no creation
#: date in a PDF (matplotlib would stamp the time, or `SOURCE_DATE_EPOCH` when set);
#: a PNG carries only the software's name.
REPRODUCIBLE = {"pdf": {"CreationDate": None}, "png": {}}


def title_above(fig, title: str, fontsize: float = 10) -> None:
    """`title`, wrapped to the figure's width, above the panels: the figure grows by
    the title's height and room below it for the panels' titles and labels, and the
    panels keep their height. Call it before adding a colorbar, which takes its room
    from the panels' places."""
    title = wrap(title, fig.get_figwidth(), fontsize)
    room = (title.count("\n") + 1) * fontsize * 1.3 / 72 + 0.75  # inches
    height = fig.get_figheight()
    fig.set_figheight(height + room)
    fig.subplots_adjust(top=1 - room / (height + room))
    fig.suptitle(title, fontsize=fontsize, y=0.99, va="top")


def save_figure(fig, stem, title=None, *, tight: bool = True) -> list[Path]:
    """Write `fig` as `stem.png` and `stem.pdf` (each atomically) and close it; `title`
    (wrapped to the figure's width) goes above the panels.

    With `tight=False` the figure keeps the caller's layout (`tight_layout` cannot
    place a colorbar that spans several panels) and each image is cropped to what is
    drawn.

    **Returns:**

    The two paths.
    """
    plt = pyplot()
    if title:
        fig.suptitle(wrap(title, fig.get_figwidth(), 11), fontsize=11)
    if tight:
        fig.tight_layout()
    if tight and fig.legends:  # a legend under the panels (`legend_under_panels`)
        fig.canvas.draw()
        height = max(legend.get_window_extent().height for legend in fig.legends)
        fig.tight_layout(rect=(0.0, height / fig.bbox.height + 0.01, 1.0, 1.0))
    stem = Path(stem)
    paths = []
    for ext in ("png", "pdf"):
        path = stem.with_suffix(f".{ext}")
        paths.append(atomic_write(path, lambda f, ext=ext: fig.savefig(
            f, format=ext, bbox_inches=None if tight else "tight",
            metadata=REPRODUCIBLE[ext])))
    plt.close(fig)
    return paths
