"""Synchronization policies: when a worker may start, when the server updates.

A policy is a small immutable value composed of two parts, each with its own
small state (in the spirit of optax's transformations):

- a **gate** decides when a worker may start its next iteration:
  `Free` (never blocks: ASP, softsync), `ClockBound(s)` (no worker more than s
  clocks ahead of the slowest live one: SSP, and BSP's barrier at s = 0),
  `DynamicBound(s_low, r_max, cap)` (DSSP: `ClockBound(s_low)` plus the
  synchronization controller, whose grants and push timestamps are its state),
  `RoundBound()` (backup workers: a worker that pushed on time waits for its
  round's update);
- an **aggregation** decides which gradients the server keeps and when it
  applies an update: `EachGradient` (ASP, SSP, DSSP), `AllLive` (BSP: every
  live worker's gradient of the round), `Count(n)` (Rudra n-softsync: floor(λ/n)
  gradients from any workers), `FirstOfRound(b)` (backup workers: the first
  λ − b gradients of a round; late ones are dropped).

    ssp(3)          == Policy(ClockBound(3), EachGradient(), ...)
    bsp()           == Policy(ClockBound(0), AllLive(), ...)
    dssp(3, 12)     == Policy(DynamicBound(3, 12), EachGradient(), ...)
    softsync(4)     == Policy(Free(), Count(4), ...)
    backup_workers(1) == Policy(RoundBound(), FirstOfRound(1), ...)

The driver protocol, identical for the simulator and the real runtime (both
call it through `staleness.driver`)::

    state = policy.init(num_workers, now)          # every worker may start iteration 0
    out = policy.push(state, worker, pull_version, now)
    #   out.accepted: keep the gradient (False: dropped, e.g. a late backup-worker gradient)
    #   out.update:   apply one update now from every accepted gradient buffered
    #                 since the last update (this one included); the version rises by one
    #   out.released: workers that may start their next iteration now; each pulls
    #                 the current version
    out = policy.fail(state, worker, now)          # a worker died; its in-flight gradient is lost
    out = policy.join(state, worker, now)          # a worker (re)joins and pulls the newest version

Time is always passed in (simulated seconds, or the runtime's
`time.monotonic()`); nothing here reads a clock, draws a random number or
touches parameters.

Deliberate deviation from "state is returned, never mutated": `SyncState` is
updated in place by these methods. A persistent (copy-on-write) clock table
costs O(λ) per event, and the simulator must stay O(log λ) per event for
λ = 1024 workers. The mutation lives behind one small type, `ClockTable`
(clocks, live set, blocked workers, slowest/fastest clock in O(1) amortized);
the round counters and each gate's own state sit beside it.

Clock of a worker = number of gradients it has pushed, except that a worker
rejoining after a failure is fast-forwarded to the slowest live clock (it
restarts from the newest parameters, like a replacement worker); otherwise a
rejoining SSP worker would hold back every live worker.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any, NamedTuple

__all__ = [
    "Policy", "PushOutcome", "SyncState", "ClockTable",
    "Free", "ClockBound", "DynamicBound", "RoundBound",
    "EachGradient", "AllLive", "Count", "FirstOfRound", "Gradient", "LocalSteps", "Streaming",
    "bsp", "asp", "ssp", "dssp", "softsync", "backup_workers", "local_sgd", "diloco", "async_diloco",
    "streaming_diloco",
    "dssp_controller", "parse",
]


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
    `rstar` (DSSP: list of (time, worker, r*)), `max_gap`.
    """

    __slots__ = ("table", "version", "buffered", "dropped", "contributors", "live_contributors", "gate")

    def __init__(self, num_workers: int, gate_state: Any = None):
        self.table = ClockTable(num_workers)
        self.version = 0
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
        return self.gate.rstar if isinstance(self.gate, _DynamicState) else []

    def slowest(self) -> int:
        return self.table.slowest()


def _check_int(owner: str, arg: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner}: {arg} = {value!r} must be an integer >= {low}")


# -- gates ---------------------------------------------------------------------------------------
# A gate: `init(num_workers, now)` -> its own state (or None); `level(state)` the
# value blocked keys are compared with; `after_push(state, w, pull_version, now)`
# None to release w now, else the level key to block it on; `on_join(state, w)`
# the same for a (re)joining worker; `pushed/failed/joined` keep its own state;
# `bound()` the largest clock gap at the start of an iteration (None: unbounded).
@dataclasses.dataclass(frozen=True)
class Free:
    """Never blocks (ASP, softsync)."""

    def init(self, num_workers, now):
        return None

    def level(self, state):
        return state.table.min_clock

    def after_push(self, state, worker, pull_version, now):
        return None

    def on_join(self, state, worker):
        return None

    def pushed(self, state, worker, now):
        pass

    def failed(self, state, worker):
        pass

    def joined(self, state, worker, now):
        pass

    def bound(self):
        return None


