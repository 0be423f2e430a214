"""Argument validators shared by the whole package, and the number formats their messages use.

Every public entry point checks its arguments at the boundary with these, so that a bad value fails at once,
and the same kind of argument is accepted (and rejected with the same words) everywhere:

- the ``fn``-prefixed validators (:func:`number`, :func:`finite`,
  :func:`positive`, :func:`integer`, :func:`worker_id`, :func:`worker_ids`)
  raise ``ValueError("{fn}: {name} = {value!r} must be ...")``: the function,
  the argument, the value and what would be valid;
- :func:`learning_rate` and :func:`positive_int` check the keyword arguments
  of the training entry points, whose messages name the argument only
  (``lr = 0 must be ...``).

Each validator returns the value normalised, so a caller writes ``x = checks.positive(fn, "x", x)``.
The messages are part of the interface: tests and users match them.

:func:`format_number` and :func:`format_workers` write numbers and worker
lists the way the spec grammars read them back (``"100"``, ``"0-3,6"``).

Pure Python and NumPy; nothing here imports JAX (the control plane, e.g.
:mod:`staleness.cluster`, uses it and must start fast).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np

__all__ = ["ArgumentError", "at_least", "distinct", "finite", "format_number", "format_workers", "integer",
           "learning_rate", "number", "number_at_least", "positive", "positive_int", "seconds", "worker_id",
           "worker_ids"]


class ArgumentError(ValueError):
    """A bad argument, as structured data: `name` (the keyword argument), `value`, and
    `must` (what would be valid), optionally `where` (the function). Its text is
    "[where: ]name = value must ..."; the command line renders the same fields with
    the flag the argument came from (``--max-time = -1 must ...``), so no layer
    rewrites another's message."""

    def __init__(self, name: str, value, must: str, where: str | None = None):
        self.name, self.value, self.must, self.where = name, value, must, where
        super().__init__(self.render(name))

    def render(self, name: str) -> str:
        """The message with the argument called `name` (e.g. its command-line flag)."""
        return f"{self.where + ': ' if self.where else ''}{name} = {self.value!r} {self.must}"


def number(fn: str, name: str, value) -> float:
    """``value`` as a float if it is a real number (a Python or NumPy int or
    float, not a bool); it may be inf or nan: :func:`finite` rules those out."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{fn}: {name} = {value!r} must be a real number")
    return float(value)


def finite(fn: str, name: str, value, *, low: float | None = None,
           low_ok: bool = True, high: float | None = None) -> float:
    """``value`` (a real number, see :func:`number`) as a finite float within ``low`` (inclusive if ``low_ok``,
    the default) and ``high`` (inclusive); None: no bound. The message names ``fn`` and ``name`` and states
    the bounds, e.g. ``"must be a finite number >= 1"``."""
    x = number(fn, name, value)
    bad = not math.isfinite(x)
    if low is not None:
        bad = bad or (x < low if low_ok else x <= low)
    if high is not None:
        bad = bad or x > high
    if bad:
        parts = []
        if low is not None:
            parts.append(f"{'>=' if low_ok else '>'} {format_number(low)}")
        if high is not None:
            parts.append(f"<= {format_number(high)}")
        rng = " and ".join(parts)
        raise ValueError(f"{fn}: {name} = {value!r} must be a finite number"
                         + (f" {rng}" if rng else ""))
    return x


def positive(fn: str, name: str, value) -> float:
    """``value`` as a finite float > 0 (a duration, a rate, a bandwidth)."""
    return finite(fn, name, value, low=0.0, low_ok=False)


def _index(value) -> int | None:
    """``operator.index(value)`` (int, NumPy integer; not a bool, nor a float even if integral), else None."""
    try:
        return None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        return None


def integer(fn: str, name: str, value, *, low: int = 0) -> int:
    """``value`` as an int >= ``low``: anything with ``__index__`` (see :func:`_index`)."""
    i = _index(value)
    if i is None or i < low:
        raise ValueError(f"{fn}: {name} = {value!r} must be an integer >= {low}")
    return i


def at_least(name: str, value, low: int, *, allow_none: bool = False, what: str = "") -> int | None:
    """``value`` as an int >= ``low`` (a Python or NumPy int, not a bool); None passes
    with ``allow_none``. ``what`` follows the bound in the message (" (updates)")."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ArgumentError(name, value, f"must be an integer >= {low}{what}")
    return int(value)


