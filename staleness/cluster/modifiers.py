"""Cluster modifiers (``Cluster.modifiers``, oldest first), each made and checked by the Cluster method of the
same name (lower case).

``wrap(inner, seed, stream)`` wraps the sampler layer below (:mod:`staleness.cluster.layers`), drawing any
randomness from its own ``stream`` numbers; ``describe()`` writes the modifier back in the spec grammar of
:mod:`staleness.cluster`. Units: seconds, and bytes per second for bandwidths.
"""

from __future__ import annotations

from dataclasses import dataclass

from staleness.infra.checks import format_number, format_workers
from staleness.cluster import layers
from staleness.cluster.network import format_bandwidth, format_latency

__all__ = ["AllReduce", "Chaos", "Elastic", "Failures", "Jitter", "Links", "Network", "Periodic", "Server", "Stragglers"]


@dataclass(frozen=True)
class Jitter:
    """Every compute time times exp(N(-sigma^2/2, sigma^2)), a factor of mean 1."""

    sigma: float

    def describe(self) -> str:
        return f"jitter={format_number(self.sigma)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.jitter(inner, seed, stream, self.sigma)


@dataclass(frozen=True)
class Stragglers:
    """Straggler episodes: an iteration starts one with probability ``prob``;
    iterations starting within ``duration`` seconds of it take ``slowdown``
    times longer. ``workers``: the ids affected, None for all."""

    prob: float
    slowdown: float
    duration: float
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = (f"stragglers={format_number(self.prob)}:{format_number(self.slowdown)}"
                f":{format_number(self.duration)}")
        return text if self.workers is None else f"{text}:{format_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.stragglers(inner, seed, stream, self.prob, self.slowdown, self.duration, self.workers)


@dataclass(frozen=True)
class Periodic:
    """Iterations starting in ``[phase + k*period, phase + k*period + duration)``
    take ``slowdown`` times longer. ``workers``: the ids affected, None for all."""

    period: float
    duration: float
    slowdown: float
    workers: tuple[int, ...] | None
    phase: float

    def describe(self) -> str:
        text = (f"periodic={format_number(self.period)}:{format_number(self.duration)}"
                f":{format_number(self.slowdown)}")
        if self.workers is None and self.phase == 0.0:
            return text
        text += ":" + ("all" if self.workers is None else format_workers(self.workers))
        return text if self.phase == 0.0 else f"{text}:{format_number(self.phase)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.periodic(inner, self.period, self.duration, self.slowdown, self.phase, self.workers)


@dataclass(frozen=True)
class Network:
    """Latency only, for every worker: ``push`` and ``pull`` seconds, each draw
    times a lognormal factor of mean 1 and sigma ``jitter``."""

    push: float
    pull: float
    jitter: float

    def describe(self) -> str:
        text = f"network={format_number(self.push)}:{format_number(self.pull)}"
        return text if self.jitter == 0.0 else f"{text}:{format_number(self.jitter)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.latency(inner, seed, stream, self.push, self.pull, self.jitter)


@dataclass(frozen=True)
class Links:
    """Each selected worker's own link: a transfer of B bytes takes
    ``latency + B / bandwidth``. ``workers``: the ids with this link, None for all."""

    bandwidth: float  # bytes per second of each selected worker's link
    latency: float  # seconds added to each push and pull of those workers
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = f"net={format_bandwidth(self.bandwidth)}"
        if self.latency != 0.0 or self.workers is not None:
            text += f":{format_latency(self.latency)}"
        return text if self.workers is None else f"{text}:{format_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.links(inner, self.bandwidth, self.latency, self.workers)


@dataclass(frozen=True)
class Server:
    """The server's link: its bandwidth is shared by every concurrent push and pull."""

    bandwidth: float  # bytes per second, shared by every concurrent push and pull
    latency: float  # seconds added to each push and pull

    def describe(self) -> str:
        text = f"server={format_bandwidth(self.bandwidth)}"
        return text if self.latency == 0.0 else f"{text}:{format_latency(self.latency)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.server(inner, self.bandwidth, self.latency)


@dataclass(frozen=True)
class AllReduce:
    """Synchronous rounds aggregate by a ring or tree all-reduce instead of the server."""

    algorithm: str  # 'ring' or 'tree'
    bandwidth: float  # bytes per second of each link of the collective
    latency: float  # seconds per step of the collective

    def describe(self) -> str:
        text = f"allreduce={self.algorithm}:{format_bandwidth(self.bandwidth)}"
        return text if self.latency == 0.0 else f"{text}:{format_latency(self.latency)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.allreduce(inner, self.algorithm, self.bandwidth, self.latency)


@dataclass(frozen=True)
class Failures:
    """Down intervals: each event ``(worker, fail_at, rejoin_at)`` takes the worker
    away from ``fail_at`` seconds until ``rejoin_at`` (None: for good). With other
    layers' down intervals they combine as a union (:mod:`staleness.cluster.membership`)."""

    events: tuple[tuple[int, float, float | None], ...]

    def describe(self) -> str:
        return "fail=" + ",".join(f"{w}@{format_number(f)}" + ("" if r is None else f"-{format_number(r)}")
                                  for w, f, r in self.events)

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.failures(inner, self.events)


@dataclass(frozen=True)
class Chaos:
    """Chip failures at scale (Decoupled DiLoCo's chaos engineering): every worker is a learner
    of ``chips`` chips, each failing with a mean time between failures of ``mtbf`` seconds;
    one chip's failure takes its learner down for ``repair`` seconds. ``workers``: the ids
    affected, None for all. A data-parallel job over N chips is one learner of N chips."""

    mtbf: float
    repair: float
    chips: int
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = f"chaos={format_number(self.mtbf)}:{format_number(self.repair)}:{self.chips}"
        return text if self.workers is None else f"{text}:{format_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.chaos(inner, seed, stream, self.mtbf, self.repair, self.chips, self.workers)


@dataclass(frozen=True)
class Elastic:
    """Elastic learners at scale: every worker is a learner of ``chips`` chips in ``slices``
    equal slices, each chip failing with a mean time between failures of ``mtbf`` seconds; a
    chip's failure takes its slice out for ``repair`` seconds while the learner goes on at
    the rate of its live slices, stalled ``reconfig`` seconds at each slice's leave and
    rejoin (`layers.elastic`). Nothing goes down; compute stretches, and goodput counts only
    the full-rate compute (`ClusterSampler.useful`). ``workers``: the ids affected, None for all."""

    mtbf: float
    repair: float
    chips: int
    slices: int
    reconfig: float
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = (f"elastic={format_number(self.mtbf)}:{format_number(self.repair)}:{self.chips}:{self.slices}"
                f":{format_number(self.reconfig)}")
        return text if self.workers is None else f"{text}:{format_workers(self.workers)}"

    def wrap(self, inner: layers.Layer, seed: int, stream: int) -> layers.Layer:
        return layers.elastic(inner, seed, stream, self.mtbf, self.repair, self.chips, self.slices, self.reconfig,
                              self.workers)
