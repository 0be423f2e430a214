"""Intervals and verdicts (`staleness.results.stats`)."""

import math

import numpy as np
import pytest

from staleness.results import stats


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


def test_effect_interval_covers_the_true_difference_of_medians_at_about_the_nominal_rate():
    """Two normal samples of 10 values whose medians differ by 0.3 (true medians 0.3 and 0),
    300 trials: the bootstrap interval of the difference of medians covers 0.3 in 88-99%
    of them (the percentile bootstrap of a median is a little off nominal at n = 10)."""
    rng = np.random.default_rng(1)
    covered = 0
    for t in range(300):
        e = stats.effect(rng.normal(0.3, 1.0, 10), rng.normal(0.0, 1.0, 10), seed=t)
        covered += e.low <= 0.3 <= e.high
        assert e.kind == "bootstrap 95%" and e.low <= e.estimate <= e.high
    assert 0.88 <= covered / 300 <= 0.99, covered


def test_effect_with_few_values_is_the_range_over_pairs():
    e = stats.effect([1.0, 2.0], [0.5, 1.5])
    assert e == stats.Effect(0.5, -0.5, 1.5, "min-max", False)
    assert e.side() == "not distinguishable"
    assert stats.effect([3.0, 4.0], [1.0, 2.0]).side() == "above"
    assert stats.effect([1.0], [3.0, 4.0]).side() == "below"
    assert stats.effect([math.nan], [1.0]).kind == "none"


def test_ratio_effect_of_times_keeps_never_reached_as_infinite():
    never = [math.inf] * 5
    e = stats.effect([10.0, 11, 12, 13, 14], never, ratio=True)
    assert e.estimate == 0.0 and e.high == 0.0 and e.side() == "below"     # a reached, b never: earlier
    e = stats.effect(never, [10.0, 11, 12, 13, 14], ratio=True)
    assert math.isinf(e.estimate) and e.side() == "above"
    e = stats.effect(never, never, ratio=True)   # neither reached: nothing to say
    assert math.isnan(e.estimate) and e.side() == "not distinguishable"
    e = stats.effect([10.0, 11, 12, 13, 14], [20.0, 21, 22, 23, 24], ratio=True)
    assert e.estimate == pytest.approx(12 / 22) and e.high < 1 and e.side(0.75) == "below"
    with pytest.raises(ValueError):
        stats.effect([math.inf, 1.0], [1.0, 2.0])   # a difference with inf


def _e(est, lo, hi):
    return stats.Effect(est, lo, hi, "bootstrap 95%")


def test_judge_counts_only_distinguishable_scenarios_in_the_claimed_direction():
    # ASP higher in 11 of 12 scenarios (DSSP - ASP < 0, distinguishable), one indistinguishable
    effects = [_e(-0.04, -0.06, -0.02)] * 11 + [_e(0.01, -0.01, 0.03)]
    v = stats.judge(effects, claimed="above")
    assert (v.label, v.held, v.opposite, v.undecided, v.total) == ("DOES NOT HOLD", 0, 11, 1, 12)
    assert v.overall.estimate == pytest.approx(-0.04) and v.evidence
    assert "held in 0/12" in v.text() and "opposite in 11" in v.text()
    v = stats.judge([_e(0.02, 0.01, 0.03)] * 2 + [_e(-0.01, -0.02, 0.01)] * 4, claimed="above")
    assert (v.label, v.held, v.undecided) == ("MOSTLY NOT", 2, 4)
    v = stats.judge([_e(0.02, 0.01, 0.03)] * 3 + [_e(-0.01, -0.02, 0.01)] * 3, claimed="above")
    assert v.label == "MIXED"
    v = stats.judge([_e(0.02, 0.01, 0.03)] * 5 + [_e(-0.01, -0.02, 0.01)], claimed="above")
    assert v.label == "MOSTLY"
    v = stats.judge([_e(-0.02, -0.03, -0.01)] * 4, claimed="below")
    assert v.label == "HOLDS" and v.overall.kind == "min-max over scenarios"
    # a threshold other than no effect: "at most 0.75x"
    r = [stats.Effect(0.5, 0.4, 0.6, "bootstrap 95%", True), stats.Effect(0.7, 0.6, 0.8, "bootstrap 95%", True)]
    assert stats.judge(r, claimed="below", null=0.75).held == 1
    assert stats.judge(r, claimed="below").held == 2   # both below 1


def test_judge_rejects_bad_input():
    with pytest.raises(ValueError):
        stats.judge([], claimed="above")
    with pytest.raises(ValueError):
        stats.judge([_e(0, 0, 0)], claimed="higher")
    with pytest.raises(TypeError):
        stats.judge([(0.0, 0.0, 0.0)], claimed="above")


def test_model_set_labels_are_not_evidence():
    label = stats.model_set("0.01 s + μ/128 s per iteration")
    assert label == "set by the model: 0.01 s + μ/128 s per iteration"
    assert not stats.is_evidence(label) and not stats.is_evidence(stats.NOT_TESTED)
    assert all(stats.is_evidence(v) for v in stats.VERDICTS)
    assert stats.is_evidence("MOSTLY NOT: held in 1/12 scenarios")
    with pytest.raises(ValueError):
        stats.model_set("  ")
