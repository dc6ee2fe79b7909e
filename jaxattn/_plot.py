"""Figures: one consistent matplotlib style for every plot jaxattn writes."""

from pathlib import Path

import numpy as np

from ._runs import atomic_write


def pyplot():
    """`matplotlib.pyplot` on the file-only Agg backend, in jaxattn's style.

    Imported here, at the first figure, not at the top of the module: selecting Agg
    on `import jaxattn` would switch a notebook's interactive backend, and a
    simulation never pays for matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "savefig.dpi": 150,
            "font.size": 10,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def draw_sphere_trajectories(ax, ys) -> None:
    """Token paths on S² (start: white circle, end: grey circle) over a wireframe."""
    ys = np.asarray(ys)
    u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
    ax.plot_wireframe(
        np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4
    )
    for i in range(ys.shape[1]):
        ax.plot(*ys[:, i].T, color="tab:blue", lw=1.2)
    ax.scatter(*ys[0].T, s=40, c="white", edgecolors="k", depthshade=False, zorder=5, label="start")
    ax.scatter(*ys[-1].T, s=60, c="0.5", edgecolors="k", depthshade=False, zorder=6, label="end")
    ax.set_box_aspect((1, 1, 1))
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_zlabel("$x_3$")
    ax.legend(loc="upper left", fontsize=8)


def draw_misalignment(ax, ts, E, *, label=None, **kw) -> None:
    """`E(t)` on a log scale (floored at float resolution so zeros stay visible)."""
    E = np.maximum(np.asarray(E), 1e-16)
    ax.semilogy(np.asarray(ts), E.T if E.ndim > 1 else E, label=label, **kw)
    ax.set_xlabel("time $t$")
    ax.set_ylabel(r"misalignment $E(x(t))$")


def save_sphere_figure(ys, ts, E, path) -> Path:
    """Trajectories on the sphere beside `E(t)`, written as PNG."""
    plt = pyplot()
    fig = plt.figure(figsize=(10, 4.5))
    ax3 = fig.add_subplot(1, 2, 1, projection="3d")
    draw_sphere_trajectories(ax3, ys)
    ax3.set_title("tokens on $S^2$")
    ax = fig.add_subplot(1, 2, 2)
    draw_misalignment(ax, ts, E, color="tab:blue")
    ax.set_title("consensus: $E(t) \\to 0$")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


# --- the experiments of paper 001 §6.1 (`jaxattn run`) ------------------------------

_FLOOR = 1e-16  # below float64 resolution: plotted at the floor so zeros stay visible


def draw_decay(ax, ts, values, *, label=None, **kw) -> None:
    """A nonnegative quantity tending to zero, on a log scale (floored at 1e-16)."""
    values = np.maximum(np.asarray(values), _FLOOR)
    ax.semilogy(np.asarray(ts), values.T if values.ndim > 1 else values, label=label, **kw)
    ax.set_xlabel("time $t$ (depth)")


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
    ax.legend(fontsize=8, loc="upper right")


def draw_ellipsoid_trajectories(ax, ys, W=None, *, mark=None, mark_label=None) -> None:
    """Token paths on `E_W` (start: white, end: grey) over its wireframe, in the style
    of `draw_sphere_trajectories`; `mark` (a point or `(k, 3)` points) is drawn as
    red stars, e.g. the eigenvector `v₁`."""
    if W is None:
        draw_sphere_trajectories(ax, ys)
    else:
        ys = np.asarray(ys)
        lam, vec = np.linalg.eigh(np.asarray(W))
        u, v = np.mgrid[0 : 2 * np.pi : 40j, 0 : np.pi : 20j]
        sphere = np.stack([np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v)], -1)
        pts = sphere @ (vec / np.sqrt(lam)).T  # W^{-1/2} maps S² onto E_W
        ax.plot_wireframe(pts[..., 0], pts[..., 1], pts[..., 2], color="0.85", lw=0.4)
        for i in range(ys.shape[1]):
            ax.plot(*ys[:, i].T, color="tab:blue", lw=1.2)
        ax.scatter(*ys[0].T, s=40, c="white", edgecolors="k", depthshade=False, zorder=5,
                   label="start")
        ax.scatter(*ys[-1].T, s=60, c="0.5", edgecolors="k", depthshade=False, zorder=6,
                   label="end")
        ax.set_box_aspect(np.ptp(pts.reshape(-1, 3), axis=0))
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
        ax.set_zlabel("$x_3$")
    if mark is not None:
        mark = np.atleast_2d(np.asarray(mark))
        ax.scatter(*mark.T, s=150, marker="*", c="tab:red", edgecolors="k", depthshade=False,
                   zorder=7, label=mark_label)
    ax.legend(loc="upper left", fontsize=8)


def face(ax, point) -> None:
    """Turn a 3-D axis towards `point` (a direction), so that it faces the viewer."""
    p = np.asarray(point, dtype=float)
    p = p / np.linalg.norm(p)
    # Seen from 10°–35° above, so that the axes and title stay readable.
    ax.view_init(elev=float(np.clip(np.degrees(np.arcsin(np.clip(p[2], -1, 1))), 10, 35)),
                 azim=float(np.degrees(np.arctan2(p[1], p[0]))))


def save_figure(fig, stem, title=None) -> list[Path]:
    """Write `fig` as `stem.png` and `stem.pdf` (each atomically) and close it.

    **Returns:**

    The two paths.
    """
    plt = pyplot()
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    stem = Path(stem)
    paths = []
    for ext in ("png", "pdf"):
        path = stem.with_suffix(f".{ext}")
        paths.append(atomic_write(path, lambda f, ext=ext: fig.savefig(f, format=ext)))
    plt.close(fig)
    return paths
