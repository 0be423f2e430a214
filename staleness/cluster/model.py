"""The Cluster value: per-worker bases, stacked modifiers, and constructors.

A :class:`Cluster` is an immutable description (a base speed per worker plus a
stack of modifiers, oldest first); :meth:`Cluster.sampler` turns it into the
seeded :class:`~staleness.cluster.sampler.ClusterSampler`. The spec grammar
and the determinism contract are documented in :mod:`staleness.cluster`.

Each term knows its own behaviour: a base's ``layer()`` builds the bare
workers' sampler layer, a modifier's ``wrap(inner, seed, stream)`` wraps the
layer below it (see :mod:`staleness.cluster.layers`), and ``describe()``
writes the term back in the spec grammar.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from staleness.cluster import layers
from staleness.cluster._checks import _finite, _fmt, _fmt_workers, _int, _positive, _workers
from staleness.cluster.network import (
    ALGORITHMS,
    format_bandwidth,
    format_latency,
    parse_bandwidth,
    parse_latency,
)
from staleness.cluster.presets import PRESETS
from staleness.cluster.sampler import ClusterSampler

__all__ = ["Cluster", "constant", "default", "gpus", "heterogeneous"]

# Largest accepted lognormal sigma. With mean 1 the median is exp(-sigma^2/2);
# past sigma = 5 the median is below 4e-6 of the mean and draws can underflow
# to 0 s, which is no longer a model of anything physical.
_MAX_SIGMA = 5.0

def _bandwidth(fn: str, value) -> float:
    """Bytes per second from a number of bytes/s or a text with a unit ('1gbps')."""
    if isinstance(value, str):
        return parse_bandwidth(value, f"{fn}: bandwidth")
    return _positive(fn, "bandwidth", value)


def _latency(fn: str, value) -> float:
    """Seconds from a number or a text with a unit ('5ms')."""
    if isinstance(value, str):
        return parse_latency(value, f"{fn}: latency")
    return _finite(fn, "latency", value, low=0.0)


# ---------------------------------------------------------------------------
# Bases: the mean compute time of each worker before modifiers.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Seconds:
    seconds: tuple[float, ...]  # [W] mean seconds per iteration

    def describe(self) -> str:
        if all(s == 1.0 for s in self.seconds):
            return str(len(self.seconds))
        items = []
        i = 0
        while i < len(self.seconds):
            j = i
            while j + 1 < len(self.seconds) and self.seconds[j + 1] == self.seconds[i]:
                j += 1
            n = j - i + 1
            items.append(_fmt(self.seconds[i]) + (f"*{n}" if n > 1 else ""))
            i = j + 1
        text = ",".join(items)
        if len(items) == 1 and "*" not in text and "." not in text and "e" not in text:
            text += "*1"  # "3" alone would read back as constant(3)
        return text

    def layer(self) -> layers.Layer:
        return layers.base_layer(self.seconds)


@dataclass(frozen=True)
class _Gpus:
    names: tuple[str, ...]  # [W] preset names
    seconds: float  # seconds per iteration of the reference GPU (gtx1080ti)

    @property
    def per_worker(self) -> tuple[float, ...]:
        return tuple(self.seconds / PRESETS[n] for n in self.names)

    def describe(self) -> str:
        items = []
        i = 0
        while i < len(self.names):
            j = i
            while j + 1 < len(self.names) and self.names[j + 1] == self.names[i]:
                j += 1
            n = j - i + 1
            items.append(self.names[i] + (f"*{n}" if n > 1 else ""))
            i = j + 1
        text = ",".join(items)
        return text if self.seconds == 1.0 else f"{text}@{_fmt(self.seconds)}"

    def layer(self) -> layers.Layer:
        return layers.base_layer(self.per_worker)


@dataclass(frozen=True)
class _Trace:
    path: str
    seconds: tuple[tuple[float, ...], ...]  # [W][n_w] compute seconds by iteration

    def describe(self) -> str:
        return f"trace:{self.path}"

    def layer(self) -> layers.Layer:
        return layers.base_layer(traces=self.seconds)


# ---------------------------------------------------------------------------
# Modifiers
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Jitter:
    sigma: float

    def describe(self) -> str:
        return f"jitter={_fmt(self.sigma)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.jitter(inner, seed, stream, self.sigma)


@dataclass(frozen=True)
class _Stragglers:
    prob: float
    slowdown: float
    duration: float
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = f"stragglers={_fmt(self.prob)}:{_fmt(self.slowdown)}:{_fmt(self.duration)}"
        return text if self.workers is None else f"{text}:{_fmt_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.stragglers(inner, seed, stream, self.prob, self.slowdown, self.duration, self.workers)


@dataclass(frozen=True)
class _Periodic:
    period: float
    duration: float
    slowdown: float
    workers: tuple[int, ...] | None
    phase: float

    def describe(self) -> str:
        text = f"periodic={_fmt(self.period)}:{_fmt(self.duration)}:{_fmt(self.slowdown)}"
        if self.workers is None and self.phase == 0.0:
            return text
        text += ":" + ("all" if self.workers is None else _fmt_workers(self.workers))
        return text if self.phase == 0.0 else f"{text}:{_fmt(self.phase)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.periodic(inner, self.period, self.duration, self.slowdown, self.phase, self.workers)


@dataclass(frozen=True)
class _Network:
    push: float
    pull: float
    jitter: float

    def describe(self) -> str:
        text = f"network={_fmt(self.push)}:{_fmt(self.pull)}"
        return text if self.jitter == 0.0 else f"{text}:{_fmt(self.jitter)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.latency(inner, seed, stream, self.push, self.pull, self.jitter)


@dataclass(frozen=True)
class _Links:
    bandwidth: float  # bytes per second of each selected worker's link
    latency: float  # seconds added to each push and pull of those workers
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = f"net={format_bandwidth(self.bandwidth)}"
        if self.latency != 0.0 or self.workers is not None:
            text += f":{format_latency(self.latency)}"
        return text if self.workers is None else f"{text}:{_fmt_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.links(inner, self.bandwidth, self.latency, self.workers)


@dataclass(frozen=True)
class _Server:
    bandwidth: float  # bytes per second, shared by every concurrent push and pull
    latency: float  # seconds added to each push and pull

    def describe(self) -> str:
        text = f"server={format_bandwidth(self.bandwidth)}"
        return text if self.latency == 0.0 else f"{text}:{format_latency(self.latency)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.server(inner, self.bandwidth, self.latency)


@dataclass(frozen=True)
class _AllReduce:
    algorithm: str  # 'ring' or 'tree'
    bandwidth: float  # bytes per second of each link of the collective
    latency: float  # seconds per step of the collective

    def describe(self) -> str:
        text = f"allreduce={self.algorithm}:{format_bandwidth(self.bandwidth)}"
        return text if self.latency == 0.0 else f"{text}:{format_latency(self.latency)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.allreduce(inner, self.algorithm, self.bandwidth, self.latency)


@dataclass(frozen=True)
class _Failures:
    events: tuple[tuple[int, float, float | None], ...]  # (worker, fail_at, rejoin_at)

    def describe(self) -> str:
        parts = []
        for w, f, r in self.events:
            parts.append(f"{w}@{_fmt(f)}" + ("" if r is None else f"-{_fmt(r)}"))
        return "fail=" + ",".join(parts)

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.failures(inner, self.events)


# ---------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """An immutable speed model of ``num_workers`` workers.

    Build one with :func:`constant`, :func:`heterogeneous`, :func:`gpus`,
    :func:`from_trace_csv` or :func:`parse`, then stack modifiers with the
    methods below (each returns a new Cluster). Call :meth:`sampler` to draw
    concrete times.

    Attributes:
      num_workers: number of workers (>= 1).
      base: the per-worker mean speeds (internal representation).
      modifiers: the stacked modifiers, oldest first (internal representation).
    """

    num_workers: int
    base: _Seconds | _Gpus | _Trace
    modifiers: tuple = ()

    def __post_init__(self):
        n = {_Seconds: lambda b: len(b.seconds), _Gpus: lambda b: len(b.names),
             _Trace: lambda b: len(b.seconds)}[type(self.base)](self.base)
        if n != self.num_workers or n < 1:
            raise ValueError(f"Cluster: num_workers = {self.num_workers!r} does not match "
                             f"the {n} workers of its base")

    # -- inspection ---------------------------------------------------------
    @property
    def mean_seconds(self) -> tuple[float, ...]:
        """Mean compute seconds per iteration of each worker, before modifiers."""
        b = self.base
        if isinstance(b, _Seconds):
            return b.seconds
        if isinstance(b, _Gpus):
            return b.per_worker
        return tuple(math.fsum(t) / len(t) for t in b.seconds)

    def describe(self) -> str:
        """One line in the :func:`parse` grammar; ``parse(c.describe()) == c``
        (for a trace cluster, as long as the CSV file is still at its path)."""
        return "+".join([self.base.describe()] + [m.describe() for m in self.modifiers])

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        # The field-wise repr would print whole traces.
        return f"staleness.cluster.parse({self.describe()!r})"

    # -- composition --------------------------------------------------------
    def _add(self, mod) -> Cluster:
        return dataclasses.replace(self, modifiers=self.modifiers + (mod,))

    def jitter(self, sigma: float) -> Cluster:
        """Multiply every compute time by lognormal noise of mean 1.

        Args:
          sigma: standard deviation of the log of the factor (dimensionless,
            0 <= sigma <= 5); the factor is exp(N(-sigma^2/2, sigma^2)), so its
            mean is exactly 1 and the mean compute time is unchanged.
        """
        s = _finite("jitter", "sigma", sigma, low=0.0, high=_MAX_SIGMA)
        return self._add(_Jitter(s))

    def stragglers(self, prob: float, slowdown: float, duration: float,
                   workers: Sequence[int] | None = None) -> Cluster:
        """Transient straggler episodes.

        At the start of each iteration of a worker that is not already in an
        episode, an episode starts with probability ``prob`` and lasts
        ``duration`` seconds of simulated time; iterations that *start* inside
        an episode (including the one that started it) take ``slowdown`` times
        longer.

        Args:
          prob: per-iteration probability of starting an episode, in [0, 1].
          slowdown: compute-time factor inside an episode, finite and >= 1.
          duration: episode length in seconds, finite and > 0.
          workers: worker ids affected (default: all).
        """
        fn = "stragglers"
        p = _finite(fn, "prob", prob, low=0.0, high=1.0)
        s = _finite(fn, "slowdown", slowdown, low=1.0)
        d = _positive(fn, "duration", duration)
        return self._add(_Stragglers(p, s, d, _workers(fn, workers, self.num_workers)))

    def periodic(self, period: float, duration: float, slowdown: float,
                 workers: Sequence[int] | None = None, phase: float = 0.0) -> Cluster:
        """Deterministic periodic slowdowns (e.g. a co-located batch job).

        Iterations starting in ``[phase + k*period, phase + k*period + duration)``
        for any integer k take ``slowdown`` times longer.

        Args:
          period: seconds between window starts, finite and > 0.
          duration: window length in seconds, in (0, period].
          slowdown: compute-time factor inside a window, finite and >= 1.
          workers: worker ids affected (default: all).
          phase: start of the window k = 0, in seconds (any finite number).
        """
        fn = "periodic"
        p = _positive(fn, "period", period)
        d = _finite(fn, "duration", duration, low=0.0, low_ok=False, high=p)
        s = _finite(fn, "slowdown", slowdown, low=1.0)
        ph = _finite(fn, "phase", phase)
        return self._add(_Periodic(p, d, s, _workers(fn, workers, self.num_workers), ph))

    def network(self, push: float = 0.0, pull: float = 0.0, jitter: float = 0.0) -> Cluster:
        """Network latency for every worker: a latency-only link (no bandwidth limit).

        Args:
          push: seconds for a gradient to go from a worker to the server, >= 0.
          pull: seconds for parameters to go from the server to a worker, >= 0.
          jitter: lognormal sigma (mean-1 factor, as in :meth:`jitter`) applied
            independently to each push and pull, in [0, 5].
        Several ``network`` modifiers (and the latencies of :meth:`links` and
        :meth:`server`) add up.
        """
        fn = "network"
        return self._add(_Network(_finite(fn, "push", push, low=0.0),
                                  _finite(fn, "pull", pull, low=0.0),
                                  _finite(fn, "jitter", jitter, low=0.0, high=_MAX_SIGMA)))

    def links(self, bandwidth: float | str, latency: float | str = 0.0,
              workers: Sequence[int] | None = None) -> Cluster:
        """Each worker's own network link: a transfer of B bytes takes latency + B / bandwidth.

        Args:
          bandwidth: bytes per second (> 0), or a text with a unit such as
            '1gbps' (bits per second) or '125MB/s'.
          latency: seconds (>= 0) added to every push and pull, or a text such
            as '5ms' or '20us'.
          workers: worker ids with this link (default: all). Links of different
            speeds per worker: one ``links`` call per group of workers.
        Links stack in series: a worker under several has the smallest
        bandwidth and the sum of the latencies (the same for :meth:`network`'s
        latencies and the :meth:`server` link).
        """
        fn = "links"
        return self._add(_Links(_bandwidth(fn, bandwidth), _latency(fn, latency),
                                _workers(fn, workers, self.num_workers)))

    def server(self, bandwidth: float | str, latency: float | str = 0.0) -> Cluster:
        """The parameter server's link, shared by every concurrent push and pull.

        Concurrent transfers through it share its bandwidth by processor
        sharing (max-min fairly when their own links are slower than their
        share); the simulator re-times them whenever one starts or ends.

        Args:
          bandwidth: bytes per second (> 0), or a text such as '10gbps'.
          latency: seconds (>= 0, or a text such as '1ms') added to every push and pull.
        """
        fn = "server"
        if any(isinstance(m, _Server) for m in self.modifiers):
            raise ValueError(f"{fn}: this cluster already has a server link; give one server() only")
        return self._add(_Server(_bandwidth(fn, bandwidth), _latency(fn, latency)))

    def allreduce(self, algorithm: str, bandwidth: float | str, latency: float | str = 0.0) -> Cluster:
        """Synchronous rounds aggregate with an all-reduce instead of the server.

        A round's gradients all arrive when the all-reduce that starts at the
        end of its last computation finishes, and nobody pulls (every worker
        holds the reduced gradient). With λ participants and B bytes:
        ring 2(λ−1)/λ · B / bandwidth + 2(λ−1) · latency; tree 2 · ceil(log2 λ)
        · (latency + B / bandwidth). Used by policies that aggregate every live
        worker's gradient per round (bsp, local_sgd, diloco); other policies on
        the same cluster push and pull point to point.

        Args:
          algorithm: 'ring' or 'tree'.
          bandwidth: bytes per second of each link of the collective (> 0), or a text such as '10gbps'.
          latency: seconds per step (>= 0), or a text such as '1ms'.
        """
        fn = "allreduce"
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{fn}: algorithm = {algorithm!r} must be one of {', '.join(ALGORITHMS)}")
        if any(isinstance(m, _AllReduce) for m in self.modifiers):
            raise ValueError(f"{fn}: this cluster already has an all-reduce model; give one allreduce() only")
        return self._add(_AllReduce(algorithm, _bandwidth(fn, bandwidth), _latency(fn, latency)))

    def failures(self, events: Iterable[tuple[int, float, float | None]]) -> Cluster:
        """Workers that fail and possibly rejoin.

        Args:
          events: iterable of ``(worker, fail_at, rejoin_at)``: the worker is
            gone from ``fail_at`` seconds until ``rejoin_at`` seconds
            (``None``: never rejoins). ``0 <= fail_at < rejoin_at``, both
            finite. A worker may fail several times, but its down intervals
            (including those of earlier ``failures`` calls) must not overlap.
        The simulator reads them from :meth:`ClusterSampler.membership_events`.
        """
        fn = "failures"
        if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
            raise ValueError(f"{fn}: events = {events!r} must be an iterable of "
                             f"(worker, fail_at, rejoin_at_or_None) tuples")
        new = []
        for k, ev in enumerate(events):
            try:
                w, f, r = ev
            except (TypeError, ValueError):
                raise ValueError(f"{fn}: events[{k}] = {ev!r} must be a tuple "
                                 f"(worker, fail_at, rejoin_at_or_None)") from None
            try:
                if isinstance(w, bool):
                    raise TypeError
                wi = operator.index(w)
            except TypeError:
                wi = None
            if wi is None or not 0 <= wi < self.num_workers:
                raise ValueError(f"{fn}: events[{k}] worker = {w!r} is not a worker id; "
                                 f"valid ids are 0..{self.num_workers - 1}")
            fa = _finite(fn, f"events[{k}] fail_at", f, low=0.0)
            ra = None
            if r is not None:
                ra = _finite(fn, f"events[{k}] rejoin_at", r)
                if ra <= fa:
                    raise ValueError(f"{fn}: events[{k}] rejoin_at = {r!r} must be > "
                                     f"fail_at = {f!r} (or None: never rejoins)")
            new.append((wi, fa, ra))
        if not new:
            raise ValueError(f"{fn}: events is empty; give at least one "
                             f"(worker, fail_at, rejoin_at_or_None)")
        # Overlap check over this call's events and every earlier failures().
        old = [e for m in self.modifiers if isinstance(m, _Failures) for e in m.events]
        by_worker: dict[int, list] = {}
        for e in old + new:
            by_worker.setdefault(e[0], []).append(e)
        for w, evs in by_worker.items():
            evs.sort(key=lambda e: e[1])
            for a, b in zip(evs, evs[1:]):
                end = math.inf if a[2] is None else a[2]
                if b[1] < end:
                    raise ValueError(
                        f"{fn}: worker {w} has overlapping down intervals "
                        f"[{_fmt(a[1])}, {'never' if a[2] is None else _fmt(a[2])}) and "
                        f"[{_fmt(b[1])}, {'never' if b[2] is None else _fmt(b[2])}); "
                        f"a worker must rejoin before it can fail again")
        return self._add(_Failures(tuple(new)))

    # -- sampling -----------------------------------------------------------
    def sampler(self, seed: int) -> ClusterSampler:
        """A fresh :class:`ClusterSampler` drawing this cluster's times.

        Args:
          seed: integer >= 0; same seed gives identical times.
        """
        return ClusterSampler(self, _int("Cluster.sampler", "seed", seed))


# ---------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------
def constant(num_workers: int, seconds: float = 1.0) -> Cluster:
    """``num_workers`` identical workers taking ``seconds`` (> 0) per iteration."""
    n = _int("constant", "num_workers", num_workers, low=1)
    s = _positive("constant", "seconds", seconds)
    return Cluster(n, _Seconds((s,) * n))


def heterogeneous(seconds: Sequence[float]) -> Cluster:
    """One worker per entry of ``seconds``: its mean seconds per iteration (> 0)."""
    fn = "heterogeneous"
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Iterable):
        raise ValueError(f"{fn}: seconds = {seconds!r} must be a sequence of numbers > 0")
    vals = list(seconds)
    if not vals:
        raise ValueError(f"{fn}: seconds is empty; need at least one worker")
    return Cluster(len(vals), _Seconds(tuple(
        _positive(fn, f"seconds[{k}]", v) for k, v in enumerate(vals))))


def gpus(names: Sequence[str], seconds: float = 1.0) -> Cluster:
    """One worker per GPU name; worker i takes ``seconds / PRESETS[names[i]]``.

    Args:
      names: preset names (case-insensitive), one per worker; see :data:`PRESETS`.
      seconds: seconds per iteration of the reference GPU (gtx1080ti), > 0.
    """
    fn = "gpus"
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ValueError(f"{fn}: names = {names!r} must be a sequence of GPU names")
    vals = list(names)
    if not vals:
        raise ValueError(f"{fn}: names is empty; need at least one worker")
    out = []
    for k, n in enumerate(vals):
        key = n.strip().lower() if isinstance(n, str) else None
        if key not in PRESETS:
            raise ValueError(f"{fn}: names[{k}] = {n!r} is not a known GPU; "
                             f"known: {', '.join(sorted(PRESETS))}")
        out.append(key)
    return Cluster(len(out), _Gpus(tuple(out), _positive(fn, "seconds", seconds)))


def default() -> Cluster:
    """The README main job's cluster: 4 fast (1.0 s) and 4 slow (2.6 s) workers,
    the DSSP paper's GTX 1080 Ti : GTX 1060 throughput ratio."""
    return heterogeneous([1.0] * 4 + [2.6] * 4)

