"""Synchronization policies: when a worker may start, when the server updates.

A policy is a small immutable value (a frozen dataclass) holding its
hyper-parameters. Its methods act on a `SyncState`, the control-plane state
of one run: the clock table, the live set, the server version, how many
gradients are buffered for the next update, the blocked workers, and, for
DSSP, the grants and recent push timestamps. Time is always passed in (the
simulator passes simulated seconds, the runtime passes `time.monotonic()`);
nothing here reads a clock, draws a random number or touches parameters.

The driver protocol, identical for the simulator and the real runtime::

    state = policy.init(num_workers, now)          # every worker may start iteration 0
    out = policy.push(state, worker, pull_version, now)
    #   out.accepted: keep the gradient (False: dropped, e.g. a late backup-worker gradient)
    #   out.update:   apply one update now from every accepted gradient buffered
    #                 since the last update (this one included); the version rises by one
    #   out.released: workers that may start their next iteration now; each pulls
    #                 the current version
    out = policy.fail(state, worker, now)          # a worker died; its in-flight gradient is lost
    out = policy.join(state, worker, now)          # a worker (re)joins and pulls the newest version

Deliberate deviation from "state is returned, never mutated": `SyncState` is
updated in place by these methods. A persistent (copy-on-write) clock table
costs O(λ) per event, and the simulator must stay O(log λ) per event for
λ = 1024 workers. Only the policy methods mutate it; drivers read it.

Clock of a worker = number of gradients it has pushed, except that a worker
rejoining after a failure is fast-forwarded to the slowest live clock (it
restarts from the newest parameters, like a replacement worker); otherwise a
rejoining SSP worker would hold back every live worker.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import ClassVar, NamedTuple

__all__ = [
    "Policy",
    "PushOutcome",
    "SyncState",
    "BSP",
    "ASP",
    "SSP",
    "DSSP",
    "SoftSync",
    "BackupWorkers",
    "bsp",
    "asp",
    "ssp",
    "dssp",
    "softsync",
    "backup_workers",
    "dssp_controller",
    "parse",
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


class SyncState:
    """Control-plane state of one run (see the module docstring).

    Public read-only attributes for drivers: `clocks`, `live`, `version`,
    `buffered`, `dropped`, `rstar` (DSSP: list of (time, worker, r*)).
    """

    __slots__ = (
        "num_workers", "clocks", "live", "num_live", "version", "buffered",
        "dropped", "blocked", "_heap", "_buckets", "min_clock", "max_clock",
        "grants", "last_push", "prev_push", "rstar", "max_gap", "contributors", "live_contributors",
    )

    def __init__(self, num_workers: int, now: float):
        self.num_workers = num_workers
        self.clocks = [0] * num_workers          # [λ] pushes (fast-forwarded on rejoin)
        self.live = [True] * num_workers         # [λ]
        self.num_live = num_workers
        self.version = 0                         # updates applied
        self.buffered = 0                        # accepted gradients waiting for the next update
        self.dropped = 0                         # gradients rejected by the policy
        self.blocked = [False] * num_workers     # [λ] waiting at the gate
        self._heap: list[tuple[int, int]] = []   # (release level, worker); lazily pruned
        # clock value -> insertion-ordered live workers at that clock; gives the
        # slowest/fastest clock in O(1) amortized, never O(λ) per event.
        self._buckets: dict[int, dict[int, None]] = {0: dict.fromkeys(range(num_workers))}
        self.min_clock = 0
        self.max_clock = 0
        self.grants = [0] * num_workers          # DSSP r[i]: extra iterations granted
        self.last_push = [now] * num_workers     # DSSP A[i][-1]; the start time counts as a push
        self.prev_push = [math.nan] * num_workers  # DSSP A[i][-2]
        self.rstar: list[tuple[float, int, int]] = []
        self.max_gap = 0                         # largest clock gap at any release
        self.contributors: dict[int, None] = {}  # workers with a gradient in the buffer
        self.live_contributors = 0               # how many of them are live

    # -- clock table -------------------------------------------------------
    def _move(self, worker: int, old: int, new: int) -> None:
        bucket = self._buckets[old]
        del bucket[worker]
        self._buckets.setdefault(new, {})[worker] = None
        if not bucket:
            del self._buckets[old]
            if old == self.min_clock:
                self._advance_min()
        if new > self.max_clock:
            self.max_clock = new

    def _advance_min(self) -> None:
        if not self._buckets:
            return
        m = self.min_clock
        while m not in self._buckets:
            m += 1
        self.min_clock = m

    def _remove(self, worker: int) -> None:
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

    def _insert(self, worker: int) -> None:
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


class Policy:
    """Abstract base of the synchronization policies; concrete ones are final.

    Subclasses set the aggregation (`gradients_per_update`, `_accepts`) and the
    gate (`_level`, `_gate`). The gate releases a blocked worker when the
    policy's level (the slowest live clock, or the server version) reaches the
    key it was blocked with; blocked workers sit in a heap keyed by that key.
    """

    name: ClassVar[str] = "policy"

    # -- policy-specific hooks ---------------------------------------------
    def gradients_per_update(self, num_live: int, num_workers: int) -> int:
        """Number of accepted gradients that trigger an update."""
        raise NotImplementedError

    def describe(self) -> str:
        """Short spec string, parseable by `parse`."""
        raise NotImplementedError

    def staleness_bound(self) -> int | None:
        """Largest allowed clock gap at the start of an iteration (None: unbounded)."""
        return None

    def _accepts(self, state: SyncState, worker: int, pull_version: int) -> bool:
        return True

    def _update_due(self, state: SyncState) -> bool:
        return state.buffered >= self.gradients_per_update(state.num_live, state.num_workers)

    def _level(self, state: SyncState) -> int:
        return state.min_clock

    def _gate(self, state: SyncState, worker: int, pull_version: int, now: float) -> int | None:
        """After a push: None to release the worker now, else the level key to block on."""
        return None

    def _validate(self, num_workers: int) -> None:
        pass

    def _join_gate(self, state: SyncState, worker: int) -> int | None:
        """On a (re)join: None to start at once, else the level key to block on.
        Clock-gated policies apply their threshold: a worker that pushed into a
        round before it died waits for that round like everyone else."""
        bound = self._gate_threshold()
        if bound is None:
            return None
        key = state.clocks[worker] - bound
        return None if key <= state.min_clock else key

    def _gate_threshold(self) -> int | None:
        """Clock threshold of the gate (None: not clock-gated)."""
        return None

    # -- driver protocol ---------------------------------------------------
    def init(self, num_workers: int, now: float = 0.0) -> SyncState:
        """Fresh state for `num_workers` workers at time `now` (seconds); all may start."""
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"num_workers = {num_workers!r} must be an integer >= 1")
        self._validate(num_workers)
        return SyncState(num_workers, float(now))

    def push(self, state: SyncState, worker: int, pull_version: int, now: float) -> PushOutcome:
        """The server receives `worker`'s gradient computed on `pull_version` at time `now`."""
        if not state.live[worker]:
            raise ValueError(f"push: worker {worker} is not live")
        accepted = self._accepts(state, worker, pull_version)
        old = state.clocks[worker]
        state.clocks[worker] = old + 1
        state._move(worker, old, old + 1)
        state.prev_push[worker] = state.last_push[worker]
        state.last_push[worker] = now
        update = False
        if accepted:
            state.buffered += 1
            if worker not in state.contributors:
                state.contributors[worker] = None
                state.live_contributors += 1
            update = self._update_due(state)
            if update:
                self._close_round(state)
        else:
            state.dropped += 1
        released: list[int] = []
        self._hold_or_release(state, worker, self._gate(state, worker, pull_version, now), released)
        self._drain(state, released)
        self._note_gaps(state, released)
        return PushOutcome(accepted, update, tuple(released))

    def fail(self, state: SyncState, worker: int, now: float) -> PushOutcome:
        """`worker` died at `now`: it leaves the gates; a synchronous update may now be due."""
        if not state.live[worker]:
            raise ValueError(f"fail: worker {worker} is not live")
        state.live[worker] = False
        state.num_live -= 1
        state.blocked[worker] = False
        state.grants[worker] = 0
        state._remove(worker)
        if worker in state.contributors:  # its pushed gradient stays in the buffer
            state.live_contributors -= 1
        update = bool(state.num_live and state.buffered and self._update_due(state))
        if update:
            self._close_round(state)
        released: list[int] = []
        self._drain(state, released)
        self._note_gaps(state, released)
        return PushOutcome(False, update, tuple(released))

    def join(self, state: SyncState, worker: int, now: float) -> PushOutcome:
        """`worker` (re)joins at `now`, fast-forwarded to the slowest live clock."""
        if state.live[worker]:
            raise ValueError(f"join: worker {worker} is already live")
        if state.num_live:
            state.clocks[worker] = max(state.clocks[worker], state.min_clock)
        state.live[worker] = True
        state.num_live += 1
        state.last_push[worker] = now
        state.prev_push[worker] = math.nan
        state._insert(worker)
        if worker in state.contributors:  # it pushed into the open round before it died
            state.live_contributors += 1
        released: list[int] = []
        self._hold_or_release(state, worker, self._join_gate(state, worker), released)
        self._drain(state, released)
        return PushOutcome(False, False, tuple(released))

    @staticmethod
    def _close_round(state: SyncState) -> None:
        """The buffered gradients become one update: the version rises by one."""
        state.buffered = 0
        state.version += 1
        state.contributors.clear()
        state.live_contributors = 0

    @staticmethod
    def _hold_or_release(state: SyncState, worker: int, key: int | None, released: list[int]) -> None:
        """Release `worker` now (key None) or block it until the level reaches `key`."""
        if key is None:
            released.append(worker)
        else:
            state.blocked[worker] = True
            heapq.heappush(state._heap, (key, worker))

    def _drain(self, state: SyncState, released: list[int]) -> None:
        heap = state._heap
        if not heap:
            return
        level = self._level(state)
        while heap and heap[0][0] <= level:
            _, w = heapq.heappop(heap)
            if state.blocked[w] and state.live[w]:
                state.blocked[w] = False
                released.append(w)

    @staticmethod
    def _note_gaps(state: SyncState, released: list[int]) -> None:
        for w in released:
            gap = state.clocks[w] - state.min_clock
            if gap > state.max_gap:
                state.max_gap = gap