@dataclasses.dataclass(frozen=True)
class ClockBound(Free):
    """A worker more than `s` clocks ahead of the slowest live worker waits (SSP;
    s = 0 is BSP's barrier). A (re)joining worker passes the same gate: one that
    pushed into a round before it died waits for that round like everyone else."""

    s: int = 3

    def after_push(self, state, worker, pull_version, now):
        return self.on_join(state, worker)

    def on_join(self, state, worker):
        key = state.table.clocks[worker] - self.s
        return None if key <= state.table.min_clock else key

    def bound(self):
        return self.s


class _DynamicState:
    """DSSP's own state: grants r[i], the last two push times A[i][-1], A[i][-2], r* calls."""

    __slots__ = ("grants", "last_push", "prev_push", "rstar")

    def __init__(self, num_workers: int, now: float):
        self.grants = [0] * num_workers
        self.last_push = [now] * num_workers     # the start time counts as a push
        self.prev_push = [math.nan] * num_workers
        self.rstar: list[tuple[float, int, int]] = []


def dssp_controller(fast_last: float, fast_prev: float, slow_last: float, slow_prev: float, r_max: int) -> int:
    """DSSP synchronization controller (our reading of the paper, PAPERS.md).

    From the last two push timestamps (seconds) of the fastest worker
    (`fast_*`) and of the slowest (`slow_*`), estimate their iteration lengths
    I_f and I_s; predict the fast worker's pushes F_k = fast_last + k·I_f
    (k = 0..r_max) and the slowest's S_j = slow_last + j·I_s (j >= 1); return
    r* = argmin_k min_j |F_k − S_j| (smallest k on ties): the number of extra
    iterations after which the fast worker's push lands closest to a push of
    the slowest, so that it then waits least. Returns 0 without enough history.
    """
    i_f = fast_last - fast_prev
    i_s = slow_last - slow_prev
    if not (i_f > 0 and i_s > 0):  # also false for NaN (fewer than two stamps)
        return 0
    best_k, best_d = 0, math.inf
    for k in range(r_max + 1):
        f = fast_last + k * i_f
        j = max(1, round((f - slow_last) / i_s))
        d = abs(f - (slow_last + j * i_s))
        if j > 1:
            d = min(d, abs(f - (slow_last + (j - 1) * i_s)))
        if d < best_d:
            best_k, best_d = k, d
    return best_k


@dataclasses.dataclass(frozen=True)
class DynamicBound(Free):
    """DSSP (Zhao et al., ICDCS 2019): `ClockBound(s_low)` plus the controller.

    On a push from p: if p holds granted iterations it uses one and goes on;
    else if it is within s_low of the slowest it goes on; else if it is the
    fastest the controller grants r* extra iterations (recorded in
    `SyncState.rstar`); else it blocks until within s_low.

    cap=True: r* is clipped so that no iteration starts more than
    s_U = s_low + r_max clocks ahead of the slowest (the paper's "threshold in
    (s_L, s_U)"). cap=False: the literal server loop, which asks the
    controller again each time a grant is used up, so repeated grants can let
    the gap drift past s_U (closer to ASP, which the paper reports DSSP
    resembles in speed).
    """

    s_low: int = 3
    r_max: int = 12
    cap: bool = True

    def init(self, num_workers, now):
        return _DynamicState(num_workers, now)

    def pushed(self, state, worker, now):
        g = state.gate
        g.prev_push[worker] = g.last_push[worker]
        g.last_push[worker] = now

    def failed(self, state, worker):
        state.gate.grants[worker] = 0

    def joined(self, state, worker, now):
        state.gate.last_push[worker] = now
        state.gate.prev_push[worker] = math.nan

    def after_push(self, state, worker, pull_version, now):
        t, g = state.table, state.gate
        gap = t.clocks[worker] - t.min_clock
        if g.grants[worker] > 0:
            if not self.cap or gap <= self.s_low + self.r_max:
                g.grants[worker] -= 1
                return None
            g.grants[worker] = 0
        if gap <= self.s_low:
            return None
        if t.clocks[worker] == t.max_clock:
            slow = t.slowest()
            r = dssp_controller(g.last_push[worker], g.prev_push[worker], g.last_push[slow], g.prev_push[slow],
                                self.r_max)
            if self.cap:
                r = max(0, min(r, self.s_low + self.r_max - gap + 1))
            g.rstar.append((now, worker, r))
            if r > 0:
                g.grants[worker] = r - 1
                return None
        return t.clocks[worker] - self.s_low

    def on_join(self, state, worker):
        key = state.table.clocks[worker] - self.s_low
        return None if key <= state.table.min_clock else key

    def bound(self):
        return self.s_low + self.r_max if self.cap else None


