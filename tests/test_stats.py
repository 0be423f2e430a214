"""Intervals and verdicts (`staleness.stats`)."""

import math

import numpy as np
import pytest

from staleness import stats


def test_bootstrap_interval_covers_the_true_median_at_about_the_nominal_rate():
    """Lognormal samples (true median 1.0) of 15 values, 300 trials: the 95% percentile
    bootstrap of the median covers 1.0 in 88-99% of them (its coverage is known to be a
    little below nominal for small n; the band is what 300 trials resolve)."""
    rng = np.random.default_rng(0)
    covered = 0
    for t in range(300):
        lo, hi, kind = stats.interval(rng.lognormal(0.0, 0.5, size=15), seed=t)
        covered += lo <= 1.0 <= hi
        assert kind == "bootstrap 95%"
    assert 0.88 <= covered / 300 <= 0.99, covered


def test_few_values_give_min_max_and_nans_are_dropped():
    assert stats.interval([3.0, 1.0, 2.0]) == (1.0, 3.0, "min-max")
    assert stats.interval([1.0, math.nan, 2.0]) == (1.0, 2.0, "min-max")
    lo, hi, kind = stats.interval([math.nan])
    assert math.isnan(lo) and math.isnan(hi) and kind == "none"


def test_distinguishable_means_disjoint():
    assert stats.distinguishable((0, 1), (1.5, 2)) and stats.distinguishable((3, 4), (1, 2))
    assert not stats.distinguishable((0, 1), (0.5, 2)) and not stats.distinguishable((0, 1), (math.nan, 2))


@pytest.mark.parametrize("held, total, label", [
    (12, 12, "HOLDS"), (11, 12, "MOSTLY"), (8, 12, "MOSTLY"), (7, 12, "MIXED"), (5, 12, "MIXED"),
    (4, 12, "MOSTLY NOT"), (1, 12, "MOSTLY NOT"), (0, 12, "DOES NOT HOLD"), (1, 1, "HOLDS"), (0, 1, "DOES NOT HOLD"),
])
def test_verdict_scale(held, total, label):
    assert stats.verdict(held, total) == label


def test_verdict_rejects_impossible_counts():
    with pytest.raises(ValueError):
        stats.verdict(3, 2)
    with pytest.raises(ValueError):
        stats.verdict(0, 0)