def _check_int(owner: str, arg: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner}: {arg} = {value!r} must be an integer >= {low}")


@dataclasses.dataclass(frozen=True)
class SSP(Policy):
    """Stale synchronous parallel: apply on arrival; a worker more than
    `staleness` clocks ahead of the slowest live worker blocks."""

    staleness: int = 3
    name: ClassVar[str] = "ssp"

    def __post_init__(self):
        _check_int("ssp", "staleness", self.staleness, 0)

    def gradients_per_update(self, num_live, num_workers):
        return 1

    def staleness_bound(self):
        return self.staleness

    def _gate_threshold(self):
        return self.staleness

    def _gate(self, state, worker, pull_version, now):
        key = state.clocks[worker] - self.staleness
        return None if key <= state.min_clock else key

    def describe(self):
        return f"ssp:{self.staleness}"


@dataclasses.dataclass(frozen=True)
class BSP(Policy):
    """Bulk synchronous parallel: average all live workers' gradients, barrier.

    The gate is SSP(0)'s; the update fires when every live worker has pushed
    its gradient of the round (a worker that dies after pushing still counts
    its gradient; one that dies before pushing is no longer waited for)."""

    name: ClassVar[str] = "bsp"

    def gradients_per_update(self, num_live, num_workers):
        return num_live

    def _update_due(self, state):
        return state.live_contributors >= state.num_live

    def _gate_threshold(self):
        return 0

    def staleness_bound(self):
        return 0

    def _gate(self, state, worker, pull_version, now):
        key = state.clocks[worker]
        return None if key <= state.min_clock else key

    def describe(self):
        return "bsp"


