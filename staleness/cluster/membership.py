"""Membership: when each worker is up, however many layers take it down.

A sampler layer that takes workers down adds one :class:`Outages` per worker it
affects to ``Layer.outages``, read lazily (a periodic layer needs no horizon).

Semantics: a worker is up only when every layer has it up. Its down time is
the union of the down intervals that all layers give it; ``rejoin_at`` None
means down for good from ``fail_at``. :func:`events` merges every layer's
intervals into the changes of membership, in time order across layers and
workers: ``(time, 'fail', worker)`` when the first layer takes the worker down
and ``(time, 'join', worker)`` when the last one lets it up. At equal times
joins come first, then workers by id: intervals that touch (one ends at t,
another starts at t, in one layer or two) give a join and then a fail at t.
A boundary that the union hides (a layer's fail or rejoin while another layer
holds the worker down) comes out as ``(time, None, worker)``, so that a reader
never waits past the time it has reached for the next change (two endless
layers can overlap so that a worker never comes back while neither says so);
readers skip it. Once a layer takes a worker down for good, nothing more of
that worker is read.

Intervals are checked as they are read (`_checked`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from staleness.infra.checks import format_number

__all__ = ["Outages", "events"]


class Outages(NamedTuple):
    """One layer's down intervals of one worker.

    Attributes:
      worker: the worker id.
      intervals: ``intervals()`` returns a fresh iterator of ``(fail_at, rejoin_at)``
        seconds (``rejoin_at`` None: down for good), in order of ``fail_at``.
      endless: True when that iterator never ends (e.g. a periodic preemption);
        such a cluster's events are read lazily (``ClusterSampler.membership()``),
        not listed whole.
    """

    worker: int
    intervals: Callable[[], Iterator[tuple[float, float | None]]]
    endless: bool = False


def _checked(layer: str, w: int, prev: float, interval) -> tuple[float, float | None]:
    """`interval` as (fail_at, rejoin_at) floats (0 <= fail_at < rejoin_at, both finite, fail_at >= `prev`),
    or a ValueError naming `layer`, `w` and it."""
    try:
        f, r = interval
        f = float(f)
        r = None if r is None else float(r)
    except (TypeError, ValueError):
        raise ValueError(f"{layer}: worker {w}'s down interval {interval!r} must be a pair "
                         "(fail_at, rejoin_at_or_None) of seconds") from None
    if not (math.isfinite(f) and f >= prev):
        raise ValueError(f"{layer}: worker {w}'s down interval {interval!r}: fail_at = {interval[0]!r} must be "
                         f"a finite number >= {format_number(prev)} (0, or the previous fail_at: in time order)")
    if r is not None and not (math.isfinite(r) and r > f):
        raise ValueError(f"{layer}: worker {w}'s down interval {interval!r}: rejoin_at = {interval[1]!r} must be "
                         f"a finite number > fail_at = {format_number(f)} (or None: down for good)")
    return f, r


def events(outages: Sequence[Outages], num_workers: int,
           layers: Sequence[str]) -> Iterator[tuple[float, str | None, int]]:
    """The membership changes of the union of `outages`, lazily, in time order.

    Args:
      outages: every layer's :class:`Outages`, their workers in ``0 .. num_workers - 1``.
      num_workers: number of workers.
      layers: each Outages' layer, as its spec text (named in errors).
    Yields ``(time_seconds, 'fail' | 'join' | None, worker)`` (None: a boundary
    the union hides; see the module docstring).
    """
    down = [0] * num_workers      # [W] layers holding each worker down now
    gone = [False] * num_workers  # [W] down for good
    # (time, 0 join | 1 fail, worker, tiebreak, outages index, rejoin_at or the fail_at of a join)
    heap: list = []
    tie = itertools.count()
    sources = [iter(o.intervals()) for o in outages]

    def read(k: int, prev: float) -> None:
        interval = next(sources[k], None)
        if interval is not None:
            w = outages[k].worker
            f, r = _checked(layers[k], w, prev, interval)
            heapq.heappush(heap, (f, 1, w, next(tie), k, r))

    for k in range(len(outages)):
        read(k, 0.0)
    while heap:
        t, fail, w, _, k, r = heapq.heappop(heap)
        if gone[w]:
            continue   # its outages are no longer read
        if fail:
            read(k, t)
            if r is None:
                gone[w] = True
            else:
                heapq.heappush(heap, (r, 0, w, next(tie), k, t))
            down[w] += 1
            yield t, ("fail" if down[w] == 1 else None), w
        else:
            down[w] -= 1
            yield t, ("join" if down[w] == 0 else None), w
