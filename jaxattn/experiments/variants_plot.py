"""The figure, the verdict table and the verdict lines of the `variants` study
(`variants.py` computes; this module only reads its cells)."""

import csv
import io
import math
from pathlib import Path

import numpy as np

from .._artifacts import figures
from .._artifacts.trajectories import superscript
from .._files import atomic_write
from .base import Config

#: The columns of `table.csv`, one row per cell.
COLUMNS = ("size", "tokens", "dim", "norm", "mask", "kernel", "beta", "reached",
           "consensus_layer_median", "final_E_median", "clusters_median", "residual_median",
           "stalled", "finite", "theorem", "in_domain", "no_theorem_because", "outcome", "kind",
           "verdict", "command")
#: The colour scale's floor: E below it is drawn as it (the colour bar's pointed end).
LOG_FLOOR = -16.0


def table_csv(path: Path, rows: list[dict]) -> Path:
    """Write the cells as `table.csv` (atomically), numbers as their shortest text."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([repr(v) if isinstance(v, float) else v for v in
                         (row[c] for c in COLUMNS)])
    text = buffer.getvalue().encode()
    return atomic_write(path, lambda f: f.write(text))


def _variant(row: dict) -> str:
    return f"{row['norm']} · {row['mask']} · {row['kernel']}"


def _betas(rows: list[dict]) -> str:
    return ", ".join(f"{r['beta']:g}" for r in rows)


def format_verdicts(rows: list[dict]) -> tuple[str, dict[str, str]]:
    """The verdict line of the study and one plain sentence per variant (norm · mask ·
    kernel), per size: the theorem that covers it, and at which β it collapses,
    keeps tokens apart or is still converging at the final depth."""
    per_variant: dict[str, str] = {}
    for name in dict.fromkeys(_variant(r) for r in rows):
        mine = [r for r in rows if _variant(r) == name]
        parts = []
        for size in dict.fromkeys((r["tokens"], r["dim"]) for r in mine):
            cells = [r for r in mine if (r["tokens"], r["dim"]) == size]
            said = [f"{word} at β = {_betas(sel)}" for word, sel in (
                (w, [r for r in cells if r["outcome"] == o])
                for w, o in (("consensus", "consensus"), ("tokens kept apart", "apart"),
                             ("still converging", "slow"), ("overflow", "overflow")))
                    if sel]
            parts.append(f"n = {size[0]}, d = {size[1]}: {'; '.join(said)}")
        theorem = mine[0]["theorem"]
        cover = (f"Theorem {theorem}" if theorem != "none" else
                 f"no theorem ({mine[0]['no_theorem_because']})")
        per_variant[name] = f"{cover}. " + " | ".join(parts)
    return _line(rows), per_variant


def _line(rows: list[dict]) -> str:
    """How many cells follow a theorem, collapse without one, keep tokens apart."""
    count = len(rows)
    theorem = sum(r["kind"] == "theorem" for r in rows)
    new_collapse = sum(r["kind"] == "new" and r["outcome"] == "consensus" for r in rows)
    apart = [r for r in rows if r["outcome"] == "apart"]
    slow = sum(r["outcome"] == "slow" for r in rows)
    missed = sum(r["kind"] == "theorem, not reached" for r in rows)
    parts = [f"{count} cells: {theorem} in consensus as a theorem predicts, {missed} a theorem "
             f"covers NOT in consensus by the final depth, {new_collapse} "
             "collapse without a theorem", f"{len(apart)} keep tokens apart",
             f"{slow} still converging at the final depth",
             f"{sum(r['outcome'] == 'overflow' for r in rows)} overflow"]
    if apart:
        names = dict.fromkeys(_variant(r) for r in apart)
        parts.append("apart: " + ", ".join(
            f"{v} (β = {_betas([r for r in apart if _variant(r) == v])})" for v in names))
    return "; ".join(parts)


def _panel_grid(rows: list[dict], size: tuple[int, int], norms, masks, kernels, betas):
    """The cells of one size as `(norm·mask, kernel·β)` arrays: log₁₀ E, the text in
    each cell (★ where a theorem covers it: softmax cells of a row, not its others)."""
    R, C = len(norms) * len(masks), len(kernels) * len(betas)
    logE, text = np.full((R, C), np.nan), np.full((R, C), "", dtype=object)
    for r in rows:
        if (r["tokens"], r["dim"]) != size:
            continue
        i = norms.index(r["norm"]) * len(masks) + masks.index(r["mask"])
        j = kernels.index(r["kernel"]) * len(betas) + betas.index(r["beta"])
        E = r["final_E_median"]
        if r["outcome"] != "overflow":  # overflowed tokens have no E: left blank
            logE[i, j] = max(math.log10(E), LOG_FLOOR) if E > 0 else LOG_FLOOR
        text[i, j] = _cell_text(r) + ("★" if r["theorem"] != "none" else "")
    return logE, text


def _median(value: float) -> str:
    """A median of whole numbers: whole, or its half (6.5 read "6": `:.0f` rounds half to
    even)."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def _cell_text(row: dict) -> str:
    """A cell's number: the median consensus layer when it collapses, the median
    cluster count (`k3`) when tokens stay apart, the share of instances in consensus
    (`40%`, `…` for none) when still converging, `∞` when the tokens overflow."""
    if row["outcome"] == "consensus":
        return _median(row["consensus_layer_median"])
    if row["outcome"] == "apart":
        return f"k{_median(row['clusters_median'])}"
    if row["outcome"] == "overflow":
        return "∞"
    return f"{row['reached']:.0%}" if row["reached"] > 0 else "…"


