"""How a cost grows with the number of waiting pods (pure arithmetic, for benchmarks/requeue_curve.py):
the mean of repeated measurements with a Student-t confidence interval, and the growth of the curve as
the slope of log(cost) against log(waiting pods): about 0 constant, 1 linear, 2 quadratic.

The verdict only names a growth when the data can tell: the slope's own 95 % interval (from the
per-repetition values) has to fall inside one class's band, otherwise it says "undecided" and why.
"""

from __future__ import annotations

import math
import statistics

# Two-sided 95 % critical values of Student's t, by degrees of freedom (beyond 30: the normal 1.96).
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)

# Slope bands: where a slope says constant, linear or quadratic. Between bands: no verdict.
BANDS = (("constant", -0.3, 0.3), ("linear", 0.7, 1.3), ("quadratic", 1.7, 2.3))


def t95(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        raise ValueError("a confidence interval needs at least two values")
    return _T95[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T95) else 1.96


def mean_ci(values: list[float]) -> dict:
    """Mean and the half-width of its 95 % confidence interval (None with fewer than two values)."""
    clean = [v for v in values if v is not None and math.isfinite(v)]
    if not clean:
        return {"n": 0, "mean": None, "ci95": None, "low": None, "high": None}
    mean = statistics.fmean(clean)
    if len(clean) < 2:
        return {"n": 1, "mean": mean, "ci95": None, "low": None, "high": None}
    half = t95(len(clean) - 1) * statistics.stdev(clean) / math.sqrt(len(clean))
    return {"n": len(clean), "mean": mean, "ci95": half, "low": mean - half, "high": mean + half}


def loglog_slope(points: list[tuple[float, float]]) -> dict:
    """Least-squares slope of log(y) on log(x) over (x, y) points (every repetition a point), with its
    95 % interval. Needs at least two distinct x and positive values."""
    usable = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y is not None and y > 0]
    xs = {x for x, _ in usable}
    if len(xs) < 2:
        return {"slope": None, "ci95": None, "n": len(usable)}
    n = len(usable)
    mean_x = statistics.fmean(x for x, _ in usable)
    mean_y = statistics.fmean(y for _, y in usable)
    sxx = sum((x - mean_x) ** 2 for x, _ in usable)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in usable) / sxx
    if n <= 2:
        return {"slope": slope, "ci95": None, "n": n}
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in usable) / (n - 2)
    return {"slope": slope, "ci95": t95(n - 2) * math.sqrt(residual / sxx), "n": n}


def growth(fit: dict) -> str:
    """constant / linear / quadratic when the slope's whole interval lies in that band; else undecided."""
    slope, half = fit.get("slope"), fit.get("ci95")
    if slope is None:
        return "undecided (fewer than two sizes)"
    if half is None:
        return "undecided (no interval: too few repetitions)"
    for name, low, high in BANDS:
        if low <= slope - half and slope + half <= high:
            return name
    return "undecided (its interval spans more than one band)"


def verdict(label: str, fit: dict) -> str:
    """One line: the growth and the slope it rests on."""
    slope, half = fit.get("slope"), fit.get("ci95")
    numbers = "no slope" if slope is None else f"log-log slope {slope:.2f}" + (f" ± {half:.2f}" if half else "")
    return f"{label}: {growth(fit)} ({numbers}, {fit.get('n', 0)} runs)"


def linear_fit(points: list[tuple[float, float]]) -> dict:
    """Least squares y = intercept + slope * x over (x, y) points, with the slope's 95 % interval and R².

    The log-log slope reads below 1 when a cost is a fixed part plus a part per waiting pod (the fixed
    part flattens the small sizes); this fit gives the two parts themselves: a slope whose interval
    excludes 0 means the cost per event grows with every waiting pod."""
    usable = [(float(x), float(y)) for x, y in points if y is not None and math.isfinite(y)]
    if len({x for x, _ in usable}) < 2:
        return {"intercept": None, "slope": None, "slope_ci95": None, "r2": None, "n": len(usable)}
    n = len(usable)
    mean_x = statistics.fmean(x for x, _ in usable)
    mean_y = statistics.fmean(y for _, y in usable)
    sxx = sum((x - mean_x) ** 2 for x, _ in usable)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in usable) / sxx
    intercept = mean_y - slope * mean_x
    residual = sum((y - intercept - slope * x) ** 2 for x, y in usable)
    total = sum((y - mean_y) ** 2 for _, y in usable)
    half = t95(n - 2) * math.sqrt(residual / (n - 2) / sxx) if n > 2 else None
    return {"intercept": intercept, "slope": slope, "slope_ci95": half,
            "r2": 1 - residual / total if total else None, "n": n}


