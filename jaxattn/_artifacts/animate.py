"""Movies of the tokens: `ja.animate(xs, path, ts)` and `jaxattn animate DIR`.

A trajectory `(T, n, d)` becomes an MP4 (through `imageio-ffmpeg`) or a GIF
(Pillow), each frame drawn into one reused figure and streamed to the encoder. What
a frame shows for each `d` and many tokens: see docs/usage/animations.md.
"""

import contextlib
import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .._files import umask
from .._validate import refuse_first
from .figures import above_floor, mark_floor, pyplot, resolution
from .trajectories import on_sphere, tokens_title

#: Seconds of movie per frame at the default frame rate.
FPS = 20
#: The most frames a movie gets by default (the trajectory's saves are thinned to it).
MAX_FRAMES = 200
#: Above this many tokens a trajectory is drawn as a density: Lambert maps on S² (and
#: the ball), a ring on S¹ (whose circumference holds about 250 of the frame's dots).
DENSITY_ABOVE = {3: 2000, 2: 200}
#: The colours of a GIF's one palette (fewer compress better; the sphere's shading
#: needs a few dozen).
GIF_COLORS = 64
#: The light of the shaded sphere (unit vector towards it, in screen coordinates).
_LIGHT = np.array([-0.45, 0.55, 0.70]) / np.linalg.norm([-0.45, 0.55, 0.70])


#: The fastest GIF: 0.02 s a frame (browsers play shorter frames at 0.1 s).
GIF_FPS_MAX = 50


def gif_fps(fps: float) -> float:
    """The rate a GIF asked to play at `fps` plays at: its frames last whole hundredths
    of a second, the nearest to `1/fps` (30 → 33.3, 40 → 33.3, 45 → 50)."""
    return 100 / min(range(2, 101), key=lambda k: abs(100 / k - fps))


#: The sharpest frame: 6,400 × 7,200 pixels (at 10⁵ dpi one frame needed 1.8 TB).
MAX_DPI = 1000


