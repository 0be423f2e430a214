"""Intervals over seeds and verdicts with a stated scale: how comparisons report uncertainty.

    lo, hi, kind = interval(values)        # median's bootstrap 95% CI, or min-max below 5 values
    distinguishable((lo1, hi1), (lo2, hi2))   # False when the intervals overlap
    verdict(held, total)                    # HOLDS / MOSTLY / MIXED / MOSTLY NOT / DOES NOT HOLD
    e = effect(a_values, b_values)          # median(a) - median(b) with a bootstrap interval
    e = effect(t_a, t_b, ratio=True)        # median(a) / median(b) (times to target; inf = never)
    v = judge([e1, e2, ...], claimed="above", null=0.0)   # a claim over scenarios: label, counts, effect
    v.label, v.text()                       # "MOSTLY NOT", "MOSTLY NOT: held in 1/12 ..., effect ..."
    model_set("0.01 s + μ/128 s per iteration")   # a verdict a modelling assumption decides

The bootstrap is the percentile bootstrap of the median (2000 resamples, a fixed seed, so
a report is reproducible); below `MIN_BOOTSTRAP` values the interval is the min-max range,
labelled as such. A claim is judged per scenario by its effect's interval (`judge`); a
verdict that a modelling assumption decides is `model_set(...)`: a label, not evidence.
"""

from __future__ import annotations

import math

import numpy as np

from typing import NamedTuple

__all__ = ["MIN_BOOTSTRAP", "LEVEL", "interval", "distinguishable", "verdict", "VERDICTS", "MODEL_SET",
           "Effect", "effect", "Judgement", "judge", "model_set", "is_evidence", "NOT_TESTED"]

MIN_BOOTSTRAP = 5
LEVEL = 0.95
VERDICTS = ("HOLDS", "MOSTLY", "MIXED", "MOSTLY NOT", "DOES NOT HOLD")
MODEL_SET = "set by the model"
NOT_TESTED = "not tested"


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
    return next(v for v, ok in zip(VERDICTS, (f == 1, f >= 2 / 3, f > 1 / 3, f > 0, True)) if ok)


class Effect(NamedTuple):
    """The effect of one comparison: `estimate` = median(a) - median(b) (or
    median(a) / median(b) when `ratio`), its interval (low, high) and the interval's
    kind ('bootstrap 95%', 'min-max' below MIN_BOOTSTRAP values per side, 'none')."""

    estimate: float
    low: float
    high: float
    kind: str
    ratio: bool = False

    @property
    def null(self) -> float:
        """The value of no effect: 1 for a ratio, 0 for a difference."""
        return 1.0 if self.ratio else 0.0

    def side(self, null: float | None = None) -> str:
        """'above' / 'below' when the interval lies wholly above / below `null`
        (default: no effect), else 'not distinguishable'."""
        n = self.null if null is None else null
        if math.isnan(self.low) or math.isnan(self.high):
            return "not distinguishable"
        if self.low > n:
            return "above"
        if self.high < n:
            return "below"
        return "not distinguishable"

    def text(self, fmt: str = ".3f") -> str:
        """'+0.031 [+0.012, +0.049] (bootstrap 95%)'; a ratio as '0.82x [0.70, 0.95]'."""
        if self.kind == "none" or math.isnan(self.estimate):
            return "n/a (no finite values)"
        if self.ratio:
            return f"{_num(self.estimate, fmt)}x [{_num(self.low, fmt)}, {_num(self.high, fmt)}] ({self.kind})"
        sfmt = "+" + fmt
        return f"{_num(self.estimate, sfmt)} [{_num(self.low, sfmt)}, {_num(self.high, sfmt)}] ({self.kind})"


def _num(x: float, fmt: str) -> str:
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def _contrast(ma, mb, ratio: bool):
    """median(a) - median(b), or median(a) / median(b) with inf / inf = NaN, x / inf = 0."""
    ma, mb = np.asarray(ma, np.float64), np.asarray(mb, np.float64)
    if not ratio:
        with np.errstate(invalid="ignore"):
            return ma - mb
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isinf(mb) & np.isfinite(ma), 0.0, ma / mb)


