"""The control plane's state: the workers' clocks, the live set, the round counters.

Deliberate deviation from "state is returned, never mutated": `SyncState` is
updated in place by the policy's methods. A persistent (copy-on-write) clock
table costs O(λ) per event, and the simulator must stay O(log λ) per event for
λ = 1024 workers. The mutation lives behind one small type, `ClockTable`
(clocks, live set, blocked workers, slowest/fastest clock in O(1) amortized);
the round counters and each gate's own state sit beside it.

Clock of a worker = number of gradients it has pushed, except that a worker
rejoining after a failure is fast-forwarded to the slowest live clock (it
restarts from the newest parameters, like a replacement worker); otherwise a
rejoining SSP worker would hold back every live worker.
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

__all__ = ["PushOutcome", "ClockTable", "SyncState"]


class PushOutcome(NamedTuple):
    """What the server does after a push, failure or join (a NamedTuple: cheap
    to build once per event).

    accepted: the gradient is kept (False only for a push that is dropped).
    update: apply one update now from all buffered accepted gradients.
    released: workers that may start their next iteration now.
    """

    accepted: bool
    update: bool
    released: tuple[int, ...]


class ClockTable:
    """The workers' clocks, the live set and the blocked workers (mutable, O(log λ) per event).

    `clocks[w]`, `live[w]`, `num_live`, `blocked[w]`, `min_clock` / `max_clock`
    (over live workers) are read by drivers and policies; only `Policy` methods
    change them. Blocked workers wait in a heap keyed by the gate level at which
    they may go on; live workers sit in insertion-ordered buckets per clock value,
    which give the slowest and fastest clocks in O(1) amortized.
    """

    __slots__ = ("num_workers", "clocks", "live", "num_live", "blocked", "_heap", "_buckets",
                 "min_clock", "max_clock", "max_gap")

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.clocks = [0] * num_workers          # [λ] pushes (fast-forwarded on rejoin)
        self.live = [True] * num_workers         # [λ]
        self.num_live = num_workers
        self.blocked = [False] * num_workers     # [λ] waiting at the gate
        self._heap: list[tuple[int, int]] = []   # (release level, worker); lazily pruned
        self._buckets: dict[int, dict[int, None]] = {0: dict.fromkeys(range(num_workers))}
        self.min_clock = 0
        self.max_clock = 0
        self.max_gap = 0                         # largest clock gap at any release

    def advance(self, worker: int) -> None:
        """`worker` pushed: its clock rises by one."""
        old = self.clocks[worker]
        self.clocks[worker] = old + 1
        bucket = self._buckets[old]
        del bucket[worker]
        self._buckets.setdefault(old + 1, {})[worker] = None
        if not bucket:
            del self._buckets[old]
            if old == self.min_clock:
                self._advance_min()
        if old + 1 > self.max_clock:
            self.max_clock = old + 1

    def _advance_min(self) -> None:
        if not self._buckets:
            return
        m = self.min_clock
        while m not in self._buckets:
            m += 1
        self.min_clock = m

    def remove(self, worker: int) -> None:
        """`worker` left the live set."""
        self.live[worker] = False
        self.num_live -= 1
        self.blocked[worker] = False
        clock = self.clocks[worker]
        bucket = self._buckets[clock]
        del bucket[worker]
        if not bucket:
            del self._buckets[clock]
            if not self._buckets:
                return
            if clock == self.min_clock:
                self._advance_min()
            if clock == self.max_clock:
                m = clock
                while m not in self._buckets:
                    m -= 1
                self.max_clock = m

    def insert(self, worker: int) -> None:
        """`worker` (re)joins the live set, fast-forwarded to the slowest live clock."""
        if self.num_live:
            self.clocks[worker] = max(self.clocks[worker], self.min_clock)
        self.live[worker] = True
        self.num_live += 1
        clock = self.clocks[worker]
        if not self._buckets:
            self.min_clock = self.max_clock = clock
        else:
            self.min_clock = min(self.min_clock, clock)
            self.max_clock = max(self.max_clock, clock)
        self._buckets.setdefault(clock, {})[worker] = None

    def slowest(self) -> int:
        """A live worker with the smallest clock (the longest-waiting one at it)."""
        return next(iter(self._buckets[self.min_clock]))

    def hold(self, worker: int, key: int) -> None:
        """Block `worker` until the gate's level reaches `key`."""
        self.blocked[worker] = True
        heapq.heappush(self._heap, (key, worker))

    def drain(self, level: int, released: list[int]) -> None:
        """Release every blocked live worker whose key is <= `level` (into `released`)."""
        heap = self._heap
        while heap and heap[0][0] <= level:
            _, w = heapq.heappop(heap)
            if self.blocked[w] and self.live[w]:
                self.blocked[w] = False
                released.append(w)

    def note_gaps(self, released: list[int]) -> None:
        for w in released:
            gap = self.clocks[w] - self.min_clock
            if gap > self.max_gap:
                self.max_gap = gap


class SyncState:
    """Control-plane state of one run: the clock table, the round counters and
    the gate's own state (DSSP's grants and push timestamps; None for the others).

    Public read-only attributes for drivers: `clocks`, `live`, `num_live`,
    `blocked`, `min_clock`, `max_clock`, `version` (updates applied),
    `buffered` (accepted gradients waiting for the next update), `dropped`,
    `rstar` (DSSP: list of (time, worker, r*)), `max_gap`, `completed`.

    `version` counts the updates decided (the buffered gradients became an update);
    `completed` the updates whose new parameters exist (`Policy.complete`). They
    are equal except while a learner trains (asynchronous RL: an update decided at
    t is trained until t + its learner time, and actors released meanwhile pull
    the last completed version); released workers pull version `completed`.
    """

    __slots__ = ("table", "version", "buffered", "dropped", "contributors", "live_contributors", "gate",
                 "completed")

    def __init__(self, num_workers: int, gate_state: Any = None):
        self.table = ClockTable(num_workers)
        self.version = 0
        self.completed = 0
        self.buffered = 0
        self.dropped = 0
        self.contributors: dict[int, None] = {}  # workers with a gradient in the buffer
        self.live_contributors = 0               # how many of them are live
        self.gate = gate_state

    # the clock table's fields, read by drivers
    num_workers = property(lambda self: self.table.num_workers)
    clocks = property(lambda self: self.table.clocks)
    live = property(lambda self: self.table.live)
    num_live = property(lambda self: self.table.num_live)
    blocked = property(lambda self: self.table.blocked)
    min_clock = property(lambda self: self.table.min_clock)
    max_clock = property(lambda self: self.table.max_clock)
    max_gap = property(lambda self: self.table.max_gap)

    @property
    def rstar(self) -> list:
        """(time, worker, r*) of each call of a gate's controller: a gate state that
        records them has a `rstar` list (DSSP's); the others have none."""
        return getattr(self.gate, "rstar", [])

    def slowest(self) -> int:
        return self.table.slowest()
