"""ClusterSampler: the seeded, fast per-event times of a Cluster.

Random draws come in blocks of :data:`GROUP` workers x :data:`CHUNK`
iterations, each block from its own ``np.random.SeedSequence([seed, stream,
g, c])``; see :mod:`staleness.cluster` for the determinism contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from staleness.cluster.model import (
    Cluster,
    _Failures,
    _Jitter,
    _Network,
    _Periodic,
    _Seconds,
    _Stragglers,
    _Trace,
)

__all__ = ["CHUNK", "GROUP", "ClusterSampler"]

#: Iterations per pre-drawn random block (a power of two: index with shifts).
CHUNK = 64
#: Workers per pre-drawn random block (a power of two).
GROUP = 16
_CSHIFT, _CMASK = CHUNK.bit_length() - 1, CHUNK - 1
_GSHIFT, _GMASK = GROUP.bit_length() - 1, GROUP - 1


def _block_draw(seed: int, stream: int, group: int, chunk: int, kind: str,
                sigma: float) -> list[list[float]]:
    """[GROUP][CHUNK] values of one stream for one worker group and chunk."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream, group, chunk]))
    if kind == "lognormal":
        return rng.lognormal(-0.5 * sigma * sigma, sigma, (GROUP, CHUNK)).tolist()
    return rng.random((GROUP, CHUNK)).tolist()


class _Stream:
    """Random values of one stream, one per (worker, iteration).

    ``getter()(w, i)`` returns worker w's value for iteration i. Blocks are
    drawn on first use and cached, so access can be in any order.
    kind: "lognormal" (mean 1, log-sd sigma) or "uniform" ([0, 1)).
    """

    __slots__ = ("seed", "stream", "kind", "sigma", "cache")

    def __init__(self, seed: int, stream: int, num_workers: int, kind: str, sigma: float = 0.0):
        self.seed, self.stream, self.kind, self.sigma = seed, stream, kind, sigma
        # cache[g][c] = block of worker group g, chunk c
        self.cache: list[dict[int, list[list[float]]]] = [
            {} for _ in range((num_workers + GROUP - 1) // GROUP)]

    def getter(self) -> Callable[[int, int], float]:
        """A closure ``get(worker, iteration) -> value`` (closures beat bound
        methods in the hot path)."""
        cache, seed, stream, kind, sigma = self.cache, self.seed, self.stream, self.kind, self.sigma
        gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK

        def get(w: int, i: int) -> float:
            d = cache[w >> gs]
            ch = d.get(i >> cs)
            if ch is None:
                ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, kind, sigma)
            return ch[w & gm][i & cm]
        return get


def _jitter_op(st: _Stream) -> Callable:
    cache, seed, stream, sigma = st.cache, st.seed, st.stream, st.sigma
    gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK  # closure cells beat globals

    def op(w, i, s, t):
        d = cache[w >> gs]
        ch = d.get(i >> cs)
        if ch is None:
            ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, "lognormal", sigma)
        return t * ch[w & gm][i & cm]
    return op


def _straggler_op(st: _Stream, prob: float, slowdown: float, duration: float,
                  ends: list[float]) -> Callable:
    get = st.getter()

    def op(w, i, s, t):
        if s < ends[w]:
            return t * slowdown
        if get(w, i) < prob:
            ends[w] = s + duration
            return t * slowdown
        return t
    return op


def _periodic_op(period: float, duration: float, slowdown: float, phase: float) -> Callable:
    def op(w, i, s, t):
        # Python's float % has the sign of the divisor: the offset is in [0, period).
        return t * slowdown if (s - phase) % period < duration else t
    return op


