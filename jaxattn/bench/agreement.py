"""Whether two float32 runs of a clustering dynamics agree, judged against float64.

The dynamics amplify rounding, so over many systems the largest difference cannot
tell a wrong path from a right one; each path's per-system error against a float64
run is compared as a distribution instead. Why, and the measurements: see
docs/kernels.md ("Agreement at 10⁶ systems").
"""

import numpy as np
from scipy.stats import binom, norm


def system_errors(result, reference) -> np.ndarray:
    """Per system (axis 0) the largest absolute difference, over everything saved of
    it, relative to the largest `|reference|` of the whole batch."""
    a = np.asarray(result, np.float64).reshape(len(result), -1)
    b = np.asarray(reference, np.float64).reshape(len(reference), -1)
    if a.shape != b.shape:
        raise ValueError(f"result {a.shape} and reference {b.shape} differ in shape.")
    return np.max(np.abs(a - b), axis=1) / max(float(np.max(np.abs(b))), 1e-30)


def _summary(err: np.ndarray, tail: float) -> dict:
    return {"median": float(np.median(err)), "q99": float(np.quantile(err, 0.99)),
            "max": float(np.max(err)), "over_tail": int(np.sum(err > tail))}


def agreement_in_law(candidate, baseline, reference, *, floor: float = 1e-6,
                     tail: float = 1e-3, factor: float = 2.0, z_max: float = 4.0) -> dict:
    """Does `candidate` agree with `baseline`, both judged against `reference`?

    **Arguments:**

    - `candidate`, `baseline`: two float32 runs of the same systems (axis 0).
    - `reference`: the same systems in float64.
    - `floor`: errors below it are rounding (float32's ε is 1.2e-7).
    - `tail`: an error above it is a system "far off".
    - `factor`, `z_max`: how much larger the candidate's median and 99th-percentile
      error may be (`factor × baseline's + floor`), and how improbable its excess of
      far-off systems over the baseline's may be: a one-sided tail of `z_max`
      standard deviations (3.2e-5 at 4). The excess is judged by the exact test of two
      Poisson counts: given `N` far-off systems in all, the candidate's are
      binomial(`N`, ½) if both paths stray alike.

    **Returns:**

    A dict: each path's error summary (`median`, `q99`, `max`, `over_tail`), the
    test's `p_over_tail` and its normal quantile `z_over_tail` (0 where the candidate
    has no excess), `systems`, and the verdict `agree`.
    """
    c = _summary(system_errors(candidate, reference), tail)
    b = _summary(system_errors(baseline, reference), tail)
    # P(X ≥ c | N = c + b), X ~ binomial(N, ½); (c − b)/√(c + b + 1) let 16 against 0
    # pass (p = 1.5e-5)
    p = float(binom.sf(c["over_tail"] - 1, c["over_tail"] + b["over_tail"], 0.5))
    z = max(0.0, float(norm.isf(p)))
    agree = (c["median"] <= factor * b["median"] + floor
             and c["q99"] <= factor * b["q99"] + floor and p > norm.sf(z_max))
    return {"candidate": c, "baseline": b, "p_over_tail": p, "z_over_tail": z,
            "systems": len(candidate), "floor": floor, "tail": tail, "agree": bool(agree)}
