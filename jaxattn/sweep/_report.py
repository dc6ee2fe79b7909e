"""What a sweep reports: each instance's status (held, still converging, contradicted,
solver failed, outside the domain), per-point statistics and the sweep's verdict, the
printed table, the summary figure (its consensus tolerance read from the sweep's
`sweep.json`)."""

import math
from pathlib import Path
from typing import Any

import numpy as np

from .._artifacts.figures import legend_under_panels, pyplot, save_figure
from .._artifacts.folders import read_json
from .._horizon import CONSENSUS_TOL
from ..experiments import get_experiment
from ..experiments.verdicts import UNSTABLE_TOL, convergence_trend, run_kind


def _quantiles(x) -> tuple[float, float, float]:
    """The quartiles of the consensus times: a failed solve's (NaN) left out, one that
    never reached the tolerance (`inf`) counted as later than T, so a quartile among
    them is `inf` ("> T"), as linear interpolation with `inf` as the largest value."""
    x = np.asarray(x, float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return (float("nan"),) * 3
    reached = x[np.isfinite(x)]
    late = reached.max() + 1.0 if reached.size else 0.0  # above every reached time
    q = np.quantile(np.where(np.isfinite(x), x, late), [0.25, 0.5, 0.75])
    q = np.where(q > (reached.max() if reached.size else -np.inf), np.inf, q)
    return float(q[0]), float(q[1]), float(q[2])


#: The statuses of a sweep's instances (`table.csv`'s `status` column), in the order
#: the report counts them.
STATUSES = ("held", "not_converged", "contradicted", "solver_failed", "outside_domain")

#: `prediction_held` of each status: decided only where the theorem speaks and the run
#: decided it (empty outside the domain, after a solver failure, and while converging).
PREDICTION_HELD = {"held": "true", "not_converged": "", "contradicted": "false",
                   "solver_failed": "", "outside_domain": ""}


#: The residual `max_i 1 − ⟨x_i, ℓ⟩` of a state near an unstable equilibrium of the
#: theorem: a token at −x₁ (5.1), the worst token on the equator ⟨x, v₁⟩ = 0 (5.2).
UNSTABLE_RESIDUAL = {"5.1": 2.0, "5.2": 1.0}


def instance_status(success, inside, reached, ts, residual, theorem: str = "") -> str:
    """An instance's `status` (`STATUSES`): `solver_failed`, `outside_domain` (the
    theorem says nothing), `held` (the outcome was reached), else, judged on the trend
    of its distance to the predicted outcome `residual` over the last third of the
    run (`convergence_trend`), `not_converged` (still converging at T) or
    `contradicted` (stalled; a rise is `not_converged`, and so is a stall near one of
    the `theorem`'s unstable equilibria, a plateau: `run_kind`)."""
    if not success:
        return "solver_failed"
    if not inside:
        return "outside_domain"
    level = UNSTABLE_RESIDUAL.get(theorem)
    unstable = level is not None and abs(float(np.asarray(residual)[-1]) - level) < UNSTABLE_TOL
    kind = run_kind(reached, convergence_trend(ts, residual, CONSENSUS_TOL), unstable)
    return {"agrees": "held", "contradicts": "contradicted"}.get(kind, kind)


def statuses(table: dict[str, np.ndarray]) -> np.ndarray:
    """The `status` column; for a table written before it existed, what its other
    columns tell (`"not_reached"` where they cannot tell a run still converging
    from one that stalled)."""
    if "status" in table:
        return np.asarray(table["status"], dtype=object)
    held = np.asarray([h is True for h in table["prediction_held"]])
    return np.where(~np.asarray(table["solver_success"], bool), "solver_failed",
                    np.where(~np.asarray(table["in_domain"], bool), "outside_domain",
                             np.where(held, "held", "not_reached"))).astype(object)


def point_stats(table: dict[str, np.ndarray], point: int) -> dict[str, Any]:
    """Statistics of one grid point's instances, with how many of them held, are
    still converging at T, contradict the theorem, failed in the solver, or lie
    outside the theorem's domain (`STATUSES`)."""
    m = table["point"] == point
    t = table["consensus_time"][m]
    inside = table["in_domain"][m]
    status = statuses(table)[m]
    q25, q50, q75 = _quantiles(t)
    E = table["final_E"][m]
    E = E[np.isfinite(E)]  # a failed solve's E is NaN: it measured nothing
    return {
        "instances": int(m.sum()),
        "final_E_median": float(np.median(E)) if E.size else math.nan,
        "final_E_max": float(np.max(E)) if E.size else math.nan,
        "consensus_time_q25": q25, "consensus_time_median": q50, "consensus_time_q75": q75,
        "reached_consensus": int(np.isfinite(t).sum()),
        "in_domain": int(inside.sum()),
        "prediction_held": int(np.sum(status == "held")),
        "solver_success": int(table["solver_success"][m].sum()),
    } | {s: int(np.sum(status == s)) for s in STATUSES[1:]}


def sweep_verdict(counts: dict[str, int]) -> tuple[str, str]:
    """The sweep's verdict kind (as an experiment's `verdict_kind`) and its line,
    from the counts of each status: a run that had not reached the outcome by T but
    was still converging is not counted against the theorem."""
    kind = ("contradicts" if counts["contradicted"] else
            "not_converged" if counts["not_converged"] else
            "agrees" if counts["prediction_held"] else "not_applicable")
    line = (f"inside the theorem's domain: {counts['prediction_held']} held, "
            f"{counts['not_converged']} not yet converged (still converging at T), "
            f"{counts['contradicted']} contradicted (convergence stalled); "
            f"{counts['solver_failed']} solver failed; {counts['outside_domain']} outside "
            "the domain")
    return kind, line


def summarise(spec, configs, keys, table) -> dict[str, Any]:
    """`summary.json` of a sweep: the spec, per-point statistics, the totals of each
    status and the verdict (`sweep_verdict`)."""
    points = [{k: c[k] for k in keys} | point_stats(table, i) for i, c in enumerate(configs)]
    totals = {k: sum(p[k] for p in points)
              for k in ("prediction_held", "in_domain", *STATUSES[1:])}
    kind, line = sweep_verdict(totals)
    notes = get_experiment(spec.experiment).grid_notes
    return {"experiment": spec.experiment, "instances_per_point": spec.instances,
            "points": points, **totals, "verdict": line, "verdict_kind": kind,
            "rows": int(len(table["point"])),
            "notes": [notes[k] for k in keys if k in notes and len({c[k] for c in configs}) > 1]}


def _g(x, spec: str = ".3g") -> str:
    """A statistic for the table: `–` where there is none (`null` in summary.json,
    NaN in memory, or the text of a summary written before nulls)."""
    x = float("nan") if x is None else float(x)
    return "–" if not np.isfinite(x) else format(x, spec)


def format_table(summary: dict[str, Any], keys) -> str:
    """The per-point table that `jaxattn sweep` prints; a consensus-time quartile among
    the instances that never reached the tolerance reads `>T`."""
    infinite = {k for k, v in summary.get("null_means", {}).items() if v == "+infinity"}

    def t(i, stat):
        key = f"consensus_time_{stat}"
        return ">T" if f"points[{i}].{key}" in infinite else _g(summary["points"][i][key])

    head = [*keys, "instances", "median E(T)", "t_cons median [IQR]", "E<tol", "held/in domain",
            "converging", "against", "solver ok"]
    body = []
    for i, p in enumerate(summary["points"]):
        body.append([*(f"{p[k]:g}" if isinstance(p[k], float) else str(p[k]) for k in keys),
                     str(p["instances"]), _g(p["final_E_median"], ".2e"),
                     f"{t(i, 'median')} [{t(i, 'q25')}, {t(i, 'q75')}]",
                     f"{p['reached_consensus']}/{p['instances']}",
                     f"{p['prediction_held']}/{p['in_domain']}",
                     str(p.get("not_converged", "–")), str(p.get("contradicted", "–")),
                     f"{p['solver_success']}/{p['instances']}"])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *body]]
    notes = [f"note: {n}" for n in summary.get("notes", ())]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:], *notes])