def animate(xs, path, ts=None, *, E=None, title: str | None = None, layers: bool = False,
            fps: int = FPS, frames: int | None = MAX_FRAMES, trail: int = 8,
            spin: float = 60.0, elevation: float | None = None, dpi: int = 100,
            density_above: int | None = None, progress: bool = True) -> Path:
    """Write a movie of a token trajectory.

    **Arguments:**

    - `xs`: the tokens, `(T, n, d)` with `d ≥ 2` (a `solve_flow` or `run_layers`
      result saved at `T` times).
    - `path`: the movie, `.mp4` (H.264 through `imageio-ffmpeg`) or `.gif` (Pillow).
    - `ts`: the `T` times (default: `0, 1, …`, labelled as steps `step k`).
    - `E`: the misalignment at the `T` times (default: `ja.misalignment(xs)`).
    - `title`: a line over the picture.
    - `layers`: label the frames by layer (`layer k`) instead of time.
    - `fps`, `frames`: frame rate (a GIF plays at `gif_fps(fps)`, its frames lasting
      whole hundredths of a second), and the most frames (the `T` saves are thinned
      to it evenly; `None` keeps all).
    - `trail`: how many earlier frames each token's trail spans (0: none).
    - `spin`: degrees the sphere turns over the whole movie; `elevation`: the
      viewer's height above the equator, in degrees (default: facing the tokens'
      mean direction, within ±70°).
    - `dpi`: pixels per inch of the 6.4 × 7.2 in frame (100 → 640 × 720).
    - `density_above`: more tokens than this are drawn as a density (default: 200
      on S¹, as a ring with the order parameter `|mean x|` under it; 2,000 on S²
      and above, as Lambert maps).
    - `progress`: a progress bar on stderr.

    **Returns:**

    `path`, written whole or not at all.
    """
    path, unit = Path(path), frame_unit(ts, layers)
    suffix = path.suffix.lower()
    counts = (("fps", fps, 1), ("trail", trail, 0), ("dpi", dpi, 20),
              ("frames", 1 if frames is None else frames, 1))
    checks = [
        (suffix not in (".mp4", ".gif"),
         f"the movie's name must end in .mp4 or .gif, got {path.name!r}."),
        (suffix == ".mp4" and importlib.util.find_spec("imageio_ffmpeg") is None,
         f"writing {path.name} needs imageio-ffmpeg (ffmpeg in a wheel): pip install "
         "imageio-ffmpeg (jaxattn's `movies` extra), or write a .gif."),
        *((not isinstance(value, int | np.integer) or value < low,
           f"{name} must be a whole number ≥ {low}, got {value!r}.")
          for name, value, low in counts),
        (suffix == ".gif" and isinstance(fps, int | np.integer) and fps > GIF_FPS_MAX,
         f"a GIF plays at most {GIF_FPS_MAX} fps (its frames last whole hundredths of a second, "
         f"and browsers slow shorter ones to 0.1 s), got fps = {fps}: lower it, or write an .mp4."),
        (isinstance(dpi, int | np.integer) and dpi > MAX_DPI, f"dpi must be at most {MAX_DPI} "
         f"(a frame of {6.4 * MAX_DPI:.0f} × {7.2 * MAX_DPI:.0f} pixels), got {dpi}."),
        (not path.parent.is_dir(), f"{path.parent} is not a folder; cannot write {path.name}."),
        (path.is_dir(), f"{path} is a folder; name a file (e.g. {path / 'movie.mp4'})."),
        (not (isinstance(spin, int | float | np.number) and np.isfinite(spin)),
         f"spin must be a finite number of degrees, got {spin!r}."),
        (elevation is not None and not (isinstance(elevation, int | float | np.number)
                                        and -90 <= elevation <= 90),
         f"elevation must be a number of degrees in [-90, 90] (or None), got {elevation!r}."),
        (density_above is not None and (not isinstance(density_above, int | np.integer)
                                        or density_above < 0),
         f"density_above must be a whole number ≥ 0 (or None), got {density_above!r}."),
    ]
    xs, ts, E, dtype = trajectory_arrays(xs, ts, E, per="frame", also=checks)
    scene = Scene(xs, ts, E, dtype, title=title, unit=unit, trail=trail, spin=spin,
                  elevation=elevation, dpi=dpi, density_above=density_above)
    images = scene.frames(thinned(len(xs), frames), progress=progress)
    return _encode(images, path, fps, scene.size, scene.colors)


def trajectory_arrays(xs, ts=None, E=None, *, per: str = "frame", also=()):
    """`xs (T, n, d)` (`d ≥ 2`, finite), its `T` times (default `0, 1, …`) and its
    misalignment (default `ja.misalignment(xs)`) as float64 arrays, and the coarser
    float dtype of the tokens and `E` (below its `resolution` `E` is rounding noise):
    the one check of a trajectory to draw (`ja.animate`, `jaxattn view`) and of the
    caller's `(wrong, message)` pairs `also`; a `ValueError` names the first mistake
    (`per`: what one save is called in it)."""
    given = [np.asarray(a).dtype for a in (xs, E) if a is not None]
    if any(np.issubdtype(t, np.complexfloating) for t in given):
        raise ValueError("xs and E must be real (tokens and a misalignment), got complex "
                         "values.")
    xs = np.asarray(xs, dtype=np.float64)
    T = len(xs) if xs.ndim else 0
    ts, E = (None if a is None else np.asarray(a, np.float64) for a in (ts, E))
    refuse_first([
        (xs.ndim != 3 or min(xs.shape) < 1 or xs.shape[2] < 2,
         f"xs must be (T, n, d) with d ≥ 2, got shape {xs.shape}."),
        (not np.all(np.isfinite(xs)), "xs holds NaN or infinite values; nothing to draw."),
        *((a is not None and a.shape != (T,), f"{name} must hold one {what} per {per}, "
           f"shape ({T},), got {np.shape(a)}.")
          for name, a, what in (("ts", ts, "time"), ("E", E, "value"))),
        (ts is not None and ts.shape == (T,) and not (
            np.all(np.isfinite(ts)) and np.all(np.diff(ts) >= 0)),
         f"ts must be finite and nondecreasing (one time per {per}, in order)."),
        (E is not None and E.shape == (T,) and not np.all(E >= 0),
         "E must be ≥ 0 (a misalignment), got a negative value or NaN."),
        *also,
    ])
    if E is None:  # in the tokens' own precision (float64 ones under x64)
        import jax

        from ..metrics import misalignment

        with jax.enable_x64(given[0] == np.float64):
            E = misalignment(xs.astype(given[0] if given[0] == np.float64 else np.float32))
        given.append(E.dtype)
        E = np.asarray(E, np.float64)
    ts = np.arange(T, dtype=np.float64) if ts is None else ts
    floats = [t for t in given if np.issubdtype(t, np.floating)] or [np.dtype(np.float64)]
    return xs, ts, E, max(floats, key=lambda t: np.finfo(t).eps)


