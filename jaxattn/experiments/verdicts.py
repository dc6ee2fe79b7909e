"""How an experiment's outcome is judged against a theorem: numbers for a verdict
line, the convergence trend at the end of a run,
its kind (`VERDICT_KINDS`) and the words that name it. Shared by every experiment
that judges a theorem (`theorem.py`, `search.py` and their members); nothing here
simulates.
"""

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from .._horizon import CONSENSUS_TOL
from .base import Verdict


def short(x: float | None) -> str:
    """A number for a verdict line: `3.0e-07`, `0.25`, `inf`, `0` for zero alone (an
    `E` of 1.3e-16 is resolved, not 0: `misalignment` reads down to ~1e-31); `n/a`
    for a measure that could not be read (`None`, as NaN is written to JSON)."""
    if x is None:
        return "n/a"
    x = float(x)
    if not math.isfinite(x) or x == 0:
        return str(x) if x else "0"
    return f"{x:.1e}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.3g}"


def finite_or_none(value: Any) -> Any:
    """`value` for `summary.json`: a real number as a float, or `None` where it is
    infinite or NaN (which JSON cannot write); a dict or list entry by entry; an
    integer, a bool or anything else as it is."""
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    if isinstance(value, numbers.Integral) or not isinstance(value, numbers.Real):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def largest_rise(values: np.ndarray, floor: Any = 0.0) -> float:
    """The largest increase between consecutive samples along the last axis (≤ 0: none).
    A rise of at most `floor` (scalar, or one per step: the resolution of the values)
    is rounding, no rise: it counts as 0."""
    values = np.asarray(values)
    if values.shape[-1] < 2:
        return 0.0
    steps = np.diff(values, axis=-1)
    return float(np.max(np.where(steps > floor, steps, np.minimum(steps, 0.0))))


def rise_words(rise: float, what: str = "") -> str:
    """`largest_rise` in words: "largest rise 3.2e-05", or "never rises" when the
    largest change between samples is a fall (a negative rise is no rise)."""
    subject = f"{what} " if what else ""
    return f"{subject}largest rise {short(rise)}" if rise > 0 else f"{subject}never rises"


#: The verdict kinds, in `summary.json` as `verdict_kind`: the outcome was reached;
#: not reached yet (still converging, or rising: the theorems bound no transient, so
#: neither decides); measurably against the theorem (stalled inside its hypotheses);
#: outside them.
VERDICT_KINDS = ("agrees", "not_converged", "contradicts", "not_applicable")


@dataclasses.dataclass(frozen=True)
class Trend:
    """How a quantity that a theorem drives to 0 (`E`, a distance to the predicted
    limit, a speed) behaves at the end of a run (`convergence_trend`).

    - `state`: `"converged"` (the final value is below `tol`), `"converging"` (it
      falls measurably), `"stalled"` (it changes by less than `stall` over the
      window), `"rising"`, or `"unknown"` (fewer than two finite samples there).
    - `final`: the last value; `rate`: the fitted decay rate of its logarithm per
      unit time (`> 0`: falling); `reach`: the projected time at which it reaches
      `tol` (once converged, the first sampled time below it; `inf` if not falling);
      `window`: the fitted times `(t₀, t₁)`; `tol`: the threshold.
    """

    state: str
    final: float
    rate: float
    reach: float
    window: tuple[float, float]
    tol: float

    @property
    def contradicts(self) -> bool:
        """Whether convergence is measurably stalled or reversed (not merely slow): a
        run that does not collapse at its depth (`variants`). A theorem's verdict
        asks more (`run_kind`: a stall only)."""
        return self.state in ("stalled", "rising")

    def describe(self, what: str = "E") -> str:
        """One phrase for a verdict line: what was observed at the end of the run."""
        t1, final, rate, tol = short(self.window[1]), short(self.final), short(self.rate), self.tol
        over = f"t ∈ [{short(self.window[0])}, {t1}]"
        return {
            "converged": f"{what} = {final} < {tol:g} (below it from t = {short(self.reach)})",
            "converging": f"not yet converged at t = {t1}: {what} = {final}, falling at rate "
                          f"{rate} per unit time (fitted on {over}), would reach {tol:g} by "
                          f"t ≈ {short(self.reach)}",
            "stalled": f"{what} stalled at {final} ≥ {tol:g} over {over} (fitted rate {rate} "
                       "per unit time)",
            "rising": f"{what} rising at rate {short(-self.rate)} per unit time over {over}, "
                      f"to {final} ≥ {tol:g}",
        }.get(self.state, f"{what} = {final}: too few finite samples to judge a trend")

    def numbers(self) -> dict[str, float]:
        """The fitted rate and the projected time, for a verdict's numbers."""
        return {"decay_rate": self.rate, "projected_time": self.reach}