#: How the figure writes a grid parameter (the others by name).
SYMBOLS = {"beta": "β", "tau": "τ", "heads": "h", "tokens": "n", "dim": "d", "horizon": "T"}


def _sci(x: float) -> str:
    """`1e-4` for 0.0001: a tolerance as it is written."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _groups(keys, table) -> tuple[str | None, dict[str, list[int]]]:
    """The x axis (β if swept, else the first numeric grid parameter, else none) and
    the grid points of each line (a value of the others), by the line's label."""
    numeric = [k for k in keys if np.issubdtype(np.asarray(table[k]).dtype, np.number)]
    x_key = ("beta" if "beta" in numeric else numeric[0]) if numeric else None
    others = [k for k in keys if k != x_key]
    by_group: dict[str, list[int]] = {}
    for p in np.unique(table["point"]):
        label = ", ".join(f"{SYMBOLS.get(k, k)} = {table[k][table['point'] == p][0]}"
                          for k in others)
        by_group.setdefault(label, []).append(int(p))
    return x_key, by_group


#: The instances a point whose final `E` are drawn as full dots (fainter beyond).
SCATTER_FULL = 2000


def _draw_group(ax_t, ax_e, table, x_key, label, pts, color, tol) -> None:
    """One line of each panel: consensus time (median, the interquartile range as bars)
    and every final `E`."""
    xs = ([float(table[x_key][table["point"] == p][0]) for p in pts] if x_key
          else list(range(len(pts))))
    stats = [point_stats(table, p) for p in pts]
    reached = sum(st["reached_consensus"] for st in stats)
    count = sum(st["instances"] for st in stats)
    q25, median, q75 = (np.asarray([s[f"consensus_time_{q}"] for s in stats])
                        for q in ("q25", "median", "q75"))
    # a quartile among the instances that never reached the tolerance is past T: its
    # bar runs to the top of the panel, and a median there is a triangle at the top
    finite = np.isfinite(median)
    with np.errstate(invalid="ignore"):  # inf − inf where the median is past T
        spread = [np.where(finite, median - q25, 0.0),
                  np.where(finite & np.isfinite(q75), q75 - median, 0.0)]
    ax_t.errorbar(xs, np.where(finite, median, np.nan), yerr=spread, fmt="o-", color=color,
                  capsize=3, label=f"{label + ': ' if label else ''}{reached:,}/{count:,} "
                                   f"reached E < {_sci(tol)}")
    edge = ax_t.get_xaxis_transform()  # x in data, y in axes fraction
    for x, low, mid, high in zip(xs, q25, median, q75):
        if np.isinf(high) and np.isfinite(low):
            head = "-|>" if np.isfinite(mid) else "-"  # (the triangle is its head)
            ax_t.annotate("", (x, 0.97), (x, mid if np.isfinite(mid) else low), xycoords=edge,
                          textcoords="data", arrowprops={"arrowstyle": head, "color": color,
                                                         "lw": 1, "shrinkA": 0, "shrinkB": 0})
        if np.isinf(mid):
            ax_t.plot([x], [0.97], "^", color=color, transform=edge, clip_on=False)
    for p, xv in zip(pts, xs):
        E = np.maximum(table["final_E"][table["point"] == p], 1e-300)
        jitter = np.linspace(-0.04, 0.04, E.size) * (np.ptp(xs) if len(xs) > 1 else 1)
        # past SCATTER_FULL instances a point, fainter and smaller dots, so that the
        # cloud shows where they gather rather than one block; those that did not reach
        # the tolerance stay full, so that a rare one shows; raster in the PDF
        thin = min(1.0, SCATTER_FULL / E.size)
        for part, scale in ((E < tol, thin), (E >= tol, 1.0)):
            ax_e.scatter(xv + jitter[part], E[part], s=6 * scale**0.25, color=color,
                         alpha=max(0.4 * scale**0.5, 0.01), rasterized=True)
    ax_e.plot(xs, [s["final_E_median"] for s in stats], "-", color=color)


