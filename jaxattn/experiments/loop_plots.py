"""Figures of looped models: mean misalignment with a 10–90 % band versus depth."""

from pathlib import Path

import numpy as np

from .._plot import _pyplot

_FLOOR = 1e-9  # below float32 resolution of E; keeps exact zeros on a log axis
COLORS = {"attn": "tab:blue", "full": "tab:orange"}
LABELS = {"attn": "pure attention (no FFN)", "full": "full blocks"}


def draw_loop(ax, E, layers_per_pass: int, *, label=None, color="tab:blue") -> None:
    """Mean `E` over prompts versus depth, with the 10–90 % band, on a log axis.

    **Arguments:**

    - `ax`: a matplotlib axis.
    - `E`: `(prompts, depth)` misalignment after every block (column 0: input).
    - `layers_per_pass`: the model's depth `L` (faint lines mark the passes).
    """
    E = np.maximum(np.asarray(E, dtype=np.float64), _FLOOR)
    depth = np.arange(E.shape[1])
    lo, hi = np.quantile(E, [0.1, 0.9], axis=0)
    ax.fill_between(depth, lo, hi, color=color, alpha=0.22, lw=0)
    ax.plot(depth, E.mean(axis=0), color=color, lw=1.6, label=label)
    passes = (E.shape[1] - 1) // layers_per_pass
    if 1 < passes <= 40:
        for p in range(1, passes):
            ax.axvline(p * layers_per_pass, color="0.6", lw=0.5, alpha=0.5, zorder=0)
    ax.set_yscale("log")
    ax.set_xlim(0, depth[-1])
    ax.set_xlabel(f"depth (blocks; a pass = {layers_per_pass})")
    ax.set_ylabel(r"misalignment $E$")


def save_loop_figure(E, layers_per_pass: int, path, *, title: str, variant: str) -> Path:
    """One looped run: mean `E` with its 10–90 % band versus depth (PNG or PDF by suffix)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    draw_loop(ax, E, layers_per_pass, label=f"{LABELS[variant]}: mean, 10–90 %",
              color=COLORS[variant])
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_grid_figure(results: dict, layers_per_pass: int, path, *, title: str) -> Path:
    """The paper's Figs. 7–10 for one model: a panel per weight kind, pure attention
    and full blocks in each. `results` maps `(weights, variant)` to `E`."""
    plt = _pyplot()
    kinds = [w for w in ("trained", "random", "resample") if any(k[0] == w for k in results)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), sharey=True,
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for variant in ("attn", "full"):
            if (kind, variant) in results:
                draw_loop(ax, results[kind, variant], layers_per_pass, label=LABELS[variant],
                          color=COLORS[variant])
        ax.set_title(f"{kind} weights", fontsize=10)
        if ax is not axes[0][0]:
            ax.set_ylabel("")
    axes[0][0].legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