def describe_linear(label: str, fit: dict, unit: str = "ms") -> str:
    """One line: the fixed part and the part per waiting pod, with the slope's interval."""
    if fit.get("slope") is None:
        return f"{label}: no linear fit (fewer than two sizes)"
    half = fit.get("slope_ci95")
    interval = f" ± {half:.3f}" if half is not None else " (no interval)"
    r2 = f", R² {fit['r2']:.3f}" if fit.get("r2") is not None else ""
    return (f"{label}: {fit['intercept']:.0f} {unit} + {fit['slope']:.3f}{interval} {unit} per waiting pod "
            f"({fit['n']} runs{r2})")


def quadratic_fit(points: list[tuple[float, float]]) -> dict:
    """Least squares y = a + b*x + c*x^2 with 95 % intervals for b and c (x in thousands inside, so the
    squares stay well conditioned; b is returned per waiting pod, c per waiting pod squared).

    A fixed part makes the log-log slope read below 1 for a straight line; this fit separates the three
    parts, so the shape can be named from the data: a c whose interval excludes 0 is curvature."""
    import numpy  # comes with matplotlib; only the benchmarks' summaries need it

    usable = [(float(x) / 1000, float(y)) for x, y in points if y is not None and math.isfinite(y)]
    n = len(usable)
    empty = {"a": None, "b": None, "b_ci95": None, "c": None, "c_ci95": None, "n": n}
    if len({x for x, _ in usable}) < 3 or n < 4:
        return empty
    design = numpy.array([[1.0, x, x * x] for x, _ in usable])
    ys = numpy.array([y for _, y in usable])
    (a, b, c), *_ = numpy.linalg.lstsq(design, ys, rcond=None)
    # the parameters' covariance: residual variance times the inverse of the normal matrix
    residual = float(numpy.sum((ys - design @ numpy.array([a, b, c])) ** 2)) / (n - 3)
    variances = residual * numpy.diag(numpy.linalg.inv(design.T @ design))
    t = t95(n - 3)
    b_half, c_half = (t * math.sqrt(max(float(v), 0.0)) for v in variances[1:])
    return {"a": float(a), "b": float(b) / 1000, "b_ci95": b_half / 1000, "c": float(c) / 1e6,
            "c_ci95": c_half / 1e6, "n": n, "line": linear_fit(points)}


def shape(fit: dict) -> str:
    """quadratic when the squared term's interval lies above 0; sub-linear when it lies below 0 and the
    linear term's above. When it includes 0 the squared term is dropped and the straight line decides
    (its slope being far better determined than b beside c): linear when the line's slope interval lies
    above 0, constant when it includes 0. Otherwise undecided, saying why."""
    if fit.get("c") is None:
        return "undecided (needs three sizes and four runs)"
    c_low, c_high = fit["c"] - fit["c_ci95"], fit["c"] + fit["c_ci95"]
    b_low = fit["b"] - fit["b_ci95"]
    if c_low > 0:
        return "quadratic"
    if c_high < 0 and b_low > 0:
        return "sub-linear (grows with the waiting pods, less than in proportion)"
    if c_high < 0:
        return "undecided (the squared term is negative and the linear one may be 0)"
    line = fit.get("line") or {}
    if line.get("slope") is None or line.get("slope_ci95") is None:
        return "undecided (no straight-line interval)"
    if line["slope"] - line["slope_ci95"] > 0:
        return "linear"
    if line["slope"] + line["slope_ci95"] >= 0:
        return "constant"
    return "undecided (falls as the waiting pods grow)"


def describe_shape(label: str, fit: dict, unit: str = "ms") -> str:
    """One line: the shape and the three parts it rests on."""
    if fit.get("c") is None:
        return f"{label}: {shape(fit)}"
    return (f"{label}: {shape(fit)} ({fit['a']:.0f} {unit} + {fit['b']:.4f} ± {fit['b_ci95']:.4f} {unit} x N "
            f"+ {fit['c']:.2e} ± {fit['c_ci95']:.2e} {unit} x N², {fit['n']} runs)")
