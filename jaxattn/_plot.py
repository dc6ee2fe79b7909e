"""Figures: one consistent matplotlib style for every plot jaxattn writes."""

from pathlib import Path

import numpy as np


def _pyplot():
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
    plt = _pyplot()
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
