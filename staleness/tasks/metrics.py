"""Metrics with a direction: what "better" and "reached the target" mean.

A task declares its held-out metrics as `Metric` values: a name, whether higher or lower is better,
and the range the metric can take (accuracy in [0, 1], a loss >= 0). Time-to-target, comparisons and
target checks read the direction from here, never from the metric's name.

    m = metrics.get("accuracy")        # Metric('accuracy', 'higher', 0.0, 1.0)
    m.reached(history["accuracy"], 0.95)
    m.check_target(0.95)               # ValueError for 2.0: outside [0, 1]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["Metric", "KNOWN", "get", "resolve", "find"]

GOALS = ("higher", "lower")
REACH_RTOL = 1e-6   # a value within this (relative to max(1, |target|)) of a target meets it: float32 rounding


class Metric(NamedTuple):
    """A held-out metric: `goal` 'higher' or 'lower' is better; values lie in [low, high]."""

    name: str
    goal: str = "lower"
    low: float = -math.inf
    high: float = math.inf

    def validate(self) -> "Metric":
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Metric: name = {self.name!r} must be a non-empty string")
        if self.goal not in GOALS:
            raise ValueError(f"Metric {self.name!r}: goal = {self.goal!r} must be one of {GOALS}")
        if not (self.low < self.high) or math.isnan(self.low) or math.isnan(self.high):
            raise ValueError(f"Metric {self.name!r}: range [{self.low}, {self.high}] must have low < high")
        return self

    @property
    def higher_is_better(self) -> bool:
        return self.goal == "higher"

    def reached(self, values, target: float) -> np.ndarray:
        """Elementwise: whether each value meets `target` (>= for 'higher', <= for 'lower'),
        up to float32 rounding (metrics are computed in float32: 342/360 is stored as
        0.94999999, which meets a target of 0.95)."""
        v = np.asarray(values, np.float64)
        slack = REACH_RTOL * max(1.0, abs(float(target)))
        return v >= target - slack if self.higher_is_better else v <= target + slack

    def better(self, a: float, b: float) -> bool:
        """Whether value `a` is strictly better than value `b`."""
        return a > b if self.higher_is_better else a < b

    def check_target(self, target, what: str = "target") -> float:
        """`target` as a float if it lies in this metric's range, else ValueError naming `what`."""
        if isinstance(target, bool) or not isinstance(target, (int, float, np.integer, np.floating)):
            raise ValueError(f"{what} = {target!r} must be a number (a value of {self.name})")
        t = float(target)
        if not math.isfinite(t) or not self.low <= t <= self.high:
            raise ValueError(f"{what} = {target!r} is outside the range of {self.name} "
                             f"[{_fmt(self.low)}, {_fmt(self.high)}] ({self.goal} is better)")
        return t

    def to_json(self) -> list:
        return [self.goal, None if math.isinf(self.low) else self.low, None if math.isinf(self.high) else self.high]

    @classmethod
    def from_json(cls, name: str, value) -> "Metric":
        goal, low, high = value
        return cls(name, goal, -math.inf if low is None else float(low), math.inf if high is None else float(high))


def _fmt(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:g}"


KNOWN: dict[str, Metric] = {m.name: m for m in (
    Metric("loss", "lower", 0.0), Metric("accuracy", "higher", 0.0, 1.0), Metric("error", "lower", 0.0, 1.0),
    Metric("mse", "lower", 0.0), Metric("mae", "lower", 0.0), Metric("bits_per_byte", "lower", 0.0),
    Metric("perplexity", "lower", 1.0),
)}
"""Metrics whose direction and range are known by name (a task may declare others)."""


def get(name: str) -> Metric:
    """The known metric `name` (see KNOWN); ValueError for a name without a known direction."""
    if name not in KNOWN:
        raise ValueError(f"metric {name!r} has no known direction; declare it as "
                         f"Metric({name!r}, GOAL, LOW, HIGH) with GOAL 'higher' or 'lower' (e.g. "
                         f"Metric({name!r}, 'higher', 0.0, 1.0) for a fraction; known: {', '.join(KNOWN)})")
    return KNOWN[name]


def resolve(names, declared=None) -> tuple[Metric, ...]:
    """Metrics for `names`: each from `declared` (Metric values, or {name: Metric}) if
    given there, else from KNOWN."""
    if declared is None:
        table = {}
    elif isinstance(declared, dict):
        table = dict(declared)
    else:
        table = {m.name: m for m in declared}
    out = []
    for n in names:
        m = table.get(n)
        out.append((m if isinstance(m, Metric) else get(n)).validate())
    return tuple(out)


def find(metrics, name: str, task_name: str) -> Metric:
    """The metric called `name` among a task's `metrics` (ValueError naming the valid ones)."""
    for m in metrics:
        if m.name == name:
            return m
    raise ValueError(f"metric = {name!r} is not a metric of task {task_name!r}; "
                     f"valid: {', '.join(m.name for m in metrics)}")


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