class ClusterSampler:
    """Concrete, seeded times of one :class:`Cluster`; made by ``Cluster.sampler(seed)``.

    The simulator calls these once per event, so they are plain Python over
    pre-drawn blocks (about a microsecond per call). Arguments are not
    validated here: ``0 <= worker < num_workers`` and ``iteration >= 0`` are
    the caller's job.

    Attributes:
      num_workers: number of workers.
      cluster: the Cluster this sampler draws from.
      seed: the seed.
    """

    def __init__(self, cluster: Cluster, seed: int):
        self.cluster = cluster
        self.seed = seed
        self.num_workers = W = cluster.num_workers
        base = cluster.base
        ops: list[list[Callable]] = [[] for _ in range(W)]
        # (mean seconds, getter of the mean-1 lognormal factor or None)
        self._push: list[tuple[float, Callable[[int, int], float] | None]] = []
        self._pull: list[tuple[float, Callable[[int, int], float] | None]] = []
        events = []
        for k, m in enumerate(cluster.modifiers):
            stream = 16 * (k + 1)  # each modifier owns streams 16(k+1) .. 16(k+1)+15
            if isinstance(m, _Jitter):
                if m.sigma > 0.0:
                    op = _jitter_op(_Stream(seed, stream, W, "lognormal", m.sigma))
                    for w in range(W):
                        ops[w].append(op)
            elif isinstance(m, _Stragglers):
                if m.prob > 0.0 and m.slowdown > 1.0:
                    ends = [-math.inf] * W  # per worker: end time of its current episode
                    op = _straggler_op(_Stream(seed, stream, W, "uniform"),
                                       m.prob, m.slowdown, m.duration, ends)
                    for w in (range(W) if m.workers is None else m.workers):
                        ops[w].append(op)
            elif isinstance(m, _Periodic):
                if m.slowdown > 1.0:
                    op = _periodic_op(m.period, m.duration, m.slowdown, m.phase)
                    for w in (range(W) if m.workers is None else m.workers):
                        ops[w].append(op)
            elif isinstance(m, _Network):
                for lst, mean, sub in ((self._push, m.push, 0), (self._pull, m.pull, 1)):
                    if mean > 0.0:
                        get = (_Stream(seed, stream + sub, W, "lognormal", m.jitter).getter()
                               if m.jitter > 0.0 else None)
                        lst.append((mean, get))
            elif isinstance(m, _Failures):
                for w, f, r in m.events:
                    events.append((f, "fail", w))
                    if r is not None:
                        events.append((r, "join", w))
        # At equal times a join sorts before a fail (a worker that rejoins at t
        # and fails again at t is down throughout), then by worker id.
        events.sort(key=lambda e: (e[0], e[1] != "join", e[2]))
        self._events = events

        ops_t = [tuple(o) for o in ops]
        if isinstance(base, _Trace):
            traces = [list(t) for t in base.seconds]
            lengths = [len(t) for t in traces]

            def compute_time(worker: int, iteration: int, start: float) -> float:
                t = traces[worker][iteration % lengths[worker]]
                for op in ops_t[worker]:
                    t = op(worker, iteration, start, t)
                return t
        else:
            seconds = list(base.seconds if isinstance(base, _Seconds) else base.per_worker)
            if not any(ops_t):
                def compute_time(worker: int, iteration: int, start: float) -> float:
                    return seconds[worker]
            else:
                def compute_time(worker: int, iteration: int, start: float) -> float:
                    t = seconds[worker]
                    for op in ops_t[worker]:
                        t = op(worker, iteration, start, t)
                    return t
        # The per-instance closure shadows the documented method below; it
        # avoids attribute lookups in the simulator's hottest call.
        self.compute_time = compute_time

    def compute_time(self, worker: int, iteration: int, start: float) -> float:  # noqa: F811
        """Compute seconds (finite, > 0) of ``worker``'s ``iteration``.

        Args:
          worker: worker id, 0 <= worker < num_workers.
          iteration: the worker's iteration index (its clock), >= 0.
          start: simulated time in seconds at which the iteration starts;
            straggler episodes and periodic windows are decided from it. Query
            each worker's iterations in order of start time.
        """
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def push_delay(self, worker: int, iteration: int) -> float:
        """Seconds (>= 0) for ``worker``'s gradient of ``iteration`` to reach the server."""
        total = 0.0
        for mean, get in self._push:
            total += mean if get is None else mean * get(worker, iteration)
        return total

    def pull_delay(self, worker: int, iteration: int) -> float:
        """Seconds (>= 0) for the parameters pulled before ``iteration`` to reach ``worker``."""
        total = 0.0
        for mean, get in self._pull:
            total += mean if get is None else mean * get(worker, iteration)
        return total

    def membership_events(self) -> list[tuple[float, str, int]]:
        """``(time_seconds, 'fail' | 'join', worker)`` sorted by time (a new list)."""
        return list(self._events)

    def __repr__(self) -> str:
        return f"ClusterSampler({self.cluster.describe()!r}, seed={self.seed})"

