"""Intervals over seeds and verdicts with a stated scale: how comparisons report uncertainty.

    lo, hi, kind = interval(values)        # median's bootstrap 95% CI, or min-max below 5 values
    distinguishable((lo1, hi1), (lo2, hi2))   # False when the intervals overlap
    verdict(held, total)                    # HOLDS / MOSTLY / MIXED / MOSTLY NOT / DOES NOT HOLD

The bootstrap is the percentile bootstrap of the median (2000 resamples, a
fixed seed, so a report is reproducible); with fewer than `MIN_BOOTSTRAP`
values a bootstrap interval means little, and the interval is the min-max
range, labelled as such. NaN values (a run that never reached a target) are
dropped by `interval` and counted by the caller.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MIN_BOOTSTRAP", "LEVEL", "interval", "distinguishable", "verdict", "VERDICTS", "MODEL_SET"]

MIN_BOOTSTRAP = 5
LEVEL = 0.95
VERDICTS = ("HOLDS", "MOSTLY", "MIXED", "MOSTLY NOT", "DOES NOT HOLD")
MODEL_SET = "set by the model"


def interval(values, *, level: float = LEVEL, resamples: int = 2000, seed: int = 0) -> tuple[float, float, str]:
    """(low, high, kind) around the median of the finite `values`.

    kind: 'bootstrap 95%' (percentile bootstrap of the median) with >= MIN_BOOTSTRAP
    finite values, 'min-max' with fewer, 'none' with none (low = high = NaN).
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan, "none"
    if len(v) < MIN_BOOTSTRAP:
        return float(v.min()), float(v.max()), "min-max"
    rng = np.random.default_rng(seed)
    medians = np.median(v[rng.integers(0, len(v), size=(resamples, len(v)))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), f"bootstrap {round(level * 100)}%"


def distinguishable(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals (low, high) are disjoint: a difference claimed between
    two policies is "not distinguishable" when their intervals overlap."""
    (a_lo, a_hi), (b_lo, b_hi) = a[:2], b[:2]
    if any(math.isnan(x) for x in (a_lo, a_hi, b_lo, b_hi)):
        return False
    return a_hi < b_lo or b_hi < a_lo


def verdict(held: int, total: int) -> str:
    """The verdict of a claim that held in `held` of `total` scenarios:
    HOLDS (all), MOSTLY (at least two thirds), MIXED (more than a third),
    MOSTLY NOT (some), DOES NOT HOLD (none)."""
    if total <= 0 or not 0 <= held <= total:
        raise ValueError(f"verdict: held = {held!r} of total = {total!r} must satisfy 0 <= held <= total, total >= 1")
    f = held / total
    if f == 1:
        return "HOLDS"
    if f >= 2 / 3:
        return "MOSTLY"
    if f > 1 / 3:
        return "MIXED"
    if f > 0:
        return "MOSTLY NOT"
    return "DOES NOT HOLD"