@dataclasses.dataclass(frozen=True)
class ASP(Policy):
    """Asynchronous parallel: apply each gradient on arrival, never block."""

    name: ClassVar[str] = "asp"

    def gradients_per_update(self, num_live, num_workers):
        return 1

    def describe(self):
        return "asp"


@dataclasses.dataclass(frozen=True)
class SoftSync(Policy):
    """Rudra n-softsync: update after c = floor(λ/n) gradients from any workers.

    No barrier; the same worker may contribute several gradients to one
    update. n = λ is plain async; n = 1 is not hardsync (no barrier)."""

    n: int = 1
    name: ClassVar[str] = "softsync"

    def __post_init__(self):
        _check_int("softsync", "n", self.n, 1)

    def _validate(self, num_workers):
        if self.n > num_workers:
            raise ValueError(
                f"softsync: n = {self.n} must be <= the number of workers ({num_workers}); "
                "c = floor(workers / n) gradients per update must be >= 1"
            )

    def gradients_per_update(self, num_live, num_workers):
        return num_workers // self.n

    def describe(self):
        return f"softsync:{self.n}"


@dataclasses.dataclass(frozen=True)
class BackupWorkers(Policy):
    """Synchronous SGD with `b` backup workers (Chen et al. 2016).

    Round k collects gradients computed on version k; the update fires after
    the first (live − b) of them; gradients computed on an older version
    arrive late and are dropped (counted in `SyncState.dropped`). A worker
    that pushed on time waits for its round's update; a late one restarts at
    once on the newest version."""

    b: int = 1
    name: ClassVar[str] = "backup"

    def __post_init__(self):
        _check_int("backup_workers", "b", self.b, 0)

    def _validate(self, num_workers):
        if self.b >= num_workers:
            raise ValueError(
                f"backup_workers: b = {self.b} must be < the number of workers ({num_workers})"
            )

    def gradients_per_update(self, num_live, num_workers):
        return max(1, num_live - self.b)

    def staleness_bound(self):
        return None

    def _accepts(self, state, worker, pull_version):
        return pull_version == state.version

    def _level(self, state):
        return state.version

    def _gate(self, state, worker, pull_version, now):
        key = pull_version + 1
        return None if key <= state.version else key

    def describe(self):
        return f"backup:{self.b}"