def frame_unit(ts, layers: bool) -> str:
    """What a save is labelled by: `layer` (asked for), `step` (no times given: the
    saves' index) or `t` (flow time)."""
    return "layer" if layers else ("step" if ts is None else "t")


def unit_ball(xs: np.ndarray) -> tuple[np.ndarray, str]:
    """The tokens `(T, n, d)` scaled into the unit ball (`d > 3`: on the three
    leading directions, `pca3`), and a note of the share a PCA kept, or that the
    tokens are off the unit sphere (`""` if neither)."""
    note, d = "", xs.shape[-1]
    if d > 3:
        xs, kept = pca3(xs)
        note = f"PCA of the trajectory: 3 of {d} dimensions keep {100 * kept:.1f}% of Σ‖x‖²"
    elif not on_sphere(xs):
        note = ("tokens off the unit sphere (e.g. on an ellipsoid): scaled into the unit "
                "ball, whose edge is drawn")
    scale = float(np.max(np.linalg.norm(xs, axis=-1)))
    return xs / (scale if scale > 0 else 1.0), note


def thinned(count: int, frames: int | None) -> np.ndarray:
    """The indices of the saves that become frames: all, or `frames` spread evenly."""
    if frames is None or frames >= count:
        return np.arange(count)
    return np.unique(np.round(np.linspace(0, count - 1, frames)).astype(int))


def pca3(xs: np.ndarray) -> tuple[np.ndarray, float]:
    """The tokens `(T, n, d)` on the three leading directions of their second moment
    about the origin over the whole trajectory, and the share of `Σ‖x‖²` these keep."""
    flat = xs.reshape(-1, xs.shape[-1])
    moment = flat.T @ flat
    values, vectors = np.linalg.eigh(moment)
    top = vectors[:, ::-1][:, :3]
    kept = float(values[::-1][:3].sum() / values.sum()) if values.sum() > 0 else 1.0
    return xs @ top, kept


def facing(xs: np.ndarray) -> tuple[float, float]:
    """The azimuth and elevation (degrees; within ±70°) that turn the tokens' mean
    direction over the whole trajectory towards the viewer (the last frame's when
    that mean is nearly 0)."""
    center = xs.reshape(-1, 3).mean(axis=0)
    if np.linalg.norm(center) < 1e-3:
        center = xs[-1].mean(axis=0)
    if np.linalg.norm(center) < 1e-9:
        return -35.0, 20.0
    grid = [(a, e) for a in range(0, 360, 3) for e in range(-70, 71, 5)]
    best = max(grid, key=lambda ae: float((_rotation(*ae) @ center)[2]))
    return float(best[0]), float(best[1])