def convergence_trend(ts, values, tol: float, *, fraction: float = 1 / 3,
                      stall: float = 1e-3) -> Trend:
    """Judge a quantity that should go to 0 on its trend at the end of the run, not on
    its value at a fixed time: a least-squares fit of `log(values)` against `t` on the
    last `fraction` of the run (at least the last 3 samples).

    A fitted change of `log(values)` under `stall` over that window (a fall of less
    than 0.1 % by default) and under `stall` per unit of time is no measurable
    convergence: the run ended on a plateau (an equilibrium off the predicted outcome,
    or one approached exponentially), while a slow geometric approach, e.g. at a small
    spectral gap, still falls by more. A metastable plateau flatter than that reads as
    stalled at this run's resolution: run longer to see it leave. A window shorter
    than a unit of time is judged on the rate alone (in 1e-4 the dynamics move too
    little to fall by 0.1 %), and one so short that float64 cannot resolve a rate of
    `stall` (under ~1e-13) is `"unknown"`.

    **Arguments:**

    - `ts`: the sampled times `(T,)`; `values`: the quantity at those times `(T,)`.
    - `tol`: the threshold the quantity should fall below (e.g. `CONSENSUS_TOL`).
    - `fraction`: the part of the run the trend is fitted on; `stall`: see above.

    **Returns:**

    A `Trend`.
    """
    ts, values = np.asarray(ts, np.float64), np.asarray(values, np.float64)
    final = float(values[-1])
    if final < tol:  # False for NaN; reached where the final run below `tol` begins
        above = np.flatnonzero(~(values < tol))
        first = int(above[-1]) + 1 if above.size else 0
        return Trend("converged", final, math.nan, float(ts[first]),
                     (float(ts[0]), float(ts[-1])), tol)
    start = min(int(np.searchsorted(ts, ts[-1] - fraction * (ts[-1] - ts[0]))), len(ts) - 3)
    t, v = ts[max(start, 0):], values[max(start, 0):]
    window = (float(t[0]), float(t[-1]))
    keep = np.isfinite(v)
    if keep.sum() < 2 or np.ptp(t[keep]) == 0:
        return Trend("unknown", final, math.nan, math.inf, window, tol)
    # fitted on the window's own scale, x = (t − t0) / span in [0, 1]: well conditioned
    # for any horizon (times of 1e-300 made the least-squares solve fail)
    t0, span = float(t[keep][0]), float(np.ptp(t[keep]))
    per_x, at_t0 = np.polyfit((t[keep] - t0) / span,
                              np.log(np.maximum(v[keep], np.finfo(float).tiny)), 1)
    if span * stall < np.finfo(float).eps:  # a rate of `stall` moves no float64 bit
        return Trend("unknown", final, math.nan, math.inf, window, tol)
    change = per_x * ((window[1] - window[0]) / span)
    slope = per_x / span
    state = ("stalled" if abs(change) < stall and abs(slope) < stall
             else "rising" if change > 0 else "converging")
    with np.errstate(over="ignore", divide="ignore"):
        reach = (t0 + (math.log(tol) - at_t0) / per_x * span if state == "converging"
                 else math.inf)
    return Trend(state, final, float(-slope), float(reach), window, tol)


def overall_kind(kinds) -> str:
    """The kind of a verdict over several runs: `"contradicts"` if any run does, else
    `"not_converged"` if any has not converged, else `"agrees"` if any applies."""
    kinds = set(kinds)
    return next((k for k in ("contradicts", "not_converged", "agrees") if k in kinds),
                "not_applicable")


def run_kind(reached: bool, trend: Trend, unstable: bool = False) -> str:
    """The verdict kind of a run inside a theorem's hypotheses: `"agrees"` when the
    predicted outcome was reached, `"contradicts"` when convergence stalled, else
    `"not_converged"`.

    A stall at a state near one of the theorem's unstable equilibria (`unstable`:
    a token antipodal to x₁ for Theorem 5.1, on the equator ⟨x, v₁⟩ = 0 for 5.2) is
    `"not_converged"`: a start there sits on a plateau as long as its distance to it
    is small, then converges (2 tokens, x₂ 1e-6 rad from −x₁: gap < 1e-4 at t ≈ 129).

    A rise is no contradiction: the theorems say where a run ends, not that its
    measure falls on the way (`E` is no Lyapunov function of Theorems 5.1–5.2, paper
    001 §6.1.3; a gradient flow's speed rises as it leaves a saddle, Theorem 3.2). A
    causal run of E 1.133 → 1.136 over t ∈ [1, 1.5] reaches 2e-14 at t = 20.
    """
    if reached:
        return "agrees"
    return "contradicts" if trend.state == "stalled" and not unstable else "not_converged"


#: How near (in ⟨x_i, x₁⟩ + 1 or |⟨x_i, v₁⟩|) a state is to an unstable equilibrium
#: of Theorem 5.1 or 5.2 for a stall there to be a plateau, not a contradiction.
UNSTABLE_TOL = 1e-2


def trend_kind(ts, values, reached, inside, unstable=False) -> tuple[Trend, str]:
    """The trend of `values`, which the theorem drives below `CONSENSUS_TOL`, and the
    run's kind: `run_kind` inside the theorem's hypotheses, else `"not_applicable"`."""
    trend = convergence_trend(ts, values, CONSENSUS_TOL)
    return trend, (run_kind(bool(reached), trend, bool(unstable)) if inside
                   else "not_applicable")


#: A verdict line's note on a stall near an unstable equilibrium (`run_kind`).
PLATEAU = "a plateau near an unstable equilibrium of the theorem, which a start leaves"


def outcome_words(kind: str, theorem: str) -> str:
    """How a verdict line names its kind: `as Theorem 4.1 predicts`, `AGAINST …`."""
    return {"agrees": f"as Theorem {theorem} predicts",
            "not_converged": f"undecided: Theorem {theorem} allows slow convergence",
            "contradicts": f"AGAINST Theorem {theorem}",
            "not_applicable": f"Theorem {theorem} says nothing here"}[kind]


#: What decides a run that has not converged (`jaxattn run` exits 4).
LONGER = "raise --horizon"


def kind_verdict(kind: str, line: str, numbers: dict[str, Any],
                 extra: dict[str, Any] | None = None) -> Verdict:
    """A `Verdict` of kind `kind` (`VERDICT_KINDS`): it agrees where the outcome was
    reached or the theorem does not speak, is undecided where the run has not
    converged (`LONGER`), and `summary.json` records the kind as `verdict_kind`."""
    undecided = LONGER if kind == "not_converged" else ""
    return Verdict(kind in ("agrees", "not_applicable"), line, numbers,
                   {"verdict_kind": kind} | (extra or {}), undecided)