def effect(a, b, *, ratio: bool = False, level: float = LEVEL, resamples: int = 2000, seed: int = 0) -> Effect:
    """The effect of `a` against `b` (values over seeds, e.g. final accuracies).

    ratio=False: median(a) - median(b); ratio=True: median(a) / median(b) (for
    times; +inf, a run that never reached the target, is kept: x / inf = 0,
    inf / x = inf). NaN values are dropped. Interval: the percentile bootstrap
    (each side resampled independently, `resamples` times, fixed `seed`) with at
    least MIN_BOOTSTRAP values per side, else the range over all pairs
    (min-max); replicates that are undefined (inf - inf, inf / inf) count
    against the interval, which is then (NaN, NaN) if more than 1 - level of
    them are undefined.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"effect: level = {level!r} must lie in (0, 1)")
    va, vb = (np.asarray(x, np.float64) for x in (a, b))
    va, vb = va[~np.isnan(va)], vb[~np.isnan(vb)]
    if not ratio and (np.isinf(va).any() or np.isinf(vb).any()):
        raise ValueError("effect: a difference of values with inf is undefined; use ratio=True for times")
    if len(va) == 0 or len(vb) == 0:
        return Effect(math.nan, math.nan, math.nan, "none", ratio)
    est = float(_contrast(np.median(va), np.median(vb), ratio))
    if min(len(va), len(vb)) < MIN_BOOTSTRAP:
        pairs = _contrast(va[:, None], vb[None, :], ratio).ravel()
        if np.isnan(pairs).any():
            return Effect(est, math.nan, math.nan, "min-max", ratio)
        return Effect(est, float(pairs.min()), float(pairs.max()), "min-max", ratio)
    rng = np.random.default_rng(seed)
    ma = np.median(va[rng.integers(0, len(va), size=(resamples, len(va)))], axis=1)
    mb = np.median(vb[rng.integers(0, len(vb), size=(resamples, len(vb)))], axis=1)
    reps = np.sort(_contrast(ma, mb, ratio))
    undefined = int(np.isnan(reps).sum())
    kind = f"bootstrap {round(level * 100)}%"
    if undefined > (1 - level) * resamples:
        return Effect(est, math.nan, math.nan, kind, ratio)
    # an undefined replicate supports neither side: put half of them below every value and
    # half above (the interval can only widen), then take the percentiles
    finite = reps[~np.isnan(reps)]
    low_end = 0.0 if ratio else -math.inf
    padded = np.concatenate([np.full(undefined // 2, low_end), finite, np.full(undefined - undefined // 2, math.inf)])
    k_lo = int(math.floor((1 - level) / 2 * resamples))
    lo, hi = float(padded[k_lo]), float(padded[resamples - 1 - k_lo])
    return Effect(est, lo, hi, kind, ratio)


class Judgement(NamedTuple):
    """The verdict on a claim over scenarios (see `judge`)."""

    label: str          # one of VERDICTS, or MODEL_SET / NOT_TESTED text
    held: int           # scenarios where the claim held (interval on the claimed side)
    opposite: int       # scenarios where the opposite held
    undecided: int      # scenarios where the effect was not distinguishable from none
    total: int
    overall: Effect     # the median of the per-scenario estimates and its interval over scenarios
    claimed: str        # 'above' or 'below' the null value
    null: float

    @property
    def evidence(self) -> bool:
        return is_evidence(self.label)

    def text(self, fmt: str = ".3f") -> str:
        if not self.evidence:
            return self.label
        return (f"{self.label}: held in {self.held}/{self.total} scenarios (interval {self.claimed} {self.null:g}), "
                f"opposite in {self.opposite}, not distinguishable in {self.undecided}; effect over scenarios "
                f"(median of the per-scenario estimates) {self.overall.text(fmt)}")


def judge(effects, *, claimed: str, null: float | None = None) -> Judgement:
    """Judge a claim from one `Effect` per scenario.

    claimed: 'above' (the claim says the effect exceeds `null`) or 'below'.
    null: the value of no effect (default: 1 for ratio effects, 0 for differences;
    a claim such as "at most 0.75x" passes null=0.75). A scenario counts as held
    only where the effect's interval lies wholly on the claimed side; the label is
    `verdict(held, total)`. overall: the median of the estimates with its interval
    over scenarios (`interval`: bootstrap from MIN_BOOTSTRAP scenarios, else min-max).
    """
    effects = list(effects)
    if claimed not in ("above", "below"):
        raise ValueError(f"judge: claimed = {claimed!r} must be 'above' or 'below'")
    if not effects:
        raise ValueError("judge: effects is empty; give one Effect per scenario")
    if not all(isinstance(e, Effect) for e in effects):
        raise TypeError("judge: effects must be staleness.results.stats.Effect values (from `effect`)")
    ratio = effects[0].ratio
    n = effects[0].null if null is None else float(null)
    sides = [e.side(n) for e in effects]
    other = "below" if claimed == "above" else "above"
    held, opposite = sides.count(claimed), sides.count(other)
    ests = np.array([e.estimate for e in effects], np.float64)
    finite = ests[np.isfinite(ests)]
    lo, hi, kind = interval(finite)
    med = float(np.median(ests[~np.isnan(ests)])) if (~np.isnan(ests)).any() else math.nan
    overall = Effect(med, lo, hi, kind + ("" if kind == "none" else " over scenarios"), ratio)
    return Judgement(verdict(held, len(effects)), held, opposite, len(effects) - held - opposite, len(effects),
                     overall, claimed, n)


def model_set(assumption: str) -> str:
    """The label of a verdict decided by a modelling assumption, not by a measurement:
    'set by the model: <assumption>'. It is not evidence (`is_evidence` is False)."""
    if not isinstance(assumption, str) or not assumption.strip():
        raise ValueError(f"model_set: assumption = {assumption!r} must name the assumption that decides the verdict")
    return f"{MODEL_SET}: {assumption.strip()}"


def is_evidence(label: str) -> bool:
    """Whether a verdict label counts as evidence: one of VERDICTS (optionally followed
    by details), not a model-set or not-tested label."""
    return isinstance(label, str) and any(label == v or label.startswith(v + " ") or label.startswith(v + ":")
                                          for v in VERDICTS)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