@dataclasses.dataclass(frozen=True)
class RoundBound(Free):
    """A worker whose gradient was on time for its round waits for the round's
    update; a late one starts again at once on the newest version (backup workers).
    Its level is the server version, not a clock."""

    def level(self, state):
        return state.version

    def after_push(self, state, worker, pull_version, now):
        key = pull_version + 1
        return None if key <= state.version else key


# -- aggregations ----------------------------------------------------------------------------------
# An aggregation: `accepts(state, w, pull_version)` keep the gradient or drop it;
# `due(state)` whether the buffered gradients make an update now; `size(num_live,
# num_workers)` gradients per update; `validate(num_workers)` policy-specific checks.
@dataclasses.dataclass(frozen=True)
class EachGradient:
    """Every gradient is one update, applied on arrival (ASP, SSP, DSSP)."""

    def accepts(self, state, worker, pull_version):
        return True

    def due(self, state):
        return state.buffered >= 1

    def size(self, num_live, num_workers):
        return 1

    def validate(self, num_workers):
        pass


@dataclasses.dataclass(frozen=True)
class AllLive(EachGradient):
    """One update per round from every live worker's gradient (BSP). A worker that
    dies after pushing still counts its gradient; one that dies before pushing is
    no longer waited for."""

    def due(self, state):
        return state.live_contributors >= state.table.num_live

    def size(self, num_live, num_workers):
        return num_live


@dataclasses.dataclass(frozen=True)
class Count(EachGradient):
    """Rudra n-softsync: an update after c = floor(λ/n) gradients from any workers
    (the same worker may contribute several). n = λ is plain async; n = 1 is not
    hardsync (no barrier)."""

    n: int = 1

    def due(self, state):
        return state.buffered >= state.table.num_workers // self.n

    def size(self, num_live, num_workers):
        return num_workers // self.n

    def validate(self, num_workers):
        if self.n > num_workers:
            raise ValueError(
                f"softsync: n = {self.n} must be <= the number of workers ({num_workers}); "
                "c = floor(workers / n) gradients per update must be >= 1")


@dataclasses.dataclass(frozen=True)
class FirstOfRound(EachGradient):
    """Synchronous SGD with b backup workers (Chen et al. 2016): round k collects
    gradients computed on version k; the update fires after the first (live − b);
    gradients computed on an older version arrive late and are dropped (counted in
    `SyncState.dropped`)."""

    b: int = 1

    def accepts(self, state, worker, pull_version):
        return pull_version == state.version

    def due(self, state):
        return state.buffered >= max(1, state.table.num_live - self.b)

    def size(self, num_live, num_workers):
        return max(1, num_live - self.b)

    def validate(self, num_workers):
        if self.b >= num_workers:
            raise ValueError(f"backup_workers: b = {self.b} must be < the number of workers ({num_workers})")


# -- work: what a worker computes per iteration ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Gradient:
    """One minibatch gradient per iteration (the papers' parameter-server family)."""

    def steps_per_worker(self, mean_seconds) -> tuple[int, ...] | None:
        return None

    def describe(self) -> str:
        return ""


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """`steps` inner optimizer steps per iteration on the worker's own copy of the
    parameters (started from the version it pulled), then a push of the delta
    Δ = θ_pulled − θ_after, which the server treats as a gradient (an outer step).
    The worker's inner-optimizer state is kept across its iterations.

    dynamic: Dynamic Local Updates (Liu et al. 2024): a worker slower than the
    fastest takes proportionally fewer steps, round(steps · t_fastest / t_worker)
    (at least 1), so that all workers finish a round in about the same time.
    """

    steps: int = 1
    dynamic: bool = False

    def __post_init__(self):
        _check_int("local steps", "steps", self.steps, 1)
        if not isinstance(self.dynamic, bool):
            raise ValueError(f"local steps: dynamic = {self.dynamic!r} must be True or False")

    def steps_per_worker(self, mean_seconds) -> tuple[int, ...]:
        """[λ] inner steps per iteration of each worker, from its mean seconds per step."""
        if not self.dynamic:
            return tuple(self.steps for _ in mean_seconds)
        fastest = min(mean_seconds)
        return tuple(max(1, round(self.steps * fastest / t)) for t in mean_seconds)


