"""`ja.metrics`' statistics against closed forms and independent references: a line's
crossing, scipy's `linregress`, the textbook and propagated standard errors (and
their Monte Carlo spread), an AR(1) series' autocorrelation time `(1 + φ)/(1 − φ)`,
the binomial error and a mean's; each also refuses a prediction 10 % off."""

import math

import numpy as np
import pytest
from scipy import signal, stats

import jaxattn as ja

M = ja.metrics


def _far(value, want, rel):
    """`value` is not within `rel` of `want` (a prediction that must fail)."""
    return abs(value - want) > rel * abs(want)


def test_level_crossing_of_a_line_rising_and_falling():
    x = np.linspace(0.3, 2.1, 7)
    for level in (0.0, 0.4):
        want = 1.27 + level / 2  # y = 2(x − 1.27) crosses `level` there
        got = M.level_crossing(x, 2 * (x - 1.27), level)
        assert got == pytest.approx(want, rel=1e-12) and _far(got, 1.1 * want, 0.05)
        down = M.level_crossing(x, -2 * (x - 1.27), -level, falling=True)
        assert down == pytest.approx(want, rel=1e-12)
    assert math.isnan(M.level_crossing(x, 2 * (x - 1.27), falling=True))
    assert math.isnan(M.level_crossing(x, -2 * (x - 1.27)))


def test_level_crossing_reads_the_first_segment_and_the_start():
    betas = np.array([0.5, 1.0, 1.5, 2.0])
    assert M.level_crossing(betas, 1.2 - betas, falling=True) == pytest.approx(1.2)
    assert math.isnan(M.level_crossing(betas, betas, falling=True))
    # a curve already past the level: at the start with `at_start`, else none
    assert M.level_crossing(betas, -betas, falling=True, at_start=True) == 0.5
    assert math.isnan(M.level_crossing(betas, -betas, falling=True))
    g = np.array([1.0, 2.0, 3.0])
    assert M.level_crossing(g, np.array([0.0, 0.25, 0.75]), 0.5) == 2.5
    assert math.isnan(M.level_crossing(g, np.array([0.0, 0.1, 0.2]), 0.5))
    # the first of two crossings
    assert M.level_crossing(g, np.array([-1.0, 1.0, -1.0]), falling=True) == 2.5
    # too few points to cross: none
    assert math.isnan(M.level_crossing([], []))
    assert math.isnan(M.level_crossing([1.0], [2.0], at_start=False))
    # a point not measured (NaN x, as mean-field's unrefined couplings) never crosses
    assert math.isnan(M.level_crossing([0.0, np.nan, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0], 1.5))
    assert M.level_crossing([0.0, np.nan, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0], 2.5) == 1.5
    assert M.level_crossing([np.nan, 1.0], [5.0, 6.0], 1.0, at_start=True) == 1.0


def test_level_crossing_keeps_only_segments_with_both_ends_kept():
    """A free energy gap between ordered caps (`r > 0.1`): the crossing at 0.8 on the
    grid, between grid points at 0.83; none where no cap is ordered or none crosses."""
    K = np.linspace(0.6, 1.0, 5)
    gap = 0.8 - K  # crosses at 0.8, on the grid; the caps at 0.6 fell to uniform
    r = np.array([1e-3, 0.5, 0.6, 0.7, 0.8])

    def crossing(gap, r):
        return M.level_crossing(K, gap, falling=True, keep=r > 0.1)

    assert crossing(gap, r) == pytest.approx(0.8)
    assert crossing(0.83 - K, r) == pytest.approx(0.83)
    assert math.isnan(crossing(gap, np.full(5, 1e-3)))
    assert math.isnan(crossing(1.5 - K, r))
    # the cap at 0.8 is not ordered: the sign change 0.7 → 0.8 does not count
    assert math.isnan(crossing(0.75 - K, np.array([0.5, 0.5, 1e-3, 0.5, 0.5])))


def test_level_crossing_in_logit_is_exact_on_a_logistic_curve():
    x = np.array([0.0, 0.7, 1.9, 3.0])
    y = 1 / (1 + np.exp(-1.3 * (x - 1.6)))
    assert M.level_crossing(x, y, 0.5, logit=True) == pytest.approx(1.6, rel=1e-12)
    assert M.level_crossing(x, y, 0.2, logit=True) == pytest.approx(
        1.6 + math.log(0.25) / 1.3, rel=1e-12)
    assert _far(M.level_crossing(x, y, 0.5), 1.6, 1e-3)  # a linear read is off