def lambert_maps(points: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The density of `points (n, 3)` (screen coordinates, depth last) on the near
    and the far hemisphere, each as a Lambert azimuthal equal-area map onto the unit
    disk, histogrammed on a `bins × bins` grid over `[−1, 1]²`: the share of the
    tokens per unit of the sphere's area, over that of the uniform measure (1
    everywhere for uniform tokens; the far side is seen from behind)."""
    points = points / np.linalg.norm(points, axis=-1, keepdims=True)
    n = points.shape[0]
    cell = (2.0 / bins) ** 2  # a cell's area on the map, in units where the disk is π
    maps = []
    for sign in (1.0, -1.0):
        half = points[sign * points[:, 2] >= 0] if sign > 0 else points[points[:, 2] < 0]
        # the hemisphere (area 2π) onto the disk of radius √2, scaled to radius 1
        flat = half[:, :2] * np.sqrt(1.0 / (1.0 + sign * half[:, 2]))[:, None]
        if sign < 0:
            flat[:, 0] = -flat[:, 0]
        counts, _, _ = np.histogram2d(flat[:, 1], flat[:, 0], bins=bins,
                                      range=[[-1, 1], [-1, 1]])
        # map area a ↔ sphere area 2a; uniform: a share 2·cell/(4π) per cell
        maps.append(counts / n / (2.0 * cell / (4.0 * np.pi)))
    return maps[0], maps[1]


def _rotation(azimuth: float, elevation: float) -> np.ndarray:
    """World → screen: turn about the vertical axis by `azimuth`, then tilt the
    viewer up by `elevation` (degrees). Screen `(u, v, depth)`, depth > 0 is near."""
    a, e = np.radians(azimuth), -np.radians(elevation)
    turn = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
    # x → u (right), z → v (up), y → away from the viewer, then the tilt
    look = np.array([[1, 0, 0], [0, 0, 1], [0, -1, 0]], dtype=float)
    tilt = np.array([[1, 0, 0], [0, np.cos(e), np.sin(e)], [0, -np.sin(e), np.cos(e)]])
    return tilt @ look @ turn


def shaded_disk(pixels: int = 400) -> np.ndarray:
    """An RGBA image of the unit sphere lit from `_LIGHT` (transparent outside)."""
    u = np.linspace(-1, 1, pixels)
    U, V = np.meshgrid(u, u[::-1])
    inside = U**2 + V**2 <= 1
    W = np.sqrt(np.clip(1 - U**2 - V**2, 0, None))
    light = np.clip(U * _LIGHT[0] + V * _LIGHT[1] + W * _LIGHT[2], 0, None)
    shade = 0.55 + 0.45 * light
    base = np.array([0.80, 0.86, 0.94])
    image = np.zeros((pixels, pixels, 4))
    image[..., :3] = np.clip(shade[..., None] * base, 0, 1)
    image[..., 3] = np.where(inside, 0.9, 0.0)
    return image


class Scene:
    """One reused figure: the picture (sphere, circle, ball, ring or density maps),
    the E(t) panel under it and the frame's label; `frames` yields RGB arrays."""

    def __init__(self, xs, ts, E, dtype, *, title, unit, trail, spin, elevation, dpi,
                 density_above):
        self.plt = pyplot()
        self.ts, self.E, self.unit, self.trail, self.spin = ts, E, unit, trail, spin
        self.dtype, self.floor = np.dtype(dtype), resolution(dtype)
        title = title or tokens_title(xs)
        n, d = xs.shape[1:]
        self.ball = d > 3 or not on_sphere(xs)  # a plain disk: no sphere to shade
        self.xs, self.note = unit_ball(xs)
        if self.xs.shape[-1] == 3:
            azimuth, height = facing(self.xs)
            self.azimuth = azimuth - spin / 2
            self.elevation = height if elevation is None else elevation
        many = n > (DENSITY_ABOVE[min(d, 3)] if density_above is None else density_above)
        self.mode = ("ring" if many else "circle") if d == 2 else (
            "density" if many else "sphere")
        self.fig = self.plt.figure(figsize=(6.4, 7.2), dpi=dpi)
        self.fig.patch.set_facecolor("white")
        self.ax = self.fig.add_axes([0.04, 0.30, 0.92, 0.62])
        self.ax_e = self.fig.add_axes([0.14, 0.06, 0.80, 0.17])
        self.fig.text(0.5, 0.975, title, ha="center", va="top", fontsize=11)
        self.label = self.fig.text(0.5, 0.935, "", ha="center", va="top", fontsize=10,
                                   family="monospace")
        if self.note:
            self.fig.text(0.5, 0.285, self.note, ha="center", va="bottom", fontsize=8,
                          color="0.3")
        self.colors = _token_colors(n, self.plt)
        getattr(self, f"_setup_{self.mode}")()
        self._setup_energy()
        # Blitting: the still parts drawn once, each frame only the moving artists.
        self.moving = [a for a in (getattr(self, name, None) for name in _MOVING) if a is not None]
        self.moving += getattr(self, "maps", [])
        for artist in self.moving:
            artist.set_animated(True)
        self.fig.canvas.draw()
        self.background = self.fig.canvas.copy_from_bbox(self.fig.bbox)
        # the frame's pixels as matplotlib draws them (it truncates 7.2 · dpi; rounding
        # the size told ffmpeg one row too many at dpi 33, and it shifted the frames)
        self.size = self.fig.canvas.get_width_height()

    # --- the picture ---------------------------------------------------------------
    def _blank(self, half: float, wide: float | None = None):
        """The axis as a bare canvas `[-wide, wide] × [-half, half]` (square by default)."""
        self.ax.set_xlim(-(wide or half), wide or half)
        self.ax.set_ylim(-half, half)
        self.ax.set_aspect("equal")
        self.ax.axis("off")
        return self.ax

    def _setup_sphere(self):
        ax = self._blank(1.12)
        if self.ball:
            ax.add_patch(self.plt.Circle((0, 0), 1, fill=True, color="0.93", zorder=0))
        else:
            ax.imshow(shaded_disk(), extent=(-1, 1, -1, 1), zorder=0, interpolation="bilinear")
        ax.add_patch(self.plt.Circle((0, 0), 1, fill=False, color="0.45", lw=1.0, zorder=1))
        (self.equator,) = ax.plot([], [], color="0.55", lw=0.7, zorder=1)
        self._tokens(ax)
        self.back = ax.scatter([], [], s=40, facecolors="none", linewidths=1.6, zorder=2)
        ax.text(1.1, -1.1, "filled: near side\nrings: far side", ha="right", va="bottom",
                fontsize=7, color="0.35")

    def _tokens(self, ax):
        """The moving tokens of the sphere and the circle: their trails and markers."""
        from matplotlib.collections import LineCollection

        self.trails = LineCollection([], linewidths=1.6, zorder=3, capstyle="round")
        ax.add_collection(self.trails)
        self.front = ax.scatter([], [], s=46, edgecolors="0.1", linewidths=0.8, zorder=4)

    def _setup_circle(self):
        ax = self._blank(1.15)
        ax.add_patch(self.plt.Circle((0, 0), 1, fill=False, color="0.5", lw=1.2, zorder=1))
        self._tokens(ax)

    def _density_scale(self) -> dict:
        """The colours of a density (ring, maps): over the uniform one, 0.1 to 100."""
        from matplotlib.colors import LogNorm

        return {"cmap": self.plt.get_cmap("magma_r").with_extremes(bad="white"),
                "norm": LogNorm(0.1, 100)}

    def _density_bar(self, mappable, ax) -> None:
        bar = self.fig.colorbar(mappable, ax=ax, orientation="horizontal", fraction=0.04,
                                pad=0.02, shrink=0.5)
        bar.set_label("density / uniform density", fontsize=8)
        bar.ax.tick_params(labelsize=7)

    def _setup_ring(self):
        from matplotlib.collections import LineCollection

        ax = self._blank(1.3)
        n = self.xs.shape[1]
        # about 8 tokens an arc for the uniform measure, as the sphere's maps
        self.bins = int(np.clip(n / 8, 36, 360))
        edges = np.linspace(-np.pi, np.pi, self.bins + 1)
        arcs = [np.stack([np.cos(a), np.sin(a)], -1)
                for a in np.linspace(edges[:-1], edges[1:], 4).T]
        self.ring = LineCollection(arcs, linewidths=14, capstyle="butt", zorder=2,
                                   **self._density_scale())
        self.ring.set_array(np.ma.masked_all(self.bins))
        ax.add_collection(self.ring)
        # the empty band under the arcs (drawn with the arcs' width, in points)
        ax.add_patch(self.plt.Circle((0, 0), 1, fill=False, color="0.93", lw=16, zorder=1))
        (self.arrow,) = ax.plot([], [], color="0.2", lw=1.6, marker="o", markevery=[1],
                                ms=5, zorder=3)
        self.order = ax.text(0, -1.2, "", ha="center", va="top", fontsize=9)
        ax.text(0, 1.2, "the tokens' density on the circle (grey: none); "
                "arrow: their mean", ha="center", fontsize=8, color="0.3")
        self._density_bar(self.ring, ax)

    def _setup_density(self):
        ax = self._blank(1.3, wide=2.3)
        n = self.xs.shape[1]
        # about 8 tokens a cell for the uniform measure: coarser cells for fewer tokens
        self.bins = int(np.clip(np.sqrt(n / 8 / (np.pi / 2)), 12, 72))
        empty = np.ma.masked_all((self.bins, self.bins))
        self.maps = []
        for center, name in ((-1.15, "near hemisphere"), (1.15, "far hemisphere")):
            extent = (center - 1, center + 1, -1, 1)
            image = ax.imshow(empty, extent=extent, origin="lower", interpolation="nearest",
                              **self._density_scale())
            image.set_clip_path(self.plt.Circle((center, 0), 1, transform=ax.transData))
            ax.add_patch(self.plt.Circle((center, 0), 1, fill=False, color="0.4", lw=0.8))
            ax.text(center, -1.12, name, ha="center", va="top", fontsize=8)
            self.maps.append(image)
        ax.text(0, 1.2, "Lambert equal-area maps of the tokens' density (white: none)",
                ha="center", fontsize=8, color="0.3")
        self._density_bar(self.maps[0], ax)

    def _setup_energy(self):
        # E ends where it reaches the resolution of its dtype: below, rounding noise
        ax, ts = self.ax_e, self.ts
        E, cut = above_floor(self.E, self.floor)
        self.shown = E
        positive = E[E > 0]
        # few saves (a loop's depths): points joined, not a curve
        ax.plot(ts, E, "o-" if len(ts) <= 30 else "-", color="0.25", lw=1.2, ms=3)
        if cut:
            mark_floor(ax, self.floor, self.dtype)
            ax.legend(fontsize=7, loc="upper right", frameon=False)
        low = min(positive.min(), self.floor) if cut and positive.size else None
        if positive.size and (cut or positive.max() / positive.min() > 100):
            ax.set_yscale("log")
            ax.set_ylim((low or positive.min()) / 2, positive.max() * 2)
        ax.set_xlim(ts[0], ts[-1] if ts[-1] > ts[0] else ts[0] + 1)
        if len(ts) > 2 and ts[0] >= 0 and ts[1] > 0 and ts[-1] / ts[1] > 1e3:  # a log grid
            ax.set_xscale("symlog", linthresh=float(ts[1]))
        ax.set_xlabel(self.unit)
        ax.set_ylabel("E(t)")
        (self.marker,) = ax.plot([], [], "o", color="tab:red", ms=6, zorder=5)
        self.cursor = ax.axvline(ts[0], color="tab:red", lw=0.8, alpha=0.6)

    # --- one frame -----------------------------------------------------------------
    def _draw_sphere(self, history: np.ndarray, frac: float):
        R = _rotation(self.azimuth + self.spin * frac, self.elevation)
        screen = history @ R.T  # (k, n, 3)
        now = screen[-1]
        near = now[:, 2] >= 0
        self.front.set_offsets(now[near, :2])
        self.front.set_facecolors(self.colors[near])
        self.back.set_offsets(now[~near, :2] if (~near).any() else np.zeros((0, 2)))
        self.back.set_edgecolors(self.colors[~near] * [1, 1, 1, 0] + [0, 0, 0, 0.7])
        a = np.linspace(0, 2 * np.pi, 181)
        ring = np.stack([np.cos(a), np.sin(a), np.zeros_like(a)], -1) @ R.T
        ring = np.where(ring[:, 2:] >= 0, ring, np.nan)
        self.equator.set_data(ring[:, 0], ring[:, 1])
        self._set_trails(screen[..., :2], screen[..., 2] >= 0)

    def _draw_circle(self, history: np.ndarray, frac: float):
        self.front.set_offsets(history[-1])
        self.front.set_facecolors(self.colors)
        self._set_trails(history, np.ones(history.shape[:2], bool))

    def _draw_ring(self, history: np.ndarray, frac: float):
        now = history[-1]
        angles = np.arctan2(now[:, 1], now[:, 0])
        counts, _ = np.histogram(angles, bins=self.bins, range=(-np.pi, np.pi))
        self.ring.set_array(np.ma.masked_less_equal(counts / len(now) * self.bins, 0))
        mean = now.mean(axis=0)
        self.arrow.set_data([0, mean[0]], [0, mean[1]])
        self.order.set_text(f"order parameter |mean x| = {np.linalg.norm(mean):.3f}")

    def _draw_density(self, history: np.ndarray, frac: float):
        R = _rotation(self.azimuth + self.spin * frac, self.elevation)
        for image, share in zip(self.maps, lambert_maps(history[-1] @ R.T, self.bins)):
            image.set_data(np.ma.masked_less_equal(share, 0))

    def _set_trails(self, points: np.ndarray, near: np.ndarray):
        k = points.shape[0]
        if self.trail == 0 or k < 2:
            self.trails.set_segments([])
            return
        segments = np.stack([points[:-1], points[1:]], axis=2)  # (k-1, n, 2, 2)
        age = np.linspace(0.15, 0.9, k - 1)[:, None]
        alpha = age * np.where(near[:-1] & near[1:], 1.0, 0.35)
        colors = np.broadcast_to(self.colors[None], (k - 1,) + self.colors.shape).copy()
        colors[..., 3] = alpha
        self.trails.set_segments(segments.reshape(-1, 2, 2))
        self.trails.set_colors(colors.reshape(-1, 4))

    def frames(self, picks: np.ndarray, *, progress: bool) -> Iterator[np.ndarray]:
        """The frames at the saves `picks`, one RGB array `(H, W, 3)` at a time."""
        from tqdm.auto import tqdm

        draw = getattr(self, f"_draw_{self.mode}")
        last = max(len(picks) - 1, 1)
        try:
            for j, i in enumerate(tqdm(picks, desc="animate", unit="frame",
                                       disable=not progress, leave=False)):
                start = picks[max(0, j - self.trail)]
                history = self.xs[start:i + 1]
                step = max(1, (i - start) // max(self.trail, 1))
                history = history[::-1][::step][::-1]  # ends on the frame itself
                draw(history, j / last)
                t = self.ts[i]
                when = f"t = {t:.4g}" if self.unit == "t" else f"{self.unit} {int(round(t))}"
                value = (f"E = {self.E[i]:.2e}" if self.E[i] > self.floor else
                         f"E < {self.floor:.1e} ({self.dtype.name} resolution)")
                self.label.set_text(f"{when}    {value}")
                self.marker.set_data([t], [self.shown[i]])
                self.cursor.set_xdata([t, t])
                self.fig.canvas.restore_region(self.background)
                for artist in self.moving:
                    self.fig.draw_artist(artist)
                yield np.asarray(self.fig.canvas.buffer_rgba())[..., :3].copy()
        finally:
            self.plt.close(self.fig)


#: The artists a frame changes (drawn over the still background), in drawing order.
_MOVING = ("equator", "ring", "arrow", "trails", "back", "front", "label", "order", "cursor",
           "marker")


def _token_colors(n: int, plt) -> np.ndarray:
    cmap = plt.get_cmap("tab10" if n <= 10 else "turbo")
    values = np.arange(n) if n <= 10 else np.linspace(0.05, 0.95, n)
    return np.asarray(cmap(values), dtype=float)


def _encode(images: Iterator[np.ndarray], path: Path, fps: int, size, colors) -> Path:
    """Stream the frames to the encoder under a temporary name, then rename."""
    with as_written(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
        os.close(fd)
        try:
            if path.suffix.lower() == ".mp4":
                _write_mp4(images, tmp, fps, size)
            else:
                _write_gif(images, tmp, fps, colors)
            os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600, whatever the umask
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)  # gone already when the rename succeeded
    return path


@contextlib.contextmanager
def as_written(path: Path):
    """An `OSError` of writing `path` (through a temporary file beside it) names
    `path`, the file the caller asked for, not the temporary one."""
    try:
        yield
    except OSError as e:
        if e.errno is None or e.filename in (None, str(path)):
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def _write_mp4(images, tmp: str, fps: int, size) -> None:
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(tmp, size, fps=fps, codec="libx264",
                                         pix_fmt_out="yuv420p", quality=7,
                                         macro_block_size=16, ffmpeg_log_level="error")
    # imageio-ffmpeg would fork this (multithreaded, JAX) process to run os.setpgrp
    # in the child; without that hook Python spawns ffmpeg with vfork/posix_spawn
    previous = os.environ.get(_NO_FORK)
    os.environ[_NO_FORK] = "1"
    try:
        writer.send(None)  # start ffmpeg
    finally:
        if previous is None:
            del os.environ[_NO_FORK]
        else:
            os.environ[_NO_FORK] = previous
    try:
        for image in images:
            writer.send(np.ascontiguousarray(image))
    finally:
        writer.close()


#: imageio-ffmpeg's switch that starts ffmpeg without a `preexec_fn` (no fork).
_NO_FORK = "IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"


def _write_gif(images, tmp: str, fps: int, colors: np.ndarray) -> None:
    """A GIF through Pillow: one palette for every frame, the first frame's main colours
    and the tokens' own (a palette per frame would flicker, and a palette fitted to
    the sphere's shading alone turns small coloured dots grey)."""
    from PIL import Image

    images = iter(images)
    first = next(images)  # `animate` draws one frame at least
    tokens = np.round(255 * np.asarray(colors)[:, :3]).astype(int)[:GIF_COLORS // 2]
    base = Image.fromarray(first).quantize(colors=GIF_COLORS - len(tokens),
                                           method=Image.Quantize.MEDIANCUT)
    palette = base.getpalette()[:3 * (GIF_COLORS - len(tokens))] + tokens.reshape(-1).tolist()
    reference = Image.new("P", (1, 1))
    reference.putpalette(palette + [0] * (768 - len(palette)))

    def indexed(image):
        return Image.fromarray(image).quantize(palette=reference, dither=Image.Dither.NONE)

    frames = [indexed(first)] + [indexed(image) for image in images]
    frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:],
                   duration=round(1000 / gif_fps(fps)), loop=0, optimize=True, disposal=1)
