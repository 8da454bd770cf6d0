"""The requeue-cost curve's statistics: confidence intervals and the growth verdict."""

from __future__ import annotations

import math

import pytest

from load import curve


def test_mean_ci_matches_a_hand_computed_interval():
    # mean 10, sample sd 1.5811 (values 8..12), n 5: t(4) = 2.776, half-width 2.776 * 1.5811 / sqrt(5) = 1.963
    result = curve.mean_ci([8, 9, 10, 11, 12])
    assert result["mean"] == 10
    assert result["ci95"] == pytest.approx(1.963, abs=1e-3)
    assert (result["low"], result["high"]) == pytest.approx((8.037, 11.963), abs=1e-3)


def test_mean_ci_with_too_few_values():
    assert curve.mean_ci([]) == {"n": 0, "mean": None, "ci95": None, "low": None, "high": None}
    assert curve.mean_ci([3.0, None])["ci95"] is None
    assert curve.t95(100) == 1.96
    with pytest.raises(ValueError):
        curve.t95(0)


@pytest.mark.parametrize("power, expected", [(0, "constant"), (1, "linear"), (2, "quadratic")])
def test_growth_of_exact_power_laws(power, expected):
    points = [(n, 0.5 * n ** power * (1 + 0.02 * ((i % 3) - 1))) for n in (100, 1000, 5000) for i in range(5)]
    fit = curve.loglog_slope(points)
    assert fit["slope"] == pytest.approx(power, abs=0.05)
    assert curve.growth(fit) == expected
    assert curve.verdict("hints on", fit).startswith(f"hints on: {expected} (log-log slope")


def test_noisy_data_gives_no_verdict():
    points = [(100, 1.0), (100, 9.0), (1000, 2.0), (1000, 20.0), (5000, 1.0), (5000, 30.0)]
    fit = curve.loglog_slope(points)
    assert curve.growth(fit) == "undecided (its interval spans more than one band)"


def test_one_size_or_no_interval_is_undecided():
    assert curve.growth(curve.loglog_slope([(100, 1.0), (100, 2.0)])) == "undecided (fewer than two sizes)"
    fit = curve.loglog_slope([(100, 1.0), (1000, 10.0)])
    assert fit["slope"] == pytest.approx(1.0)
    assert curve.growth(fit) == "undecided (no interval: too few repetitions)"
    assert curve.loglog_slope([(100, 0.0), (1000, math.nan)])["slope"] is None


def test_linear_fit_recovers_a_fixed_part_plus_a_part_per_pod():
    # cost = 140 ms + 1.7 ms per waiting pod, with a little noise: the log-log slope reads ~0.8, the
    # linear fit gives the two parts back
    points = [(n, (140 + 1.7 * n) * (1 + 0.01 * ((i % 3) - 1))) for n in (100, 300, 1000) for i in range(3)]
    fit = curve.linear_fit(points)
    assert fit["intercept"] == pytest.approx(140, abs=10)
    assert fit["slope"] == pytest.approx(1.7, abs=0.05)
    assert fit["slope_ci95"] < 0.1 and fit["r2"] > 0.99
    assert 0.6 < curve.loglog_slope(points)["slope"] < 0.9
    line = curve.describe_linear("cost", fit)
    assert "per waiting pod" in line and "1.7" in line


def test_linear_fit_needs_two_sizes():
    assert curve.linear_fit([(100, 1.0), (100, 2.0)])["slope"] is None
    assert "no linear fit" in curve.describe_linear("cost", curve.linear_fit([]))


def test_quadratic_fit_names_the_shape_a_fixed_part_hides_from_the_log_log_slope():
    sizes = (100, 1000, 5000)
    wobble = (0.99, 1.0, 1.01)
    # 200 ms + 1.5 ms per waiting pod: linear, though its log-log slope reads about 0.8
    line = [(n, (200 + 1.5 * n) * w) for n in sizes for w in wobble]
    fit = curve.quadratic_fit(line)
    assert fit["b"] == pytest.approx(1.5, rel=0.1) and fit["b_ci95"] < 0.5
    assert curve.shape(fit) == "linear"
    assert curve.loglog_slope(line)["slope"] < 0.9
    # the same plus a squared part per pod pair: quadratic
    square = [(n, (200 + 1.5 * n + 0.001 * n * n) * w) for n in sizes for w in wobble]
    assert curve.shape(curve.quadratic_fit(square)) == "quadratic"
    # a flat cost with noise: constant
    flat = [(n, 50 * w) for n in sizes for w in wobble]
    assert curve.shape(curve.quadratic_fit(flat)) == "constant"
    assert "constant (50 ms" in curve.describe_shape("cost", curve.quadratic_fit(flat))
    # a straight line whose largest size is noisy: b and c beside each other are both uncertain, but the
    # line without the squared term is not, and it decides (not "constant")
    noisy = [(n, (80 + 3.0 * n) * w) for n in (100, 1000) for w in (0.99, 1.01)]
    noisy += [(5000, 17157.0), (5000, 14824.0)]
    fit = curve.quadratic_fit(noisy)
    assert fit["b"] - fit["b_ci95"] < 0 < fit["c"] + fit["c_ci95"] and fit["c"] - fit["c_ci95"] < 0
    assert curve.shape(fit) == "linear"
    # growing, but each waiting pod costs less the more there are (batches amortise): sub-linear
    bending = [(n, (100 + 2.0 * n - 0.0002 * n * n) * w) for n in sizes for w in wobble]
    assert curve.shape(curve.quadratic_fit(bending)).startswith("sub-linear")


def test_quadratic_fit_needs_three_sizes():
    two_sizes = [(100, 1.0), (100, 1.1), (1000, 10.0), (1000, 10.5)]
    assert curve.quadratic_fit(two_sizes)["c"] is None
    assert curve.shape(curve.quadratic_fit(two_sizes)) == "undecided (needs three sizes and four runs)"