def number_at_least(name: str, value, low: float, *, strict: bool = False) -> float:
    """``value`` as a finite float >= ``low`` (> ``low`` when ``strict``): a Python or
    NumPy int or float, not a bool (``backward_ratio = 0 must be a finite number > 0``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or (value <= low if strict else value < low):
        raise ArgumentError(name, value, f"must be a finite number {'>' if strict else '>='} {format_number(low)}")
    return float(value)


def seconds(name: str, value, *, allow_none: bool = False) -> float | None:
    """``value`` as a finite float > 0 of seconds; None passes with ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ArgumentError(name, value, "must be a finite number of seconds > 0")
    return float(value)


def positive_int(name: str, value) -> int:
    """``value`` as an int >= 1 (a Python or NumPy int, not a bool), for a
    keyword argument such as ``num_batches`` or ``eval_every``; the message
    names the argument only: ``"num_batches = 0 must be an integer >= 1"``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(name, value, "must be an integer >= 1")
    return int(value)


def learning_rate(value, allow_none: bool = False) -> float | None:
    """``value`` as a float learning rate: a finite Python or NumPy float, or a
    Python int, > 0 (not a bool). With ``allow_none``, None passes through
    (the optimizer's or the task's own rate applies)."""
    if value is None and allow_none:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value)
            or value <= 0):
        raise ArgumentError("lr", value, "must be a finite number > 0 (the learning rate)")
    return float(value)


def worker_id(fn: str, name: str, value, num_workers: int) -> int:
    """``value`` as an int worker id in ``0 .. num_workers - 1`` (see :func:`_index`)."""
    i = _index(value)
    if i is None or not 0 <= i < num_workers:
        raise ValueError(f"{fn}: {name} = {value!r} is not a worker id; valid ids are 0..{num_workers - 1}")
    return i


def worker_ids(fn: str, workers, num_workers: int) -> tuple[int, ...] | None:
    """A selection of workers: None (all workers) stays None; otherwise a
    non-empty iterable of worker ids (see :func:`worker_id`), returned as a
    sorted tuple without repeats. The argument is named ``workers`` in messages."""
    if workers is None:
        return None
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Iterable):
        raise ValueError(f"{fn}: workers = {workers!r} must be None (all workers) "
                         f"or a sequence of worker ids in 0..{num_workers - 1}")
    out = {worker_id(fn, f"workers[{k}]", w, num_workers) for k, w in enumerate(workers)}
    if not out:
        raise ValueError(f"{fn}: workers = {workers!r} is empty; pass None for all "
                         f"workers or at least one id in 0..{num_workers - 1}")
    return tuple(sorted(out))


def distinct(fn: str, name: str, values) -> None:
    """ValueError naming the repeated entries of `values` (their str): a repeated run of a
    sweep or comparison would count as an independent sample in medians and intervals."""
    values = [str(v) for v in values]
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{fn}: {name} repeats {', '.join(repeated)}; give each once (a repeated run is not "
                         "another sample)")


def format_number(x: float) -> str:
    """The shortest text that parses back to exactly ``float(x)``: ``"100"``
    for 100.0, ``"2.5"``, ``"1e-05"``, ``"1e20"`` (no ``'+'``, which separates
    modifiers in a cluster spec)."""
    r = repr(float(x)).replace("e+", "e")
    return r[:-2] if r.endswith(".0") else r


def format_workers(workers: Iterable[int]) -> str:
    """Sorted, distinct worker ids as ranges: ``(0, 1, 2, 3, 6)`` -> ``"0-3,6"``
    (the WORKERS syntax of the cluster spec grammar)."""
    workers = tuple(workers)
    parts = []
    i = 0
    while i < len(workers):
        j = i
        while j + 1 < len(workers) and workers[j + 1] == workers[j] + 1:
            j += 1
        parts.append(str(workers[i]) if i == j else f"{workers[i]}-{workers[j]}")
        i = j + 1
    return ",".join(parts)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