@dataclasses.dataclass(frozen=True)
class Streaming(LocalSteps):
    """Streaming DiLoCo (Douillard et al. 2025): the parameters are split into
    `fragments` P groups of modules (strided: top-level module j is in fragment
    j mod P), and one fragment is synchronized every H/P inner steps, round robin,
    so each is synchronized every H steps. An iteration is these H/P steps
    (`steps` per iteration = H/P). The workers keep their own parameters across
    iterations; the outer update of fragment p is merged into a worker's copy
    `overlap` (τ) inner steps later, θ_p ← α·θ_p(local) + (1−α)·θ_p(global); the
    outer gradients are sent quantized to `bits` bits (32: not quantized; fewer:
    a sign and a (bits−1)-bit exponent per value, an E(bits−1)M0 float, scaled by
    the tensor's largest magnitude) and averaged in float32.
    """

    fragments: int = 1
    overlap: int = 0
    alpha: float = 0.0
    bits: int = 32

    def __post_init__(self):
        super().__post_init__()
        _check_int("streaming_diloco", "fragments", self.fragments, 1)
        _check_int("streaming_diloco", "overlap", self.overlap, 0)
        if self.overlap >= max(1, self.steps):
            raise ValueError(f"streaming_diloco: overlap = {self.overlap} must be < the {self.steps} inner steps "
                             "between two synchronizations (H / fragments)")
        if not (isinstance(self.alpha, (int, float)) and 0.0 <= self.alpha <= 1.0):
            raise ValueError(f"streaming_diloco: alpha = {self.alpha!r} must be in [0, 1] (the local weight)")
        if self.bits not in (2, 3, 4, 8, 32):
            raise ValueError(f"streaming_diloco: bits = {self.bits!r} must be one of 2, 3, 4, 8 or 32")


# -- the policy ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Policy:
    """A gate and an aggregation, and the driver protocol over them (see the module docstring).

    spec: the policy's spec string (`describe()`; parseable by `parse`).
    work: what a worker computes per iteration: `Gradient()` or `LocalSteps(H)` (the
      local-update methods: Local SGD, DiLoCo and their asynchronous variants).
    optimizer: the server's (outer) optimizer the method is defined with, used when a
      run names none (e.g. DiLoCo's Nesterov SGD, lr 0.7, momentum 0.9); None: the task's.
    """

    gate: Any
    aggregation: Any
    spec: str
    work: Any = Gradient()
    optimizer: Any = None

    @property
    def local(self) -> bool:
        """Whether workers take local steps and push deltas (a local-update method)."""
        return isinstance(self.work, LocalSteps)

    def describe(self) -> str:
        """Short spec string, parseable by `parse`."""
        return self.spec

    def staleness_bound(self) -> int | None:
        """Largest allowed clock gap at the start of an iteration (None: unbounded)."""
        return self.gate.bound()

    def gradients_per_update(self, num_live: int, num_workers: int) -> int:
        """Number of accepted gradients that make an update."""
        return self.aggregation.size(num_live, num_workers)

    def init(self, num_workers: int, now: float = 0.0) -> SyncState:
        """Fresh state for `num_workers` workers at time `now` (seconds); all may start."""
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"num_workers = {num_workers!r} must be an integer >= 1")
        self.aggregation.validate(num_workers)
        return SyncState(num_workers, self.gate.init(num_workers, float(now)))

    def push(self, state: SyncState, worker: int, pull_version: int, now: float) -> PushOutcome:
        """The server receives `worker`'s gradient computed on `pull_version` at time `now`."""
        table = state.table
        if not table.live[worker]:
            raise ValueError(f"push: worker {worker} is not live")
        accepted = self.aggregation.accepts(state, worker, pull_version)
        table.advance(worker)
        self.gate.pushed(state, worker, now)
        update = False
        if accepted:
            state.buffered += 1
            if worker not in state.contributors:
                state.contributors[worker] = None
                state.live_contributors += 1
            update = self.aggregation.due(state)
            if update:
                _close_round(state)
        else:
            state.dropped += 1
        released: list[int] = []
        key = self.gate.after_push(state, worker, pull_version, now)
        if key is None:
            released.append(worker)
        else:
            table.hold(worker, key)
        table.drain(self.gate.level(state), released)
        table.note_gaps(released)
        return PushOutcome(accepted, update, tuple(released))

    def fail(self, state: SyncState, worker: int, now: float) -> PushOutcome:
        """`worker` died at `now`: it leaves the gates; a synchronous update may now be due."""
        table = state.table
        if not table.live[worker]:
            raise ValueError(f"fail: worker {worker} is not live")
        table.remove(worker)
        self.gate.failed(state, worker)
        if worker in state.contributors:  # its pushed gradient stays in the buffer
            state.live_contributors -= 1
        update = bool(table.num_live and state.buffered and self.aggregation.due(state))
        if update:
            _close_round(state)
        released: list[int] = []
        table.drain(self.gate.level(state), released)
        table.note_gaps(released)
        return PushOutcome(False, update, tuple(released))

    def join(self, state: SyncState, worker: int, now: float) -> PushOutcome:
        """`worker` (re)joins at `now`, fast-forwarded to the slowest live clock."""
        table = state.table
        if table.live[worker]:
            raise ValueError(f"join: worker {worker} is already live")
        table.insert(worker)
        self.gate.joined(state, worker, now)
        if worker in state.contributors:  # it pushed into the open round before it died
            state.live_contributors += 1
        released: list[int] = []
        key = self.gate.on_join(state, worker)
        if key is None:
            released.append(worker)
        else:
            table.hold(worker, key)
        table.drain(self.gate.level(state), released)
        return PushOutcome(False, False, tuple(released))


