"""Validation and formatting helpers shared by the cluster modules.

Boundary checks: every failure is a ValueError that names the function, the
argument, the value and what would be valid. The formatters write numbers and
worker lists back in the spec grammar of :mod:`staleness.cluster`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np


def _number(fn: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{fn}: {name} = {value!r} must be a real number")
    return float(value)


def _finite(fn: str, name: str, value, *, low: float | None = None,
            low_ok: bool = True, high: float | None = None) -> float:
    """A finite float with optional bounds (low inclusive if low_ok)."""
    x = _number(fn, name, value)
    bad = not math.isfinite(x)
    if low is not None:
        bad = bad or (x < low if low_ok else x <= low)
    if high is not None:
        bad = bad or x > high
    if bad:
        parts = []
        if low is not None:
            parts.append(f"{'>=' if low_ok else '>'} {_fmt(low)}")
        if high is not None:
            parts.append(f"<= {_fmt(high)}")
        rng = " and ".join(parts)
        raise ValueError(f"{fn}: {name} = {value!r} must be a finite number"
                         + (f" {rng}" if rng else ""))
    return x


def _positive(fn: str, name: str, value) -> float:
    return _finite(fn, name, value, low=0.0, low_ok=False)


def _int(fn: str, name: str, value, *, low: int = 0) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        i = operator.index(value)
    except TypeError:
        raise ValueError(f"{fn}: {name} = {value!r} must be an integer >= {low}") from None
    if i < low:
        raise ValueError(f"{fn}: {name} = {value!r} must be an integer >= {low}")
    return i


def _workers(fn: str, workers, num_workers: int) -> tuple[int, ...] | None:
    """None (all workers) or a sorted tuple of distinct worker ids in range."""
    if workers is None:
        return None
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Iterable):
        raise ValueError(f"{fn}: workers = {workers!r} must be None (all workers) "
                         f"or a sequence of worker ids in 0..{num_workers - 1}")
    out = set()
    for k, w in enumerate(workers):
        try:
            if isinstance(w, bool):
                raise TypeError
            i = operator.index(w)
        except TypeError:
            i = None
        if i is None or not 0 <= i < num_workers:
            raise ValueError(f"{fn}: workers[{k}] = {w!r} is not a worker id; "
                             f"valid ids are 0..{num_workers - 1}")
        out.add(i)
    if not out:
        raise ValueError(f"{fn}: workers = {workers!r} is empty; pass None for all "
                         f"workers or at least one id in 0..{num_workers - 1}")
    return tuple(sorted(out))


def _fmt(x: float) -> str:
    """Shortest text that parses back to exactly x ("100" for 100.0)."""
    r = repr(float(x)).replace("e+", "e")  # '+' separates modifiers in a spec
    return r[:-2] if r.endswith(".0") else r


def _fmt_workers(workers: tuple[int, ...]) -> str:
    parts = []
    i = 0
    while i < len(workers):
        j = i
        while j + 1 < len(workers) and workers[j + 1] == workers[j] + 1:
            j += 1
        parts.append(str(workers[i]) if i == j else f"{workers[i]}-{workers[j]}")
        i = j + 1
    return ",".join(parts)