def test_level_crossing_in_logit_weighs_samples_at_zero_and_one_alike():
    # clipped to 1e-300 below and 1 - 1e-16 above, a step from 0 to 1 crossed 1/2 at
    # 0.95 of the way: the two ends must sit equally far out in the logit
    assert M.level_crossing([0.0, 1.0], [0.0, 1.0], 0.5, logit=True) == pytest.approx(0.5)
    assert M.level_crossing([0.0, 1.0], [1.0, 0.0], 0.5, logit=True,
                            falling=True) == pytest.approx(0.5)


def test_fit_slope_is_linregress(seed):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 5, 11))
    y = -0.8 * x + 2.0 + 0.3 * rng.standard_normal(11)
    slope, se = M.fit_slope(x, y)
    ref = stats.linregress(x, y)
    assert slope == pytest.approx(ref.slope, rel=1e-12)
    assert se == pytest.approx(ref.stderr, rel=1e-10)
    # the textbook error: √(Σ r² / (k − 2) / Σ (x − x̄)²)
    resid = y - np.polyval(np.polyfit(x, y, 1), x)
    assert se == pytest.approx(math.sqrt(resid @ resid / 9 / np.sum((x - x.mean()) ** 2)),
                               rel=1e-10)
    assert _far(se, 1.1 * ref.stderr, 0.05) and _far(slope, 1.1 * ref.slope, 0.05)
    exact, zero = M.fit_slope(x, 2.5 * x - 1)
    assert exact == pytest.approx(2.5, rel=1e-12) and zero < 1e-12
    two = M.fit_slope([1.0, 2.0], [3.0, 5.0])
    assert two[0] == pytest.approx(2.0) and math.isnan(two[1])  # no residual left
    assert all(math.isnan(v) for v in M.fit_slope([1.0], [2.0]))


def test_fit_slope_errors_from_known_errors(seed):
    """With the errors of `y` known: the weighted fit's error is `√(S/Δ)` (`S = Σ w`,
    `Δ = S Σ w x² − (Σ w x)²`, `w = 1/se²`); the ordinary fit carries them as
    `√Σ (c_i se_i)²`, `c_i = (x_i − x̄)/Σ (x − x̄)²`; both the spread of their slopes
    over 4000 draws (to 5 %, which a 10 % error misses)."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 3.0, 9)
    se = 0.05 + 0.1 * x
    w = 1 / se**2
    S, Sx, Sxx = w.sum(), w @ x, w @ x**2
    c = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    draws = 1.5 * x - 0.5 + se * rng.standard_normal((4000, 9))
    for weighted, want in ((True, math.sqrt(S / (S * Sxx - Sx**2))),
                           (False, math.sqrt(np.sum((c * se) ** 2)))):
        slope, got = M.fit_slope(x, draws[0], se=se, weighted=weighted)
        assert got == pytest.approx(want, rel=1e-10)
        spread = np.std([M.fit_slope(x, y, se=se, weighted=weighted)[0] for y in draws])
        assert spread == pytest.approx(got, rel=0.05) and _far(spread, 1.1 * got, 0.05)


def test_fit_intercept_is_linregress_and_the_weighted_closed_form(seed):
    """The line's value at 0 and its error: scipy's `linregress` (`intercept`,
    `intercept_stderr`) without errors; with them, the weighted fit's `√(Σ w x²/Δ)`
    (as in `test_fit_slope_errors_from_known_errors`). A 10 % error misses."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.5, 5, 11))
    y = -0.8 * x + 2.0 + 0.3 * rng.standard_normal(11)
    value, se = M.fit_intercept(x, y)
    ref = stats.linregress(x, y)
    assert value == pytest.approx(ref.intercept, rel=1e-12)
    assert se == pytest.approx(ref.intercept_stderr, rel=1e-10)
    assert _far(value, 1.1 * ref.intercept, 0.05) and _far(se, 1.1 * ref.intercept_stderr, 0.05)
    sigma = 0.05 + 0.1 * x
    w = 1 / sigma**2
    S, Sx, Sxx = w.sum(), w @ x, w @ x**2
    want_value = (Sxx * (w @ y) - Sx * (w @ (x * y))) / (S * Sxx - Sx**2)
    value, se = M.fit_intercept(x, y, se=sigma)
    assert value == pytest.approx(want_value, rel=1e-10)
    assert se == pytest.approx(math.sqrt(Sxx / (S * Sxx - Sx**2)), rel=1e-10)
    assert _far(se, 1.1 * math.sqrt(Sxx / (S * Sxx - Sx**2)), 0.05)
    two = M.fit_intercept([1.0, 2.0], [3.0, 5.0])
    assert two[0] == pytest.approx(1.0) and math.isnan(two[1])  # no residual left
    assert all(math.isnan(v) for v in M.fit_intercept([1.0], [2.0]))


