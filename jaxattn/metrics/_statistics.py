"""The statistics the experiments' verdicts rest on, on the host (NumPy floats): where a
curve crosses a level, least-squares slopes, intercepts and crossings with their standard errors,
means and binomial shares with their errors, integrated autocorrelation times and a time
window's block statistics.
"""

import math
from typing import NamedTuple

import numpy as np

from .._validate import check_count, refuse_first


def mean_error(samples, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The mean of independent samples and its standard error `s/√n` (`s` the sample
    standard deviation, `ddof = 1`; NaN for one sample).

    **Arguments:**

    - `samples`: the samples, along `axis`, at least one; any shape.
    - `axis`: the axis of the samples (default the last).

    **Returns:**

    `(mean, standard error)`, each the shape of `samples` without `axis` (NumPy
    floats for 1-D `samples`).
    """
    samples = np.asarray(samples)
    refuse_first([(samples.shape[axis] == 0, f"mean_error needs at least one sample along "
                                             f"axis {axis}, got shape {samples.shape}.")])
    mean, n = samples.mean(axis), samples.shape[axis]
    if n < 2:
        return mean, np.full(np.shape(mean), np.nan)[()]
    return mean, samples.std(axis, ddof=1) / math.sqrt(n)


def binomial_error(p, n: int):
    """The standard error `√(p(1 − p)/n)` of a share `p` of `n` independent trials.

    **Arguments:**

    - `p`: the observed share(s), in `[0, 1]` (NaN where none was measured: its error
      is NaN); any shape.
    - `n`: the number of trials behind each share, `≥ 1`.

    **Returns:**

    The standard error(s), the shape of `p`.
    """
    p = np.asarray(p, dtype=float)
    outside = next(iter(p[(p < 0) | (p > 1)]), None)  # a NaN share (none measured): NaN
    refuse_first([(outside is not None, f"binomial_error: `p` is a share: it must lie in "
                                        f"[0, 1], got {outside}.")])
    return np.sqrt(p * (1 - p) / check_count(n, "n", 1))


def level_crossing(x, y, level: float = 0.0, *, falling: bool = False, keep=None,
                   logit: bool = False, at_start: bool = False) -> float:
    """Where the piecewise-linear curve through `(x, y)` first crosses `level`.

    The crossing is the first segment `[x_i, x_{i+1}]`, both ends kept, whose `y_i` is
    short of `level` and whose `y_{i+1}` is at or past it (past: above, or below with
    `falling`), read by linear interpolation on that segment.

    **Arguments:**

    - `x`: the abscissae `(k,)`, nondecreasing (a repeated `x` makes a vertical step);
      NaN samples (a point not measured) never cross.
    - `y`: the curve there `(k,)`; NaN samples never cross. An infinite sample is the
      limit of a steep one: a segment from `−inf` to a finite value past `level`
      crosses at its finite end, one from a finite value to `+inf` at its start, and
      one from `−inf` to `+inf` (a step) at its middle.
    - `level`: the level, finite.
    - `falling`: cross from above `level` to at or below it (default: from below).
    - `keep`: a mask `(k,)`: only segments with both ends kept count (default: all).
    - `logit`: interpolate `log(y/(1 − y))` against `log(level/(1 − level))`, for a
      `y` in `[0, 1]` (or NaN) that is a logistic function of `x` (then read exactly). Samples
      within `2⁻⁵³` of 0 or 1 count as that far from it (float64's resolution at 1), so
      the two ends weigh alike: a step from 0 to 1 crosses ½ at its middle.
    - `at_start`: with no crossing, a curve already at or past `level` at its first
      kept sample crosses there (otherwise NaN).

    **Returns:**

    The crossing's `x`; NaN where there is none.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    # the first x below the one before, and with logit a y outside [0, 1] (the clip
    # below is for rounding at 0 and 1, not for such a y)
    known = x[~np.isnan(x)] if x.ndim == 1 else np.zeros(0)
    rising = np.append(np.diff(known) >= 0, True)
    i_x = int(np.argmin(rising))
    bad_x = f"{known[i_x + 1]} after {known[i_x]}" if not rising.all() else None
    outside = next(iter(y[(y < 0) | (y > 1)]), None) if logit else None
    refuse_first([
        (x.ndim != 1 or x.shape != y.shape, f"level_crossing needs x and y of one shape "
                                            f"(k,), got {x.shape} and {y.shape}."),
        (keep is not None and np.shape(keep) != y.shape,
         f"level_crossing's keep must be a mask of shape {y.shape}, got {np.shape(keep)}."),
        (bad_x is not None, f"level_crossing needs nondecreasing x, got "
                            f"{bad_x}: sort the points by x."),
        (not math.isfinite(level), f"level_crossing needs a finite level, got {level!r}."),
        (logit and not 0 < level < 1, f"level_crossing with logit=True needs a level in "
                                      f"(0, 1), got {level!r}."),
        (outside is not None, f"level_crossing with logit=True needs y in [0, 1] (a "
                              f"share; NaN where unread), got {outside}.")])
    if logit:
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.clip(y, 2.0**-53, 1 - 2.0**-53)
            y, level = np.log(v) - np.log1p(-v), math.log(level / (1 - level))
    past = y <= level if falling else y >= level
    short = y > level if falling else y < level
    kept = ~np.isnan(x) & (True if keep is None else np.asarray(keep, bool))
    hits = np.flatnonzero(kept[:-1] & kept[1:] & short[:-1] & past[1:])
    if hits.size:
        i = hits[0]
        a, b = y[i], y[i + 1]
        # an infinite end (inf/inf was NaN): the interpolation's limit, at the finite
        # end, or at the middle of a step from −inf to +inf
        t = ((level - a) / (b - a) if math.isfinite(a) and math.isfinite(b) else
             0.5 if math.isinf(a) and math.isinf(b) else float(math.isinf(a)))
        return float(x[i] + t * (x[i + 1] - x[i]))
    first = np.flatnonzero(kept)[:1]
    return float(x[first[0]]) if at_start and first.size and past[first[0]] else math.nan


def _polyfit(where: str, x, y, degree: int, se, weighted: bool, centred: bool = False):
    """A least-squares polynomial's coefficients (highest power first) and their
    standard errors; NaN where too few points determine them. With `centred`, the
    coefficients and covariance of the fit in `u = (x − c)/s` to `y / k`, and
    `(c, s, k)`."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    se = None if se is None else np.asarray(se, float)
    refuse_first([
        (isinstance(degree, bool) or not isinstance(degree, int | np.integer) or degree < 1,
         f"{where}'s degree must be a whole number ≥ 1, got {degree!r}."),
        (x.ndim != 1 or x.shape != y.shape or (se is not None and se.shape != x.shape),
         f"{where} needs `x`, `y` (and `se`) of one shape (k,), got {x.shape}, {y.shape}"
         f"{'' if se is None else f' and {se.shape}'}."),
        (not np.all(np.isfinite(x)), f"{where} needs finite `x` (a non-finite `y` gives NaN)."),
        (se is not None and weighted and not np.all((se > 0) & np.isfinite(se)),
         f"{where} (weighted) needs every `se` finite and > 0 (its weight is 1/se²); pass "
         "weighted=False to carry `se` through an unweighted fit."),
        (len(x) > degree and np.unique(x).size <= degree,
         f"{where} of degree {degree} needs {degree + 1} distinct `x`, got {np.unique(x)}."),
    ])
    nan = np.full(degree + 1, math.nan)
    if len(x) < degree + 1:
        return (nan, np.full((degree + 1,) * 2, math.nan), (0.0, 1.0, 1.0)) if centred else (
            nan, nan)
    # fitted in u = (x − c)/s and y / 2^k, then mapped back: x far from 0 (1e10 + k)
    # made the normal equations singular, and y near 1e300 overflowed their errors
    c = float(np.mean(x))
    s = float(np.max(np.abs(x - c))) or 1.0
    big = np.abs(y[np.isfinite(y) & (y != 0)])
    e_k = int(np.floor(np.log2(big.max()))) if big.size else 0
    k = 2.0**e_k
    u, v = (x - c) / s, y / k
    coef, cov = _fit(u, v, degree, None if se is None else np.asarray(se, float) / k, weighted)
    if centred:
        return coef, cov, (c, s, k)
    # coef_x = k · S B coef_u: column j of B is (x − c/s)^(degree − j), highest power
    # first, and S = diag(s^−(degree − i)) the powers of 1/s of row i. The error is
    # k · S · √diag(B cov Bᵀ), the root taken before the scales: the variance, with k²
    # and 1/s², under- or overflowed (an error of 0 at y ~ 1e-170, inf at 1e155). With
    # s = m · 2^e, S's powers of 2 and k join in one exponent, applied last.
    B = np.zeros((degree + 1, degree + 1))
    for j in range(degree + 1):
        B[j:, j] = (np.poly1d([1.0, -c / s]) ** (degree - j)).coeffs
    m, e = np.frexp(s)
    power = np.arange(degree, -1, -1)
    exponent = e_k - int(e) * power
    with np.errstate(over="ignore"):  # an error past float64's range is inf
        return (np.ldexp(m**-power * (B @ coef), exponent),
                np.ldexp(m**-power * np.sqrt(np.diag(B @ cov @ B.T)), exponent))


def _fit(x, y, degree: int, se, weighted: bool) -> tuple[np.ndarray, np.ndarray]:
    """`_polyfit`'s least squares on checked, scaled data."""
    if se is None:  # the residuals give the error: it needs a spare point
        if len(x) == degree + 1:
            return np.polyfit(x, y, degree), np.full((degree + 1, degree + 1), math.nan)
        return np.polyfit(x, y, degree, cov=True)
    if weighted:
        return np.polyfit(x, y, degree, w=1 / se, cov="unscaled")
    # ordinary least squares, the known errors carried through its linear map
    pinv = np.linalg.pinv(np.vander(x, degree + 1))
    return np.polyfit(x, y, degree), (pinv * se**2) @ pinv.T


def fit_slope(x, y, *, se=None, weighted: bool = True) -> tuple[float, float]:
    """The least-squares slope of `y` against `x`, and its standard error.

    **Arguments:**

    - `x`, `y`: the points `(k,)`, `x` finite (a non-finite `y` gives NaN).
    - `se`: the standard errors of `y` `(k,)`, if known. Without them the error is the
      textbook one, from the residuals (`scipy.stats.linregress`'s `stderr`).
    - `weighted`: with `se`, weight each point by `1/se²` (the error then follows
      from `se` alone); `False` keeps the ordinary least-squares slope and carries
      `se` through it.

    **Returns:**

    `(slope, standard error)`: both NaN under two points, the error NaN with two
    points and no `se`.
    """
    coef, error = _polyfit("fit_slope", x, y, 1, se, weighted)
    return float(coef[0]), float(error[0])


def fit_intercept(x, y, *, se=None, weighted: bool = True) -> tuple[float, float]:
    """The value at `x = 0` of the least-squares line through `(x, y)`, and its
    standard error.

    **Arguments:**

    - `x`, `y`: the points `(k,)`, `x` finite (a non-finite `y` gives NaN).
    - `se`, `weighted`: the errors of `y` and how the fit uses them, as in
      `fit_slope`.

    **Returns:**

    `(intercept, standard error)`: both NaN under two points, the error NaN with two
    points and no `se`.
    """
    coef, error = _polyfit("fit_intercept", x, y, 1, se, weighted)
    return float(coef[1]), float(error[1])


def fit_crossing(x, y, level: float = 0.0, *, degree: int = 1, se=None,
                 weighted: bool = True) -> tuple[float, float]:
    """Where a least-squares polynomial through `(x, y)` crosses `level`, and the
    standard error of that crossing (first order in the fit's covariance).

    **Arguments:**

    - `x`, `y`: the points `(k,)`, `x` finite (a non-finite `y` gives NaN).
    - `level`: the level.
    - `degree`: the polynomial's degree (1: a straight line); of several real
      crossings, the one nearest `x[0]`.
    - `se`, `weighted`: the errors of `y` and how the fit uses them, as in
      `fit_slope`.

    **Returns:**

    `(crossing, standard error)`: NaN with under `degree + 1` points or no real
    crossing (a fit flat to rounding over the points has none), the error NaN where
    the fit gives no covariance.
    """
    # in the fit's centred units (`_polyfit`): x far from 0 lost the error to cancellation
    coef, cov, (c, s, k) = _polyfit("fit_crossing", x, y, degree, se, weighted, centred=True)
    if not np.all(np.isfinite(coef)):
        return math.nan, math.nan
    span = (np.asarray(x, float) - c) / s
    fitted = np.polyval(coef, np.linspace(span.min(), span.max(), 2 * degree + 1))
    if np.ptp(fitted) <= 64 * np.finfo(float).eps * np.max(np.abs(fitted)):
        return math.nan, math.nan  # its slope is rounding: a root at 1e15 is none
    roots = np.roots(coef - np.eye(degree + 1)[-1] * level / k)
    roots = roots[np.isreal(roots)].real
    if not roots.size:
        return math.nan, math.nan
    root = roots[np.argmin(np.abs(roots - span[0]))]
    # ∂root/∂c_k = −root^(degree − k) / p′(root)
    grad = -root ** np.arange(degree, -1, -1.0) / np.polyval(np.polyder(coef), root)
    return float(c + s * root), float(s * np.sqrt(grad @ cov @ grad))


def autocorrelation_time(series) -> float:
    """The integrated autocorrelation time of a series, in steps.

    `1 + 2 Σ_k ρ_k`, the autocorrelations `ρ_k` summed up to the first window `M ≥
    5 τ(M)` (Sokal's rule); an AR(1) series `x_{t+1} = φ x_t + ξ` has `(1 + φ)/(1 − φ)`
    for `φ ≥ 0` (for `φ < 0` the rule stops at the first lag, well below it).

    **Arguments:**

    - `series`: the samples `(steps,)`, in time order.

    **Returns:**

    The time; NaN for a constant series; below 1 for an anticorrelated one (an
    alternating series: 0 at the least, not the negative sum its truncation can
    give). A series that is not 1-D and finite, or has under two samples, is a
    `ValueError`.
    """
    x = np.asarray(series, float)
    finite = np.all(np.isfinite(x))
    refuse_first([(x.ndim != 1 or len(x) < 2 or not finite,
                   f"autocorrelation_time needs one finite series (steps,) of at least two "
                   f"samples, got shape {x.shape}{'' if finite else ' with NaN or inf'}.")])
    # scaled by powers of 2 (exact) before centring, whose differences overflowed
    # near float64's top (1e308), and after, so that its square neither over- nor
    # underflows
    for centre in (True, False):
        scale = np.max(np.abs(x))
        if not scale > 0:
            return math.nan
        x = x / 2.0 ** np.floor(np.log2(scale))
        x = x - np.mean(x) if centre else x
    var = x @ x / len(x)
    f = np.fft.rfft(x, 2 * len(x))
    acf = np.fft.irfft(f * np.conj(f))[: len(x)] / (var * len(x))
    tau = 2 * np.cumsum(acf) - 1
    m = np.arange(len(x))
    stop = np.nonzero(m >= 5 * tau)[0]
    return max(float(tau[stop[0]] if len(stop) else tau[-1]), 0.0)


def block_means(r: np.ndarray, window: int, blocks: int) -> np.ndarray:
    """The means of `blocks` equal blocks of the last `window` steps of each series.

    **Arguments:**

    - `r`: the series `(..., steps)`.
    - `window`: the steps of the window, at most `steps`; a remainder of
      `window/blocks` is dropped at the window's start.
    - `blocks`: the number of blocks.

    **Returns:**

    The block means `(..., blocks)`, in time order.
    """
    r = np.asarray(r)
    steps = r.shape[-1] if r.ndim else 0
    whole = all(isinstance(v, int | np.integer) and not isinstance(v, bool)
                for v in (window, blocks))
    refuse_first([(not (whole and 1 <= blocks <= window <= steps),
                   f"block_means needs whole numbers 1 ≤ blocks ≤ window ≤ steps, got "
                   f"blocks={blocks}, "
                   f"window={window}, steps={steps}.")])
    size = window // blocks
    tail = r[..., r.shape[-1] - size * blocks:]
    return tail.reshape(tail.shape[:-1] + (blocks, size)).mean(-1)


def half_gap(blocks: np.ndarray) -> np.ndarray:
    """How far a window's second half lies from its first, in standard errors.

    **Arguments:**

    - `blocks`: block means `(..., seeds, blocks)` (`block_means` of each seed), in
      time order.

    **Returns:**

    `(mean of the second half − mean of the first) / its standard error`, `(...)`,
    the error from the blocks' spread in each half.
    """
    blocks = np.asarray(blocks)
    refuse_first([(blocks.ndim < 2 or blocks.shape[-1] < 2,
                   f"half_gap needs block means (..., seeds, blocks) with at least two "
                   f"blocks, got shape {blocks.shape}."),
                  # one mean a half has no spread: a NaN error, and NumPy's warnings
                  (blocks.ndim >= 2 and blocks.shape[-2] * (blocks.shape[-1] // 2) < 2,
                   f"half_gap needs two block means in each half (seeds × blocks/2 ≥ 2) for "
                   f"its error, got shape {blocks.shape}: more blocks or seeds.")])
    half = blocks.shape[-1] // 2
    a = blocks[..., :half].reshape(blocks.shape[:-2] + (-1,))
    b = blocks[..., -half:].reshape(blocks.shape[:-2] + (-1,))
    se = np.sqrt(a.var(-1, ddof=1) / a.shape[-1] + b.var(-1, ddof=1) / b.shape[-1])
    return (b.mean(-1) - a.mean(-1)) / np.maximum(se, 1e-300)


class WindowStatistics(NamedTuple):
    """A time window's statistics at each point `(k,)` (`window_statistics`)."""

    #: the mean over the window, seeds and time
    mean: np.ndarray
    #: its standard error, from the block means' spread
    se: np.ndarray
    #: the window's halves apart, in standard errors (`half_gap`)
    gap: np.ndarray
    #: the largest autocorrelation time of the seeds' series (steps)
    autocorrelation: np.ndarray
    #: the halves within `gap_z` errors, and a block `block_taus` times long
    equilibrated: np.ndarray


def window_statistics(r: np.ndarray, window: int, blocks: int, *, gap_z: float,
                      block_taus: float) -> WindowStatistics:
    """The mean of the last `window` steps of series `r`, its error, and whether the
    series is equilibrated there.

    Equilibrated where the window's halves are within `gap_z` standard errors
    (`half_gap`) and a block holds at least `block_taus` autocorrelation times of the
    slowest seed (`autocorrelation_time`, taken as 1 step at least: an anticorrelated
    series is no more independent than its samples): then the block means are nearly
    independent and their spread gives the error.

    **Arguments:**

    - `r`: the series `(k, seeds, steps)` at `k` points (couplings, say), finite in the
      window.
    - `window`: the steps averaged, at the end; at least two per block.
    - `blocks`: the blocks per seed, `≥ 2`.
    - `gap_z`: the largest `|half_gap|` of an equilibrated window, `≥ 0`.
    - `block_taus`: the fewest autocorrelation times in a block of one, `≥ 0`.

    **Returns:**

    A `WindowStatistics`.
    """
    r = np.asarray(r)
    refuse_first([(r.ndim != 3, f"window_statistics needs series (k, seeds, steps), got "
                                f"shape {r.shape}."),
                  # a NaN bound judged every window unequilibrated, without a word
                  (not gap_z >= 0 or not block_taus >= 0,
                   f"window_statistics needs gap_z ≥ 0 and block_taus ≥ 0, got gap_z={gap_z} "
                   f"and block_taus={block_taus}.")])
    means = block_means(r, window, blocks)  # (k, seeds, blocks)
    tail = r[..., r.shape[-1] - window:]
    # the first point with a NaN or inf in its window (`autocorrelation_time` refused it)
    unread = next(iter(np.flatnonzero(~np.isfinite(tail).all((1, 2)))), None)
    refuse_first([(window // blocks < 2, f"window_statistics needs at least two steps per "
                                         f"block, got window={window} in {blocks} blocks: "
                                         f"a longer window or fewer blocks."),
                  (unread is not None, f"window_statistics needs finite series in the "
                                       f"window, got NaN or inf at point {unread} of {len(r)}.")])
    se = mean_error(means.reshape(len(means), -1))[1]
    gap = half_gap(means)
    taus = np.array([[autocorrelation_time(s) for s in seeds] for seeds in tail])
    auto = np.maximum(np.nanmax(np.where(np.isfinite(taus), taus, 1.0), -1), 1.0)
    ok = (np.abs(gap) <= gap_z) & (window // blocks >= block_taus * auto)
    return WindowStatistics(means.mean((-1, -2)), se, gap, auto, ok)
