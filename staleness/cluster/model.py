"""The Cluster value: per-worker bases, stacked modifiers, and constructors (see :mod:`staleness.cluster`).

The terms (:mod:`staleness.cluster.bases`, :mod:`staleness.cluster.modifiers`) know their own sampler layer
and spec text; this module only checks arguments, stacks terms and builds samplers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from staleness.infra import checks
from staleness.infra.checks import format_number
from staleness.cluster.bases import Gpus, Seconds, Trace
from staleness.cluster.modifiers import (AllReduce, Chaos, Elastic, Failures, Jitter, Links, Network, Periodic, Server,
                                         Stragglers)
from staleness.cluster.network import ALGORITHMS, parse_bandwidth, parse_latency
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
    return checks.positive(fn, "bandwidth", value)


def _latency(fn: str, value) -> float:
    """Seconds from a number or a text with a unit ('5ms')."""
    if isinstance(value, str):
        return parse_latency(value, f"{fn}: latency")
    return checks.finite(fn, "latency", value, low=0.0)


@dataclass(frozen=True)
class Cluster:
    """An immutable speed model of ``num_workers`` workers (built as :mod:`staleness.cluster` shows).

    Attributes:
      num_workers: number of workers (>= 1).
      base: the per-worker mean speeds: a :class:`~staleness.cluster.bases.Seconds`,
        :class:`~staleness.cluster.bases.Gpus` or :class:`~staleness.cluster.bases.Trace`.
      modifiers: the stacked modifiers (:mod:`staleness.cluster.modifiers`), oldest first.
    """

    num_workers: int
    base: Seconds | Gpus | Trace
    modifiers: tuple = ()

    def __post_init__(self):
        n = {Seconds: lambda b: len(b.seconds), Gpus: lambda b: len(b.names),
             Trace: lambda b: len(b.seconds)}[type(self.base)](self.base)
        if n != self.num_workers or n < 1:
            raise ValueError(f"Cluster: num_workers = {self.num_workers!r} does not match "
                             f"the {n} workers of its base")

    # -- inspection ---------------------------------------------------------
    @property
    def mean_seconds(self) -> tuple[float, ...]:
        """Mean compute seconds per iteration of each worker, before modifiers."""
        b = self.base
        if isinstance(b, Seconds):
            return b.seconds
        if isinstance(b, Gpus):
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
    def with_modifier(self, modifier) -> Cluster:
        """This cluster with `modifier` on top of its stack: any frozen value with
        `describe()` (its text in the spec grammar) and `wrap(inner, seed, stream)`
        returning a `staleness.cluster.layers.Layer` (see `staleness.cluster.modifiers`;
        a new kind of layer is one such class)."""
        return dataclasses.replace(self, modifiers=self.modifiers + (modifier,))

    def jitter(self, sigma: float) -> Cluster:
        """Multiply every compute time by lognormal noise of mean 1.

        Args:
          sigma: standard deviation of the log of the factor (dimensionless,
            0 <= sigma <= 5); the factor is exp(N(-sigma^2/2, sigma^2)), so its
            mean is exactly 1 and the mean compute time is unchanged.
        """
        s = checks.finite("jitter", "sigma", sigma, low=0.0, high=_MAX_SIGMA)
        return self.with_modifier(Jitter(s))

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
        p = checks.finite(fn, "prob", prob, low=0.0, high=1.0)
        s = checks.finite(fn, "slowdown", slowdown, low=1.0)
        d = checks.positive(fn, "duration", duration)
        return self.with_modifier(Stragglers(p, s, d, checks.worker_ids(fn, workers, self.num_workers)))

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
        p = checks.positive(fn, "period", period)
        d = checks.finite(fn, "duration", duration, low=0.0, low_ok=False, high=p)
        s = checks.finite(fn, "slowdown", slowdown, low=1.0)
        ph = checks.finite(fn, "phase", phase)
        return self.with_modifier(Periodic(p, d, s, checks.worker_ids(fn, workers, self.num_workers), ph))

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
        return self.with_modifier(Network(checks.finite(fn, "push", push, low=0.0),
                                 checks.finite(fn, "pull", pull, low=0.0),
                                 checks.finite(fn, "jitter", jitter, low=0.0, high=_MAX_SIGMA)))

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
        Links stack in series (:mod:`staleness.cluster.network`).
        """
        fn = "links"
        return self.with_modifier(Links(_bandwidth(fn, bandwidth), _latency(fn, latency),
                               checks.worker_ids(fn, workers, self.num_workers)))

    def server(self, bandwidth: float | str, latency: float | str = 0.0) -> Cluster:
        """The parameter server's link, shared by every concurrent push and pull
        (processor sharing: :class:`~staleness.cluster.network.SharedLink`).

        Args:
          bandwidth: bytes per second (> 0), or a text such as '10gbps'.
          latency: seconds (>= 0, or a text such as '1ms') added to every push and pull.
        """
        fn = "server"
        if any(isinstance(m, Server) for m in self.modifiers):
            raise ValueError(f"{fn}: this cluster already has a server link; give one server() only")
        return self.with_modifier(Server(_bandwidth(fn, bandwidth), _latency(fn, latency)))

    def allreduce(self, algorithm: str, bandwidth: float | str, latency: float | str = 0.0) -> Cluster:
        """Synchronous rounds aggregate with an all-reduce instead of the server.

        A round's gradients all arrive when the all-reduce that starts at the
        end of its last computation finishes, and nobody pulls (every worker
        holds the reduced gradient); costs in :mod:`staleness.cluster.network`. Used by
        policies that aggregate every live worker's gradient per round (bsp, local_sgd,
        diloco); other policies on the same cluster push and pull point to point.

        Args:
          algorithm: 'ring' or 'tree'.
          bandwidth: bytes per second of each link of the collective (> 0), or a text such as '10gbps'.
          latency: seconds per step (>= 0), or a text such as '1ms'.
        """
        fn = "allreduce"
        if algorithm not in ALGORITHMS:
            raise ValueError(f"{fn}: algorithm = {algorithm!r} must be one of {', '.join(ALGORITHMS)}")
        if any(isinstance(m, AllReduce) for m in self.modifiers):
            raise ValueError(f"{fn}: this cluster already has an all-reduce model; give one allreduce() only")
        return self.with_modifier(AllReduce(algorithm, _bandwidth(fn, bandwidth), _latency(fn, latency)))

    def chaos(self, mtbf: float, repair: float, chips: int = 1, workers: Sequence[int] | None = None) -> Cluster:
        """Random chip failures (`modifiers.Chaos`): every worker is a learner of `chips` chips,
        each with a mean time between failures of `mtbf` seconds (exponential); a chip's failure
        takes its learner down for `repair` seconds, then it rejoins. Combines with the other
        layers' down intervals as a union; drawn from the cluster's seed, lazily."""
        fn = "chaos"
        m, r = checks.positive(fn, "mtbf", mtbf), checks.positive(fn, "repair", repair)
        checks.integer(fn, "chips", chips, low=1)
        return self.with_modifier(Chaos(m, r, int(chips), checks.worker_ids(fn, workers, self.num_workers)))

    def elastic(self, mtbf: float, repair: float, chips: int, slices: int, reconfig: float = 0.0,
                workers: Sequence[int] | None = None) -> Cluster:
        """Random chip failures in elastic learners (`modifiers.Elastic`): every worker is a
        learner of `chips` chips in `slices` slices, each chip with a mean time between failures
        of `mtbf` seconds; a chip's failure takes its slice out for `repair` seconds and the
        learner goes on at the rate of its live slices, stalled `reconfig` seconds at every
        slice's leave and rejoin. A data-parallel job that survives its slices' failures is
        one elastic learner of N chips."""
        fn = "elastic"
        m, r = checks.positive(fn, "mtbf", mtbf), checks.positive(fn, "repair", repair)
        checks.integer(fn, "chips", chips, low=1)
        checks.integer(fn, "slices", slices, low=1)
        if slices > chips:
            raise ValueError(f"{fn}: slices = {slices} must be <= chips = {chips} (at least a chip per slice)")
        c = checks.finite(fn, "reconfig", reconfig, low=0.0)
        return self.with_modifier(Elastic(m, r, int(chips), int(slices), c,
                                          checks.worker_ids(fn, workers, self.num_workers)))

    def failures(self, events: Iterable[tuple[int, float, float | None]]) -> Cluster:
        """Workers that fail and possibly rejoin.

        Args:
          events: iterable of ``(worker, fail_at, rejoin_at)``: the worker is
            gone from ``fail_at`` seconds until ``rejoin_at`` seconds
            (``None``: never rejoins). ``0 <= fail_at < rejoin_at``, both
            finite. A worker may fail several times, but within one call its
            down intervals must not overlap (it rejoins before it fails again).
        Each call is a layer of its own; layers combine as a union of down
        intervals (:mod:`staleness.cluster.membership`).
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
            wi = checks.worker_id(fn, f"events[{k}] worker", w, self.num_workers)
            fa = checks.finite(fn, f"events[{k}] fail_at", f, low=0.0)
            ra = None
            if r is not None:
                ra = checks.finite(fn, f"events[{k}] rejoin_at", r)
                if ra <= fa:
                    raise ValueError(f"{fn}: events[{k}] rejoin_at = {r!r} must be > "
                                     f"fail_at = {f!r} (or None: never rejoins)")
            new.append((wi, fa, ra))
        if not new:
            raise ValueError(f"{fn}: events is empty; give at least one (worker, fail_at, rejoin_at_or_None)")
        # Overlap check over this call's events; other layers' outages combine with these.
        by_worker: dict[int, list] = {}
        for e in new:
            by_worker.setdefault(e[0], []).append(e)
        for w, evs in by_worker.items():
            evs.sort(key=lambda e: e[1])
            for a, b in zip(evs, evs[1:]):
                end = math.inf if a[2] is None else a[2]
                if b[1] < end:
                    raise ValueError(
                        f"{fn}: worker {w} has overlapping down intervals "
                        f"[{format_number(a[1])}, {'never' if a[2] is None else format_number(a[2])}) and "
                        f"[{format_number(b[1])}, {'never' if b[2] is None else format_number(b[2])}); "
                        f"a worker must rejoin before it can fail again")
        return self.with_modifier(Failures(tuple(new)))

    # -- sampling -----------------------------------------------------------
    def sampler(self, seed: int) -> ClusterSampler:
        """A fresh :class:`ClusterSampler` drawing this cluster's times.

        Args:
          seed: integer >= 0; same seed gives identical times.
        """
        return ClusterSampler(self, checks.integer("Cluster.sampler", "seed", seed))


# ---------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------
def constant(num_workers: int, seconds: float = 1.0) -> Cluster:
    """``num_workers`` identical workers taking ``seconds`` (> 0) per iteration."""
    n = checks.integer("constant", "num_workers", num_workers, low=1)
    s = checks.positive("constant", "seconds", seconds)
    return Cluster(n, Seconds((s,) * n))


def heterogeneous(seconds: Sequence[float]) -> Cluster:
    """One worker per entry of ``seconds``: its mean seconds per iteration (> 0)."""
    fn = "heterogeneous"
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Iterable):
        raise ValueError(f"{fn}: seconds = {seconds!r} must be a sequence of numbers > 0")
    vals = list(seconds)
    if not vals:
        raise ValueError(f"{fn}: seconds is empty; need at least one worker")
    return Cluster(len(vals), Seconds(tuple(
        checks.positive(fn, f"seconds[{k}]", v) for k, v in enumerate(vals))))


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
            raise ValueError(f"{fn}: names[{k}] = {n!r} is not a known GPU; known: {', '.join(sorted(PRESETS))}")
        out.append(key)
    return Cluster(len(out), Gpus(tuple(out), checks.positive(fn, "seconds", seconds)))


def default() -> Cluster:
    """The README main job's cluster: 4 fast (1.0 s) and 4 slow (2.6 s) workers,
    the DSSP paper's GTX 1080 Ti : GTX 1060 throughput ratio."""
    return heterogeneous([1.0] * 4 + [2.6] * 4)

