"""ClusterSampler: the seeded, fast per-event times of a Cluster.

The sampler queries the outermost of a stack of :mod:`~staleness.cluster.layers` and knows nothing of the
modifier types; the layers' down intervals combine here, lazily (:mod:`staleness.cluster.membership`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from staleness.cluster.layers import CHUNK, GROUP, Layer, elapsed
from staleness.cluster.membership import events as membership_changes
from staleness.cluster.network import allreduce_parts
from staleness.infra import checks

__all__ = ["CHUNK", "GROUP", "ClusterSampler"]


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
      layer: the outermost layer (its ``inner`` chain leads to the base).
      bandwidth: [W] bytes/s of each worker's own link (inf: unlimited).
      server: None, or (bandwidth bytes/s, latency s) of the server's shared link.
      allreduce: None, or (algorithm, bandwidth bytes/s, latency s) for synchronous rounds.
      partial: whether some compute runs below full rate (elastic learners: `useful`).
    """

    def __init__(self, cluster, seed: int):
        # cluster: a staleness.cluster.Cluster (not imported: the model module imports this one)
        self.cluster = cluster
        self.seed = seed
        self.num_workers = cluster.num_workers
        layer: Layer = cluster.base.layer()
        names: list[str] = []   # the layer (its spec text) that added each of layer.outages
        for k, m in enumerate(cluster.modifiers):
            # each modifier owns streams 16(k+1) .. 16(k+1)+15
            layer = m.wrap(layer, seed, 16 * (k + 1))
            if len(layer.outages) > len(names):
                names += [m.describe()] * (len(layer.outages) - len(names))
        self.layer = layer
        self.bandwidth = layer.bandwidth
        self.server = layer.server
        self.allreduce = layer.allreduce
        for o, name in zip(layer.outages, names):
            checks.worker_id(name, "Outages.worker", o.worker, self.num_workers)
            if not callable(o.intervals):
                raise TypeError(f"{name}: Outages.intervals = {o.intervals!r} must be a function returning a fresh "
                                "iterator of (fail_at, rejoin_at_or_None) seconds")
        self._outages, self._outage_layers = layer.outages, names
        self._endless = [name for o, name in zip(layer.outages, names) if o.endless]
        # The per-instance closures shadow the documented methods below; they
        # avoid attribute lookups in the simulator's hottest calls.
        self.compute_time = layer.compute_time
        self.push_delay = layer.push_latency
        self.pull_delay = layer.pull_latency
        self.useful = layer.useful
        self.partial = layer.useful is not elapsed   # some compute runs below full rate (`useful`)

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

    def useful(self, worker: int, start: float, end: float) -> float:  # noqa: F811
        """Seconds of ``worker``'s full-rate compute between ``start`` and ``end``: end − start,
        except for an elastic learner (`Cluster.elastic`) that lost slices or reconfigured."""
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def push_delay(self, worker: int, iteration: int) -> float:  # noqa: F811
        """Latency seconds (>= 0) of ``worker``'s push of ``iteration`` (every link on its path)."""
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def pull_delay(self, worker: int, iteration: int) -> float:  # noqa: F811
        """Latency seconds (>= 0) of the pull of parameters before ``worker``'s ``iteration``."""
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def transfer_time(self, worker: int, iteration: int, nbytes: float, direction: str = "push") -> float:
        """Seconds of one transfer of `nbytes` on ``worker``'s path when nothing else
        shares it: latency + nbytes / bandwidth (the bottleneck of the worker's link
        and, if there is one, the server's link).

        direction: 'push' (worker to server) or 'pull' (server to worker).
        """
        if direction not in ("push", "pull"):
            raise ValueError(f"transfer_time: direction = {direction!r} must be 'push' or 'pull'")
        lat = (self.push_delay if direction == "push" else self.pull_delay)(worker, iteration)
        bw = self.bandwidth[worker] if self.server is None else min(self.bandwidth[worker], self.server[0])
        return lat + nbytes / bw if nbytes and bw != math.inf else lat

    def allreduce_time(self, nbytes: float, participants: int) -> float:
        """Seconds of this cluster's all-reduce of `nbytes` over `participants` workers
        (ValueError if the cluster has no all-reduce model)."""
        if self.allreduce is None:
            raise ValueError(f"allreduce_time: cluster {self.cluster.describe()!r} has no all-reduce "
                             f"model; add one with .allreduce('ring', bandwidth) or '+allreduce=ring:10gbps'")
        algorithm, bw, lat = self.allreduce
        return sum(allreduce_parts(algorithm, nbytes, participants, bw, lat))

    def membership(self) -> Iterator[tuple[float, str | None, int]]:
        """The workers' membership changes, generated lazily in time order: an iterator of
        ``(time_seconds, 'fail' | 'join' | None, worker)`` (None: a boundary the union hides,
        for readers to skip; see :mod:`staleness.cluster.membership`)."""
        return membership_changes(self._outages, self.num_workers, self._outage_layers)

    def membership_events(self, until: float | None = None) -> list[tuple[float, str, int]]:
        """The changes of :meth:`membership` up to `until` seconds (None: all of them, for a
        cluster whose layers' outages all end), ``(time_seconds, 'fail' | 'join', worker)``
        in time order (a new list)."""
        if until is None and self._endless:
            raise ValueError(f"membership_events: until = None, but cluster {self.cluster.describe()!r} takes workers "
                             f"down without end ({', '.join(dict.fromkeys(self._endless))}); give until= (seconds) "
                             "or read the events lazily with membership()")
        end = math.inf if until is None else checks.finite("membership_events", "until", until)
        out = []
        for t, kind, w in self.membership():
            if t > end:
                break
            if kind is not None:
                out.append((t, kind, w))
        return out

    def __repr__(self) -> str:
        return f"ClusterSampler({self.cluster.describe()!r}, seed={self.seed})"