def _close_round(state: SyncState) -> None:
    """The buffered gradients become one update: the version rises by one."""
    state.buffered = 0
    state.version += 1
    state.contributors.clear()
    state.live_contributors = 0


# -- factories -------------------------------------------------------------------------------------
def bsp() -> Policy:
    """Bulk synchronous parallel (hardsync): staleness 0, every live worker's gradient per update."""
    return Policy(ClockBound(0), AllLive(), "bsp")


def asp() -> Policy:
    """Asynchronous parallel: apply on arrival, never block."""
    return Policy(Free(), EachGradient(), "asp")


def ssp(staleness: int = 3) -> Policy:
    """Stale synchronous parallel with a fixed threshold `staleness` (clocks)."""
    _check_int("ssp", "staleness", staleness, 0)
    return Policy(ClockBound(staleness), EachGradient(), f"ssp:{staleness}")


def dssp(s_low: int = 3, r_max: int = 12, cap: bool = True) -> Policy:
    """Dynamic SSP with threshold in [s_low, s_low + r_max] (see `DynamicBound`)."""
    _check_int("dssp", "s_low", s_low, 0)
    _check_int("dssp", "r_max", r_max, 0)
    if not isinstance(cap, bool):
        raise ValueError(f"dssp: cap = {cap!r} must be True or False")
    return Policy(DynamicBound(s_low, r_max, cap), EachGradient(), f"dssp:{s_low}:{r_max}" + ("" if cap else ":nocap"))


def softsync(n: int = 1) -> Policy:
    """Rudra n-softsync: one update per floor(λ/n) gradients."""
    _check_int("softsync", "n", n, 1)
    return Policy(Free(), Count(n), f"softsync:{n}")


def backup_workers(b: int = 1) -> Policy:
    """Synchronous SGD that drops the last `b` gradients of each round."""
    _check_int("backup_workers", "b", b, 0)
    return Policy(RoundBound(), FirstOfRound(b), f"backup:{b}")


def local_sgd(steps: int = 10) -> Policy:
    """Local SGD: every worker takes `steps` inner steps from the last global
    parameters, then the server averages the workers' parameters (synchronous: the
    outer step is plain SGD with learning rate 1 on the mean delta)."""
    return Policy(ClockBound(0), AllLive(), f"local_sgd:{steps}", LocalSteps(steps), "sgd:lr=1")


def diloco(steps: int = 50) -> Policy:
    """DiLoCo (Douillard et al. 2023): Local SGD with an inner optimizer per worker
    (state kept across rounds) and an outer optimizer on the mean delta, by default
    Nesterov SGD with learning rate 0.7 and momentum 0.9."""
    return Policy(ClockBound(0), AllLive(), f"diloco:{steps}", LocalSteps(steps), "nesterov:0.9,lr=0.7")