def test_fit_crossing_of_a_line_and_its_error(seed):
    """A line's zero, exactly; its delta-method error the spread of the zeros of
    noisy copies (to 5 %: a 10 % error misses)."""
    betas = np.linspace(0.8, 1.2, 5)
    zero, se = M.fit_crossing(betas, 2.0 * (1.05 - betas), se=np.full(5, 0.01))
    assert zero == pytest.approx(1.05, rel=1e-12) and 0 < se < 0.01
    assert M.fit_crossing(betas, 2.0 * (1.05 - betas), 0.2)[0] == pytest.approx(0.95)
    rng = np.random.default_rng(seed)
    sigma = np.full(5, 0.004)
    draws = 2.0 * (1.05 - betas) + sigma * rng.standard_normal((4000, 5))
    se = M.fit_crossing(betas, draws[0], se=sigma)[1]
    spread = np.std([M.fit_crossing(betas, y, se=sigma)[0] for y in draws])
    assert spread == pytest.approx(se, rel=0.05) and _far(spread, 1.1 * se, 0.05)


def test_fit_crossing_of_a_parabola_takes_the_root_nearest_the_start():
    x = np.array([0.5, 2.2, 3.5])
    y = (x - 1.0) * (x - 3.0)
    root, se = M.fit_crossing(x, y, degree=2)
    assert root == pytest.approx(1.0, rel=1e-12) and math.isnan(se)  # no spare point
    assert M.fit_crossing(x[::-1], y[::-1], degree=2)[0] == pytest.approx(3.0, rel=1e-12)
    assert all(math.isnan(v) for v in M.fit_crossing(x, y + 5, degree=2))  # no real root
    assert all(math.isnan(v) for v in M.fit_crossing(x[:2], y[:2], degree=2))


def test_binomial_error(seed):
    np.testing.assert_allclose(M.binomial_error([0.5, 0.0, 0.1], 100), [0.05, 0.0, 0.03])
    p, n = 0.3, 250
    assert M.binomial_error(p, n) == pytest.approx(math.sqrt(p * (1 - p) / n), rel=1e-15)
    shares = np.random.default_rng(seed).binomial(n, p, 20_000) / n
    assert np.std(shares) == pytest.approx(M.binomial_error(p, n), rel=0.03)
    assert _far(np.std(shares), 1.1 * M.binomial_error(p, n), 0.03)