def dssp_controller(
    fast_last: float, fast_prev: float, slow_last: float, slow_prev: float, r_max: int
) -> int:
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
class DSSP(Policy):
    """Dynamic SSP (Zhao et al., ICDCS 2019): SSP whose threshold moves in
    [s_low, s_low + r_max] per iteration, chosen by `dssp_controller`.

    On a push from p: if p holds granted iterations it uses one and goes on;
    else if it is within s_low of the slowest it goes on; else if it is the
    fastest the controller grants r* extra iterations (recorded in
    `SyncState.rstar`); else it blocks until within s_low.

    cap=True (default): r* is clipped so that no iteration starts more than
    s_U = s_low + r_max clocks ahead of the slowest (the paper's "threshold in
    (s_L, s_U)"). cap=False: the literal server loop, which asks the
    controller again each time a grant is used up, so repeated grants can let
    the gap drift past s_U (closer to ASP, which the paper reports DSSP
    resembles in speed).
    """

    s_low: int = 3
    r_max: int = 12
    cap: bool = True
    name: ClassVar[str] = "dssp"

    def __post_init__(self):
        _check_int("dssp", "s_low", self.s_low, 0)
        _check_int("dssp", "r_max", self.r_max, 0)
        if not isinstance(self.cap, bool):
            raise ValueError(f"dssp: cap = {self.cap!r} must be True or False")

    def gradients_per_update(self, num_live, num_workers):
        return 1

    def staleness_bound(self):
        return self.s_low + self.r_max if self.cap else None

    def _gate_threshold(self):
        return self.s_low

    def _gate(self, state, worker, pull_version, now):
        gap = state.clocks[worker] - state.min_clock
        if state.grants[worker] > 0:
            if not self.cap or gap <= self.s_low + self.r_max:
                state.grants[worker] -= 1
                return None
            state.grants[worker] = 0
        if gap <= self.s_low:
            return None
        if state.clocks[worker] == state.max_clock:
            slow = state.slowest()
            r = dssp_controller(
                state.last_push[worker], state.prev_push[worker],
                state.last_push[slow], state.prev_push[slow], self.r_max,
            )
            if self.cap:
                r = max(0, min(r, self.s_low + self.r_max - gap + 1))
            state.rstar.append((now, worker, r))
            if r > 0:
                state.grants[worker] = r - 1
                return None
        return state.clocks[worker] - self.s_low

    def describe(self):
        return f"dssp:{self.s_low}:{self.r_max}" + ("" if self.cap else ":nocap")


def bsp() -> BSP:
    """Bulk synchronous parallel (hardsync): staleness 0, λ gradients per update."""
    return BSP()


def asp() -> ASP:
    """Asynchronous parallel: apply on arrival, never block."""
    return ASP()


def ssp(staleness: int = 3) -> SSP:
    """Stale synchronous parallel with a fixed threshold `staleness` (clocks)."""
    return SSP(staleness)


def dssp(s_low: int = 3, r_max: int = 12, cap: bool = True) -> DSSP:
    """Dynamic SSP with threshold in [s_low, s_low + r_max] (see `DSSP`)."""
    return DSSP(s_low, r_max, cap)


def softsync(n: int = 1) -> SoftSync:
    """Rudra n-softsync: one update per floor(λ/n) gradients."""
    return SoftSync(n)


def backup_workers(b: int = 1) -> BackupWorkers:
    """Synchronous SGD that drops the last `b` gradients of each round."""
    return BackupWorkers(b)


_SPEC_HELP = "bsp, asp, ssp[:S], dssp[:S_LOW[:R_MAX]][:nocap], softsync[:N], backup[:B]"

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
