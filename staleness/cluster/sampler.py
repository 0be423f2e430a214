"""ClusterSampler: the seeded, fast per-event times of a Cluster.

The sampler is the outermost of a stack of :mod:`~staleness.cluster.layers`:
the cluster's base wrapped by each of its modifiers in order. It knows
nothing of the modifier types: each term of a :class:`Cluster` builds its
own layer (``base.layer()``, ``modifier.wrap(inner, seed, stream)``), so
adding a modifier touches one term and one layer function, not a dispatch here.
"""

from __future__ import annotations

import math

from staleness.cluster.layers import CHUNK, GROUP, Layer
from staleness.cluster.network import allreduce_parts

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
    """

    def __init__(self, cluster, seed: int):
        # cluster: a staleness.cluster.Cluster (not imported: the model module imports this one)
        self.cluster = cluster
        self.seed = seed
        self.num_workers = cluster.num_workers
        layer: Layer = cluster.base.layer()
        for k, m in enumerate(cluster.modifiers):
            # each modifier owns streams 16(k+1) .. 16(k+1)+15
            layer = m.wrap(layer, seed, 16 * (k + 1))
        self.layer = layer
        self.bandwidth = layer.bandwidth
        self.server = layer.server
        self.allreduce = layer.allreduce
        # At equal times a join sorts before a fail (a worker that rejoins at t
        # and fails again at t is down throughout), then by worker id.
        self._events = sorted(layer.events, key=lambda e: (e[0], e[1] != "join", e[2]))
        # The per-instance closures shadow the documented methods below; they
        # avoid attribute lookups in the simulator's hottest calls.
        self.compute_time = layer.compute_time
        self.push_delay = layer.push_latency
        self.pull_delay = layer.pull_latency

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
        bw = self.bandwidth[worker]
        if self.server is not None:
            bw = min(bw, self.server[0])
        return lat + nbytes / bw if nbytes and bw != math.inf else lat

    def allreduce_time(self, nbytes: float, participants: int) -> float:
        """Seconds of this cluster's all-reduce of `nbytes` over `participants` workers
        (ValueError if the cluster has no all-reduce model)."""
        if self.allreduce is None:
            raise ValueError(f"allreduce_time: cluster {self.cluster.describe()!r} has no all-reduce "
                             f"model; add one with .allreduce('ring', bandwidth) or '+allreduce=ring:10gbps'")
        algorithm, bw, lat = self.allreduce
        return sum(allreduce_parts(algorithm, nbytes, participants, bw, lat))

    def membership_events(self) -> list[tuple[float, str, int]]:
        """``(time_seconds, 'fail' | 'join', worker)`` sorted by time (a new list)."""
        return list(self._events)

    def __repr__(self) -> str:
        return f"ClusterSampler({self.cluster.describe()!r}, seed={self.seed})"