def test_mean_error_against_scipy_and_the_spread_of_means(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(2.0, 3.0, (4, 50))
    mean, se = M.mean_error(x)
    np.testing.assert_allclose(mean, x.mean(-1), rtol=1e-15)
    np.testing.assert_allclose(se, stats.sem(x, axis=-1), rtol=1e-12)
    along = M.mean_error(x.T, axis=0)
    np.testing.assert_allclose(along[1], se, rtol=1e-15)
    assert math.isnan(M.mean_error([1.5])[1]) and M.mean_error([1.5])[0] == 1.5
    # the error is the spread of the mean over repeats, and not 10 % more
    means, errors = M.mean_error(rng.normal(2.0, 3.0, (20_000, 40)))
    spread, want = np.std(means), math.sqrt(np.mean(errors**2))
    assert spread == pytest.approx(want, rel=0.03) and _far(spread, 1.1 * want, 0.03)


def _ar1(rng, phi: float, steps: int) -> np.ndarray:
    """`x_{t+1} = φ x_t + ξ_t`, standard normal `ξ`."""
    return signal.lfilter([1.0], [1.0, -phi], rng.standard_normal(steps))


@pytest.mark.parametrize("phi", [0.5, 0.8])
def test_autocorrelation_time_of_an_ar1_series(seed, phi):
    """AR(1) with coefficient φ: `τ_int = (1 + φ)/(1 − φ)` steps, to 10 % at 2·10⁵
    steps and to 4 % at 2·10⁶ (its error there ~1 %), where a 10 % error fails."""
    rng = np.random.default_rng(seed)
    want = (1 + phi) / (1 - phi)
    assert M.autocorrelation_time(_ar1(rng, phi, 200_000)) == pytest.approx(want, rel=0.1)
    long = M.autocorrelation_time(_ar1(rng, phi, 2_000_000))
    assert long == pytest.approx(want, rel=0.04) and _far(long, 1.1 * want, 0.04)
    assert math.isnan(M.autocorrelation_time(np.ones(10)))


def test_block_means_cut_the_tail_per_seed():
    r = np.arange(2 * 10, dtype=float).reshape(2, 10)  # two seeds of ten steps
    np.testing.assert_allclose(M.block_means(r, 8, 2), [[3.5, 7.5], [13.5, 17.5]])


def test_half_gap_flags_a_drifting_window(seed):
    rng = np.random.default_rng(seed)
    still = 1 + 0.1 * rng.standard_normal((3, 2, 8))
    drift = still + np.linspace(0, 1, 8)
    assert np.all(np.abs(M.half_gap(still)) < 4)
    assert np.all(M.half_gap(drift) > 4)
    # one block mean in each half has no spread: it was a NaN and NumPy's warnings
    with pytest.raises(ValueError, match="two block means in each half"):
        M.half_gap(still[:, :1, :2])
    assert np.isfinite(M.half_gap(still[:, :, :2])).all()  # two seeds: two means a half


def test_window_statistics_flag_a_drift_and_a_slow_series(seed):
    """A stationary white series is equilibrated, its error the spread of the block
    means; the same with a drift fails the halves' check; a moving average over 50
    steps (autocorrelation time ≈ 50, read as ≥ 15 by Sokal's rule) fails the block
    check with blocks of 25 steps."""
    rng = np.random.default_rng(seed)
    steps, blocks, judge = 1000, 40, {"gap_z": 3.0, "block_taus": 2.0}
    white = 0.5 + 0.01 * rng.standard_normal((1, 2, steps))
    drift = white + np.linspace(0, 0.05, steps)
    noise = rng.standard_normal((2, steps + 49))
    slow = np.stack([np.convolve(x, np.ones(50) / 50, "valid") for x in noise])[None]
    w = M.window_statistics(white, steps, blocks, **judge)
    assert w.equilibrated.tolist() == [True] and abs(w.mean[0] - 0.5) < 3 * w.se[0]
    assert w.se[0] == pytest.approx(0.01 / math.sqrt(2 * steps), rel=0.3)
    assert M.window_statistics(drift, steps, blocks, **judge).equilibrated.tolist() == [False]
    s = M.window_statistics(0.5 + 0.01 * slow, steps, blocks, **judge)
    assert s.autocorrelation[0] > steps / blocks / judge["block_taus"]
    assert s.equilibrated.tolist() == [False]


@pytest.mark.parametrize("call, match", [
    (lambda: M.fit_slope([1.0, 2.0, 3.0], [2.0, 3.0]),
     r"^fit_slope needs `x`, `y`.*\(3,\), \(2,\)"),
    (lambda: M.fit_intercept([1.0, 2.0], [2.0, 3.0], se=[1.0]),
     r"^fit_intercept needs .* and \(1,\)"),
    (lambda: M.fit_slope([1.0, 1.0, 1.0], [2.0, 3.0, 4.0]), "needs 2 distinct `x`, got"),
    (lambda: M.fit_crossing([0.0, 1.0, 1.0], [1.0, 0.0, 2.0], degree=2), "of degree 2 needs 3"),
    (lambda: M.fit_slope([1.0, np.nan, 3.0], [2.0, 3.0, 4.0]), "needs finite `x`"),
    (lambda: M.fit_slope([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], se=[0.0, 1.0, 1.0]),
     r"every `se` finite and > 0 .* weighted=False"),
    (lambda: M.binomial_error([0.5, 1.5], 10), r"`p` is a share: it must lie in \[0, 1\]"),
    (lambda: M.binomial_error(0.5, 0), "`n` must be a whole number ≥ 1"),
    (lambda: M.autocorrelation_time(np.ones((3, 4))), r"one finite series .* shape \(3, 4\)"),
    (lambda: M.autocorrelation_time([1.0]), "at least two samples"),
    (lambda: M.autocorrelation_time([1.0, np.nan, 2.0]), "with NaN or inf"),
    (lambda: M.block_means(np.ones(10), 20, 2), "window=20, steps=10"),
    (lambda: M.block_means(np.ones(10), 4, 0), "blocks=0"),
    (lambda: M.half_gap(np.ones(4)), r"at least two blocks, got shape \(4,\)"),
    # these returned a number (0.5), raised NumPy's or Python's own error, or blamed
    # another function
    (lambda: M.level_crossing([0, 1, 2], [0, 1], 0.5), r"x and y of one shape .*\(2,\)"),
    (lambda: M.level_crossing([0, 1], [0, 1], 0.5, keep=[True]), "keep must be a mask"),
    (lambda: M.level_crossing([0, 1], [0.2, 0.8], 1.0, logit=True), r"level in \(0, 1\)"),
    (lambda: M.block_means(np.ones((2, 20)), 10, 2.5), "whole numbers .* blocks=2.5"),
    (lambda: M.fit_crossing([0, 1, 2], [0, 1, 2], 1, degree=1.5), "degree must be a whole"),
    (lambda: M.fit_crossing([0, 1, 2], [0, 1, 2], 1, degree=0), "degree must be a whole"),
    (lambda: M.consensus_time(np.zeros(0), np.zeros(0), 1e-3), r"T = len\(ts\) ≥ 1"),
    (lambda: M.window_statistics(np.ones((2, 20)), 10, 2, gap_z=2, block_taus=1),
     r"window_statistics needs series \(k, seeds, steps\), got shape \(2, 20\)"),
    # these returned NaN with NumPy's warnings, a number (0.5 for a clipped y, or read
    # off unsorted x), judged every window unequilibrated without a word, or blamed
    # `autocorrelation_time`
    (lambda: M.mean_error([]), r"^mean_error needs at least one sample .* shape \(0,\)"),
    (lambda: M.mean_error(np.ones((3, 0))), "at least one sample along axis -1"),
    (lambda: M.level_crossing([0, 1], [0, 1], math.nan), "^level_crossing needs a finite level"),
    (lambda: M.level_crossing([0, 1], [0, 1], math.inf), "needs a finite level, got inf"),
    (lambda: M.level_crossing([0, 1], [-0.5, 1.5], 0.5, logit=True),
     r"logit=True needs y in \[0, 1\] .* got -0.5"),
    (lambda: M.level_crossing([0, 1, 2], [0.2, np.nan, 1.5], 0.5, logit=True), "got 1.5"),
    (lambda: M.level_crossing([0, 2, 1], [0, 1, 2], 0.5),
     "needs nondecreasing x, got 1.0 after 2.0: sort"),
    (lambda: M.level_crossing([0, np.nan, -1], [0, 1, 2], 0.5),
     "nondecreasing x, got -1.0 after 0.0"),
    (lambda: M.window_statistics(np.ones((1, 2, 20)), 10, 2, gap_z=math.nan, block_taus=1),
     "^window_statistics needs gap_z ≥ 0 and block_taus ≥ 0, got gap_z=nan"),
    (lambda: M.window_statistics(np.ones((1, 2, 20)), 10, 2, gap_z=-1, block_taus=1),
     "gap_z=-1 and"),
    (lambda: M.window_statistics(np.ones((1, 2, 20)), 10, 2, gap_z=3, block_taus=-5),
     "and block_taus=-5"),
    (lambda: M.window_statistics(np.ones((1, 2, 20)), 6, 4, gap_z=3, block_taus=1),
     "^window_statistics needs at least two steps per block, got window=6 in 4 blocks"),
    (lambda: M.window_statistics(np.where(np.arange(60).reshape(3, 1, 20) == 39, np.nan, 1.0),
                                 10, 2, gap_z=3, block_taus=1),
     "^window_statistics needs finite series in the window, got NaN or inf at point 1 of 3"),
])
def test_the_statistics_refuse_what_they_cannot_read(call, match):
    """One line naming the function and the mistake, where NumPy would raise its own
    error, print LAPACK's complaints or return a silent NaN or inf."""
    with pytest.raises(ValueError, match=match):
        call()


def test_a_share_not_measured_has_no_error():
    """antipodal's formation bars pass NaN for groups a size cannot form."""
    se = M.binomial_error([0.25, np.nan], 4)
    assert se[0] == pytest.approx(math.sqrt(0.25 * 0.75 / 4)) and math.isnan(se[1])


def test_an_unweighted_fit_carries_a_nan_error_through():
    """`weighted=False` accepts an unknown (NaN) `se`, as the mean-field experiment
    passes for a size with one sample: the slope is read, its error is NaN."""
    slope, se = M.fit_slope([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], se=[0.1, np.nan, 0.1],
                            weighted=False)
    assert slope == pytest.approx(1.0) and math.isnan(se)


def test_a_fit_flat_to_rounding_crosses_nowhere():
    """A constant `y` fits a slope of rounding (1e-16): its "crossing" was 6e15."""
    assert all(math.isnan(v) for v in M.fit_crossing([0, 1, 2, 3], [1, 1, 1, 1], 0.5))
    assert M.fit_crossing([0, 1, 2, 3], [0, 1, 2, 3], 1.5)[0] == pytest.approx(1.5)


def test_an_anticorrelated_series_has_a_short_time_never_a_negative_one():
    """An alternating series is anticorrelated: its time is 0 at the least (its
    truncated sum was −0.98), and a window judged on it counts a step per sample."""
    assert M.autocorrelation_time(np.tile([1.0, -1.0], 50)) == 0.0
    r = np.tile([1.0, -1.0], 50)[None, None]
    assert M.window_statistics(r, 40, 4, gap_z=2, block_taus=1).autocorrelation[0] == 1.0


def test_fits_far_from_zero_are_linregress():
    """At x = 1e8 + k the slope's error was 15 % high, and at 1e10 + k the fit raised
    NumPy's LinAlgError (singular normal equations): the fit runs in centred x."""
    y = np.array([0, 1.1, 2, 3.05, 3.9, 5.2])
    for offset in (0.0, 1e8, 1e10):
        x = offset + np.arange(6.0)
        ref = stats.linregress(x - offset, y)
        slope, se = ja.metrics.fit_slope(x, y)
        assert slope == pytest.approx(ref.slope, rel=1e-12)
        assert se == pytest.approx(ref.stderr, rel=1e-9)
        zero, zero_se = ja.metrics.fit_crossing(x, y - 2.5)
        at = (2.5 - ref.intercept) / ref.slope
        assert zero == pytest.approx(offset + at, rel=1e-15, abs=1e-12)
        assert zero_se == pytest.approx(ja.metrics.fit_crossing(x - offset, y - 2.5)[1], rel=1e-6)


def test_potential_refuses_nonfinite_tokens():
    with pytest.raises(ValueError, match="^potential: `x` contains NaN or inf"):
        ja.metrics.potential(np.array([[np.nan, 0, 0], [1.0, 0, 0]]), np.eye(3))


def test_consensus_time_refuses_times_out_of_order_and_an_autocorrelation_any_scale():
    """Decreasing or NaN `ts` gave a time (3.09) or NaN; `inf` saves after a stop stay
    valid. `autocorrelation_time` of a series × 1e±200 was NaN (its variance over- or
    underflowed): it reads the same at any scale."""
    E = np.array([1, 0.1, 0.01, 0.001])
    for ts in (np.array([3.0, 2, 1, 0]), np.array([0, np.nan, 2, 3])):
        with pytest.raises(ValueError, match="`ts` must be nondecreasing and not NaN"):
            ja.metrics.consensus_time(ts, E, 0.05)
    stopped = ja.metrics.consensus_time(np.array([0, 1, 2, np.inf]), E * [1, 1, 1, np.nan],
                                        0.05)
    assert float(stopped) == pytest.approx(1 + math.log(0.1 / 0.05) / math.log(10))
    series = np.array([1, -1, 2, 0.5, -1])
    tau = ja.metrics.autocorrelation_time(series)
    for scale in (1e200, 1e-200):
        assert ja.metrics.autocorrelation_time(scale * series) == pytest.approx(tau, rel=1e-12)


def test_rescaled_euler_refuses_what_it_cannot_step():
    """β ≤ 1 ran the scheme backwards (lr · log β < 0); coincident or NaN angles gave
    an all-NaN energy without a word; a list as `theta0` raised AttributeError."""
    good = np.array([0.0, 0.5, 2.0, 4.0])
    assert np.all(np.isfinite(ja.metrics.rescaled_euler(list(good), 10.0, 0.1, 3)))
    for theta, beta, match in ((good, 0.5, "β > 1"), ([1.0, 1.0], 10.0, "not all at one angle"),
                               ([0.0, np.nan], 10.0, "finite angles")):
        with pytest.raises(ValueError, match=match):
            ja.metrics.rescaled_euler(theta, beta, 0.1, 3)


@pytest.mark.filterwarnings("error")  # NumPy's over- and underflow warnings too
@pytest.mark.parametrize("x_scale, y_scale", [  # the slope y/x within float64's range
    (x, y) for x in (1e-170, 1e-100, 1.0, 1e100, 1e170)
    for y in (1e-300, 1e-200, 1e-170, 1e-160, 1.0, 1e155, 1e200, 1e300)
    if abs(math.log10(y) - math.log10(x)) <= 300])
def test_fit_errors_at_any_scale_are_linregress(x_scale, y_scale):
    """The slope's and intercept's errors are scipy's `linregress` times the scale. Their
    variance under- or overflowed: at y × 1e-170 the error was 0 ("infinitely
    precise"), at y × 1e155 inf, and x × 1e∓170 did the same the other way round; so
    did a known `se` at y × 1e-200. The errors are now rooted before they are scaled."""
    x, y = np.array([0.0, 1, 2, 3, 4.5]), np.array([1, 1.1, 1.3, 1.2, 1.6])
    ref = stats.linregress(x, y)
    slope, se = M.fit_slope(x * x_scale, y * y_scale)
    assert slope / (ref.slope * y_scale / x_scale) == pytest.approx(1, rel=1e-12)
    assert se / (ref.stderr * y_scale / x_scale) == pytest.approx(1, rel=1e-12)
    assert _far(se / (y_scale / x_scale), 1.1 * ref.stderr, 0.05)
    value, value_se = M.fit_intercept(x * x_scale, y * y_scale)
    assert value / (ref.intercept * y_scale) == pytest.approx(1, rel=1e-12)
    assert value_se / (ref.intercept_stderr * y_scale) == pytest.approx(1, rel=1e-12)
    errors = np.array([0.1, 0.2, 0.1, 0.15, 0.1])
    for weighted in (True, False):
        known = [f(x, y, se=errors, weighted=weighted)[1] for f in (M.fit_slope, M.fit_intercept)]
        scaled = [f(x * x_scale, y * y_scale, se=errors * y_scale, weighted=weighted)[1]
                  for f in (M.fit_slope, M.fit_intercept)]
        assert scaled[0] / (known[0] * y_scale / x_scale) == pytest.approx(1, rel=1e-12)
        assert scaled[1] / (known[1] * y_scale) == pytest.approx(1, rel=1e-12)


@pytest.mark.filterwarnings("error")  # NumPy's over- and underflow warnings too
def test_autocorrelation_time_near_float64s_top():
    """Data up to 1e308 centred to NaN, with NumPy's overflow warnings (its differences
    overflowed before the rescaling): it now reads the unscaled time."""
    series = np.array([3, 1, 4, 1, 5, 9, 2, 6.0])
    tau = M.autocorrelation_time(series)
    assert tau == pytest.approx(0.19503546099290814, rel=1e-12)
    for scale in (1e308 / 9, -1e308 / 9):
        assert M.autocorrelation_time(scale * series) == pytest.approx(tau, rel=1e-12)


@pytest.mark.filterwarnings("error")  # NumPy's over- and underflow warnings too
def test_level_crossing_through_an_infinite_sample_is_the_limit():
    """An infinite sample gave NaN and NumPy's warning (inf/inf): a segment with one
    infinite end crosses at its finite end, a step from −inf to +inf at its middle."""
    assert M.level_crossing([0, 1, 2], [-np.inf, 1, 2]) == 1.0
    assert M.level_crossing([0, 1, 2], [-1, np.inf, 2]) == 0.0
    assert M.level_crossing([0, 1, 2], [-np.inf, np.inf, 2]) == 0.5
    assert M.level_crossing([0, 1, 2], [np.inf, 3, -np.inf], 1, falling=True) == 1.0
    # the limit of steeper and steeper finite samples
    assert M.level_crossing([0, 1, 2], [-1e300, 1, 2]) == pytest.approx(1.0, abs=1e-15)
    assert math.isnan(M.level_crossing([0, 1, 2], [np.inf, np.inf, np.inf], falling=True))
    # a repeated x is a vertical step: it crosses there
    assert M.level_crossing([0, 1, 1, 2], [-1, -0.5, 0.5, 1]) == 1.0