def async_diloco(steps: int = 50, bound: int | None = None, dynamic: bool = False) -> Policy:
    """Asynchronous Local-SGD / DiLoCo (Liu et al. 2024): the server applies each
    worker's delta on arrival; `bound` (clocks) blocks a worker that runs too far
    ahead, as SSP does (None: never); `dynamic`: Dynamic Local Updates (fewer steps
    for slower workers). The outer optimizer defaults to DiLoCo's; the paper's
    Delayed Nesterov is `staleness.engine.optim.delayed_nesterov` (spec
    `delayed_nesterov:N`)."""
    if bound is not None:
        _check_int("async_diloco", "bound", bound, 0)
    spec = f"async_diloco:{steps}" + ("" if bound is None else f":bound={bound}") + (":dynamic" if dynamic else "")
    gate = Free() if bound is None else ClockBound(bound)
    return Policy(gate, EachGradient(), spec, LocalSteps(steps, dynamic), "nesterov:0.9,lr=0.7")


def streaming_diloco(steps: int = 50, fragments: int = 2, overlap: int = 0, alpha: float = 0.0,
                     bits: int = 32) -> Policy:
    """Streaming DiLoCo: DiLoCo whose parameters are synchronized one fragment at a time
    (see `Streaming`): an update every H/P inner steps, of one fragment; `overlap` τ
    inner steps pass before a worker merges it with mixing factor `alpha`; outer
    gradients quantized to `bits`. The workers stay in lockstep (a synchronization
    round every H/P steps, as in the paper); the overlap is in the numerics (the merge
    comes τ steps late) and in the simulated time: the τ steps run while the fragment
    is in flight, hiding up to τ steps of communication (see `staleness.sim`), and a
    sync moves one fragment's bytes (`staleness.engine.payload`)."""
    _check_int("streaming_diloco", "steps", steps, 1)
    _check_int("streaming_diloco", "fragments", fragments, 1)
    if steps % fragments:
        raise ValueError(f"streaming_diloco: steps = {steps} must be a multiple of fragments = {fragments} "
                         "(one fragment is synchronized every steps / fragments inner steps)")
    work = Streaming(steps // fragments, False, fragments, overlap, float(alpha), bits)
    spec = f"streaming_diloco:{steps}:fragments={fragments}:overlap={overlap}:alpha={float(alpha):g}:bits={bits}"
    return Policy(ClockBound(0), AllLive(), spec, work, "nesterov:0.9,lr=0.7")


_SPEC_HELP = ("bsp, asp, ssp[:S], dssp[:S_LOW[:R_MAX]][:nocap], softsync[:N], backup[:B], local_sgd[:H], "
              "diloco[:H], async_diloco[:H][:bound=S][:dynamic], "
              "streaming_diloco[:H][:fragments=P][:overlap=T][:alpha=A][:bits=B]")

# spec name -> (factory, the parameters positional values bind to). Omitted
# numbers take the factory's defaults (`ssp` = ssp:3, `dssp` = dssp:3:12,
# `softsync` = softsync:1, `backup` = backup:1), for every policy alike.
_FACTORIES = {
    "bsp": (bsp, ()),
    "hardsync": (bsp, ()),
    "asp": (asp, ()),
    "ssp": (ssp, ("staleness",)),
    "dssp": (dssp, ("s_low", "r_max")),
    "softsync": (softsync, ("n",)),
    "backup": (backup_workers, ("b",)),
    "backup_workers": (backup_workers, ("b",)),
    "local_sgd": (local_sgd, ("steps",)),
    "diloco": (diloco, ("steps",)),
    "async_diloco": (async_diloco, ("steps",)),
    "streaming_diloco": (streaming_diloco, ("steps",)),
}


def parse(spec: str) -> Policy:
    """Parse a policy spec such as 'bsp', 'ssp:3', 'dssp:3:12', 'dssp:3:12:nocap',
    'dssp:s_low=3,r_max=12', 'softsync:4', 'backup:2' (grammar: `staleness.specs`).

    Every omitted number takes the factory's default (`ssp` is `ssp(3)`).
    Raises `staleness.specs.SpecError` (a ValueError) naming the bad part.
    """
    from staleness import specs

    if isinstance(spec, Policy):
        return spec
    main, mods = specs.split(spec, "policy")
    if main.name not in _FACTORIES:
        raise specs.SpecError(f"policy = {spec!r}: unknown policy {main.name!r}; valid: {_SPEC_HELP}")
    if mods:
        raise specs.SpecError(f"policy = {spec!r}: a policy takes no '+' modifiers; valid: {_SPEC_HELP}")
    factory, positional = _FACTORIES[main.name]
    return specs.call(main, factory, "policy", spec, positional=positional)