def write_figure(folder: Path, spec, keys, table) -> list[Path]:
    """Consensus time against the first swept parameter (β if swept), one line per
    value of the others, median and interquartile band; and the final `E`.

    **Arguments:**

    - `folder`: the sweep folder; its `sweep.json` gives the consensus tolerance.
    - `spec`: the `SweepSpec`; `keys`: the grid parameters; `table`: the table.

    **Returns:**

    The paths of `sweep.png` and `sweep.pdf`.
    """
    tol = float(read_json(Path(folder) / "sweep.json")["tolerance"])
    fig, (ax_t, ax_e) = pyplot().subplots(1, 2, figsize=(11, 4.2), sharex=True)
    x_key, by_group = _groups(keys, table)
    for i, (label, pts) in enumerate(by_group.items()):
        _draw_group(ax_t, ax_e, table, x_key, label, pts, f"C{i % 10}", tol)
    ax_t.set_ylabel(f"consensus time (E < {_sci(tol)}): median, bars IQR")
    ax_t.set_title("time to consensus")
    # from 0: a flat line reads as flat, not as a trend magnified by a narrow range
    times = np.asarray(table["consensus_time"], float)
    reached = times[np.isfinite(times)]  # a bar from a quartile to the top starts in view
    # the horizon T (one for every point unless swept): the "past T" marks sit above it
    horizon = None if "horizon" in keys else float(
        spec.set.get("horizon", getattr(get_experiment(spec.experiment).defaults(),
                                        "horizon", math.nan)))
    top = max(ax_t.get_ylim()[1], reached.max() if reached.size else 0.0,
              horizon if horizon is not None and np.isinf(times).any() else 0.0)
    ax_t.set_ylim(0, 1.08 * top)  # (the margin keeps the top bars whole)
    if horizon is not None and math.isfinite(horizon) and horizon <= 1.08 * top:
        ax_t.axhline(horizon, color="0.4", lw=0.8, ls=":")
        ax_t.annotate(f"T = {horizon:g}", (0.01, horizon), xycoords=("axes fraction", "data"),
                      xytext=(0, -9), textcoords="offset points", fontsize=8, color="0.3")
    if np.isinf(times).any():
        ax_t.text(0.99, 0.02, "▲ median, ↑ upper quartile: past T (not reached)",
                  transform=ax_t.transAxes, ha="right", va="bottom", fontsize=8, color="0.3")
    if not reached.size:
        ax_t.text(0.5, 0.5, f"no instance reached E < {_sci(tol)} by T", ha="center",
                  transform=ax_t.transAxes)
    ax_e.axhline(tol, color="0.4", lw=0.8, ls="--")
    ax_e.annotate(f"consensus tolerance {_sci(tol)}", (0.01, tol), xycoords=("axes fraction",
                  "data"), xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.3")
    ax_e.set_yscale("log")
    ax_e.set_ylabel("final misalignment E(T)")
    values = np.unique(np.asarray(table[x_key], float)) if x_key else ()
    for ax in (ax_t, ax_e):
        ax.set_xlabel(SYMBOLS.get(x_key, x_key) if x_key else "grid point")
        if len(values) == 1:  # its own tick, and limits that stay finite (β = 1e308)
            x = float(values[0])
            ax.set_xticks([x], [f"{x:g}"])
            ax.set_xlim(x - max(abs(x) / 10, 0.1), x + max(abs(x) / 10, 0.1))
    ax_e.set_title("every instance's final E")
    legend_under_panels(fig, ax_t, ncol=min(len(by_group), 3))  # each line is in both
    points = len(np.unique(table["point"]))
    title = (f"sweep {spec.experiment}: {points} point{'s' * (points != 1)} × "
             f"{spec.instances:,} instances, seed {spec.seed}")
    return save_figure(fig, Path(folder) / "sweep", title)