def draw_study(config: Config, grid, data: dict, rows: list[dict], stem: Path) -> list[Path]:
    """The study at a glance: per size, a heat map of the median final `log₁₀ E` with
    variants (norm · mask) as rows and kernel · β as columns, each cell annotated
    with its consensus layer, its cluster count or `…`; `★` marks the cells a theorem
    covers. A study of one cell is its median `E` over the layers instead (a map of one
    cell says nothing)."""
    norms, masks, kernels, betas = (list(v) for v in (grid.norms, grid.masks, grid.kernels,
                                                      grid.betas))
    R, C = len(norms) * len(masks), len(kernels) * len(betas)
    S = len(grid.sizes)
    if R * C * S == 1:
        return _draw_one_cell(config, data, rows[0], stem)
    # at least 6 inches: a single cell would otherwise leave the title a narrow column;
    # 1.3 inches on the left for the row labels
    width = max(6.0, 2.2 + (0.6 * C + 0.6) * S)
    fig, axes = figures.pyplot().subplots(
        1, S, figsize=(width, 2.2 + 0.32 * R), squeeze=False, sharey=True,
        gridspec_kw={"wspace": 0.08, "left": max(0.125, 1.3 / width)})
    mesh = None
    for p, (ax, size) in enumerate(zip(axes[0], grid.sizes)):
        logE, text = _panel_grid(rows, tuple(size), norms, masks, kernels, betas)
        mesh = ax.imshow(logE, cmap="viridis", vmin=LOG_FLOOR, vmax=0, aspect="auto",
                         interpolation="nearest")
        ax.grid(False)
        for (i, j), label in np.ndenumerate(text):
            under = mesh.to_rgba(logE[i, j]) if np.isfinite(logE[i, j]) else ax.get_facecolor()
            ax.text(j, i, label, ha="center", va="center", fontsize=7,
                    color=figures.text_color_on(under))
        _label_axes(ax, norms, masks, kernels, betas, rows_labelled=p == 0)
        ax.set_title(f"n = {size[0]} tokens in R{superscript(size[1])}", fontsize=10, pad=16)
    title = (f"Which variants collapse, how fast, which do not ({_setup(config, masks)} "
             "per cell). Number: median layer "
             "at which E < 1e-4; kN: tokens kept apart in N clusters; p%: still converging, "
             "p % of the instances in consensus (…: none); ∞: overflow; ★: a theorem covers "
             "the cell")
    figures.title_above(fig, title)  # before the colorbar
    # the floor is a clip: values under it (down to float64's ~1e-29) are drawn at it
    fig.colorbar(mesh, ax=list(axes[0]), shrink=0.6, pad=0.02, extend="min",
                 label=f"median log₁₀ E at layer {config.layers} (≤ {LOG_FLOOR:.0f} at the "
                       "bottom)")
    return figures.save_figure(fig, stem, tight=False)


def _setup(config, masks) -> str:
    """The instances' set-up, in words (only the settings of the masks drawn)."""
    used = ([f"window w = {config.window}"] if "window" in masks else []) + \
        ([f"sparse p = {config.keep:g}"] if "sparse" in masks else [])
    return (f"{config.instances} random instances, h = {config.heads}, P Gaussian, U = I/h, "
            f"τ = {config.tau:g}{''.join(', ' + u for u in used)}")


def _draw_one_cell(config, data: dict, row: dict, stem: Path) -> list[Path]:
    """One cell: its median `E` over the layers, its outcome in the title."""
    E = np.asarray(data["E_median"]).reshape(-1)
    fig, ax = figures.pyplot().subplots(figsize=(6.4, 3.8))
    figures.draw_decay(ax, np.arange(len(E)), E, color="C0", label="median E")
    ax.axhline(1e-4, color="C3", ls="--", lw=1, label="consensus: E < 1e-4")
    ax.set_xlabel("layer")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("misalignment E")
    ax.legend(fontsize=8, loc="upper right")
    outcome = {"consensus": f"consensus at layer {_median(row['consensus_layer_median'])} "
                            "(median)",
               "apart": f"tokens kept apart in {_median(row['clusters_median'])} clusters",
               "overflow": "overflow"}.get(row["outcome"], f"still converging at layer "
                                           f"{config.layers}: {row['reached']:.0%} of the "
                                           "instances in consensus")
    cover = (f"Theorem {row['theorem']}" if row["theorem"] != "none" else "no theorem")
    ax.set_title(f"{_variant(row)}, β = {row['beta']:g}, n = {row['tokens']} tokens in "
                 f"R{superscript(row['dim'])} ({cover})\n{outcome}\n"
                 f"{_setup(config, [row['mask']])}", fontsize=9)
    fig.tight_layout()
    return figures.save_figure(fig, stem, tight=False)


def _label_axes(ax, norms, masks, kernels, betas, *, rows_labelled: bool) -> None:
    """Row labels `norm · mask` on the first panel,
    column labels β with the kernel above, and lines between norms and kernels."""
    if rows_labelled:
        labels = [f"{n} · {m}" for n in norms for m in masks]
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xticks(range(len(kernels) * len(betas)),
                  [f"{b:g}" for _ in kernels for b in betas], fontsize=8)
    ax.set_xlabel("β")
    for i in range(1, len(norms)):
        ax.axhline(i * len(masks) - 0.5, color="white", lw=1.5)
    for k, kernel in enumerate(kernels):
        if k:
            ax.axvline(k * len(betas) - 0.5, color="white", lw=2.5)
        # just above the axis, in points: a row's height varies with the number of rows
        ax.annotate(kernel, ((k + 0.5) * len(betas) - 0.5, 1.0), xytext=(0, 2),
                    xycoords=ax.get_xaxis_transform(), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9)
