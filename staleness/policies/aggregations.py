"""Aggregations: which gradients the server keeps and when it applies an update.

An aggregation is any value with the methods and the attribute of
`Aggregation` (a protocol: built-in aggregations share defaults by deriving
from `EachGradient`, user ones need not):

- `EachGradient`: every gradient is one update, applied on arrival (ASP, SSP, DSSP);
- `Window(grace)`: the same, and an arrival opens a window of `grace` seconds in which
  every other worker that arrives is synchronized too, before any restarts (the
  asyncdiloco notebook's `max_wait_time`);
- `Quorum(k, grace)`: Decoupled DiLoCo's synchronizer: once k learners have arrived it waits
  `grace` seconds for more (or the paper's adaptive window), then merges every arrival into
  one update;
- `AllLive`: one update per round from every live worker's gradient (BSP);
- `Count(n)`: Rudra n-softsync, floor(λ/n) gradients from any workers;
- `FirstOfRound(b)`: backup workers, the first λ − b gradients of a round;
- `Fresh(η)`: asynchronous RL's learner, λ rollouts per update, dropping those
  staler than η.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

from staleness.policies.state import SyncState

__all__ = ["Aggregation", "EachGradient", "Window", "Quorum", "AllLive", "Count", "FirstOfRound", "Fresh",
           "Minibatches"]


@runtime_checkable
class Aggregation(Protocol):
    """What the driver asks of an aggregation.

    accepts(state, worker, pull_version): keep the gradient (False: it is dropped).
    due(state): whether the buffered gradients make an update now.
    size(num_live, num_workers): gradients per update (the engine's slots).
    validate(num_workers): policy-specific checks (a ValueError naming the parameter).
    all_live: every live worker's gradient of a round makes one update, so a
      round can be one all-reduce (the network model's `allreduce`, the
      runtime's collective rounds).

    Optional members (declared below with the value `Policy` uses where one is left out):
    fixed_size(num_workers): how many gradients every update holds when that never
      varies (the engine then replays a schedule while it is being simulated;
      `Policy.streamable`), else None; None: the aggregation is never streamed.
    grace: seconds of the synchronization window an arrival opens (`Window`); 0.0: none.
    requeue: a dropped gradient's iteration is redone (`Fresh`'s requeue mode).
    quorum: arrivals (since the last window closed) that open the window (`Quorum`).
    merges: the arrivals of a window make one update when it closes (`Policy.merge`), not
      one each on arrival; the workers they release wait for it.
    window_seconds(step, to_quorum, sync): the window's seconds when the quorum is met,
      from the learners' seconds per inner step, the seconds from the first arrival to the
      quorum and a synchronization's seconds (`Quorum`'s adaptive grace); None: `grace`.
    """

    all_live: bool

    def accepts(self, state: SyncState, worker: int, pull_version: int) -> bool: ...
    def due(self, state: SyncState) -> bool: ...
    def size(self, num_live: int, num_workers: int) -> int: ...
    def validate(self, num_workers: int) -> None: ...

    fixed_size: Callable[[int], int | None] | None = None
    grace: float = 0.0
    requeue: bool = False
    quorum: int = 1
    merges: bool = False
    window_seconds: Callable[[float, float, float], float] | None = None


@dataclasses.dataclass(frozen=True)
class EachGradient:
    """Every gradient is one update, applied on arrival (ASP, SSP, DSSP)."""

    all_live: ClassVar[bool] = False

    def accepts(self, state, worker, pull_version):
        return True

    def due(self, state):
        return state.buffered >= 1

    def size(self, num_live, num_workers):
        return 1

    def fixed_size(self, num_workers):
        return 1

    def validate(self, num_workers):
        pass


@dataclasses.dataclass(frozen=True)
class Window(EachGradient):
    """Every gradient is one update, applied on arrival; the first arrival after a quiet spell
    opens a window of `grace` seconds, and every worker whose push arrives within it is
    synchronized too (each its own update, in arrival order) before any of them restarts:
    the synchronized workers wait and all start their next iteration, on the newest
    version, at the window's last synchronization (the asyncdiloco notebook's virtual clock,
    `max_wait_time`). The window itself is `staleness.driver.SyncWindow`, in the simulator
    and the real server."""

    grace: float = 0.5

    def __post_init__(self):
        if isinstance(self.grace, bool) or not isinstance(self.grace, (int, float)) or not (
                0.0 < self.grace < float("inf")):
            raise ValueError(f"window: grace = {self.grace!r} must be a finite number of seconds > 0")


@dataclasses.dataclass(frozen=True)
class Quorum(EachGradient):
    """Decoupled DiLoCo's synchronizer (Douillard et al. 2026): learners push on their own
    clocks; once `k` of them have arrived since the last merge (fewer when fewer are live) it
    waits `grace` seconds for more (the pushes in flight that arrive by then), and at the
    window's last arrival merges every arrival into one update (`Policy.merge`); the merged
    learners wait for it and restart on the merged version. A learner that misses the window
    goes on and is merged in a later one (its delta staler). k = 1 and grace = 0 merge every
    arrival alone, on arrival (asynchronous DiLoCo); k = λ and grace = 0 wait for every live
    learner (DiLoCo's round). The window is `staleness.driver.SyncWindow`.

    adaptive: the grace is the paper's adaptive window (its Eq. 3, as secondary notes of the
    paper give it), computed when the quorum is met: the slack τ·ξ_step − (ξ_quorum + ξ_sync)
    that τ overlapped inner steps leave, times a margin γ < 1, and 0 when there is none
    (`window_seconds`). The paper's γ is not known here: γ = 0.5 with τ = 2 caps the window at
    one inner step, as the notes say it is ("at most about one step")."""

    k: int = 1
    grace: float = 0.0
    adaptive: bool = False
    gamma: float = 0.5
    tau: int = 2

    merges: ClassVar[bool] = True

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"quorum: k = {self.k!r} must be an integer >= 1 (learners merged at least)")
        if isinstance(self.grace, bool) or not isinstance(self.grace, (int, float)) or not (
                0.0 <= self.grace < float("inf")):
            raise ValueError(f"quorum: grace = {self.grace!r} must be a finite number of seconds >= 0")
        if not isinstance(self.adaptive, bool) or (self.adaptive and self.grace):
            raise ValueError(f"quorum: adaptive = {self.adaptive!r} must be True or False, and True only with "
                             "grace = 0 (the window is then computed)")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, float)) or not 0.0 < self.gamma < 1.0:
            raise ValueError(f"quorum: gamma = {self.gamma!r} must be a number in (0, 1) (the safety margin)")
        if isinstance(self.tau, bool) or not isinstance(self.tau, int) or self.tau < 1:
            raise ValueError(f"quorum: tau = {self.tau!r} must be an integer >= 1 (overlapped inner steps)")

    @property
    def quorum(self) -> int:
        return self.k

    def window_seconds(self, step: float, to_quorum: float, sync: float) -> float:
        """Seconds the window waits for more learners once the quorum is met: `grace`, or
        (adaptive) γ · max(0, τ·step − (to_quorum + sync)), step the seconds of one inner step,
        to_quorum the seconds from the first arrival to the quorum, sync a synchronization's."""
        if not self.adaptive:
            return float(self.grace)
        return self.gamma * max(0.0, self.tau * step - (to_quorum + sync))

    def due(self, state):
        return False   # a window's arrivals are merged at its close (`Policy.merge`)

    def size(self, num_live, num_workers):
        return num_workers

    def fixed_size(self, num_workers):
        return None

    def validate(self, num_workers):
        if self.k > num_workers:
            raise ValueError(f"decoupled_diloco: quorum = {self.k} must be <= the number of learners "
                             f"({num_workers})")


@dataclasses.dataclass(frozen=True)
class AllLive(EachGradient):
    """One update per round from every live worker's gradient (BSP). A worker that
    dies after pushing still counts its gradient; one that dies before pushing is
    no longer waited for."""

    all_live: ClassVar[bool] = True

    def due(self, state):
        return state.live_contributors >= state.table.num_live

    def size(self, num_live, num_workers):
        return num_live

    def fixed_size(self, num_workers):
        return None   # fewer once a worker is lost


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

    def fixed_size(self, num_workers):
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

    def fixed_size(self, num_workers):
        return None

    def validate(self, num_workers):
        if self.b >= num_workers:
            raise ValueError(f"backup_workers: b = {self.b} must be < the number of workers ({num_workers})")


@dataclasses.dataclass(frozen=True)
class Fresh(EachGradient):
    """A learner update from every `batch` rollouts (None: λ, one per actor on average;
    from any actors, in arrival order), keeping only those at most `eta` versions stale
    when consumed (None: all). A rollout pushed when `version` updates are decided is
    consumed by update `version`, so its staleness is known on arrival:
    version − pull_version; a staler one is dropped (counted in `SyncState.dropped`).
    requeue: a dropped rollout's prompts are generated again by its actor, next, on the
    newest version (its clock does not advance, so its next iteration draws the same
    prompts: `Policy.push`)."""

    eta: int | None = None
    batch: int | None = None
    requeue: bool = False   # a rollout thrown away is generated again (its actor's clock does not advance)

    def accepts(self, state, worker, pull_version):
        return self.eta is None or state.version - pull_version <= self.eta

    def due(self, state):
        return state.buffered >= (state.table.num_workers if self.batch is None else self.batch)

    def size(self, num_live, num_workers):
        return num_workers if self.batch is None else self.batch

    def fixed_size(self, num_workers):
        return None


@dataclasses.dataclass(frozen=True)
class Minibatches(EachGradient):
    """A round's rollouts in `m` learner updates (PPO-style minibatches, several optimizer
    steps per batch): an update from every λ / m rollouts in arrival order, and one from
    the rest once every live actor has pushed the round. Rollouts of a round are generated
    on one version, so the j-th update of a round consumes them j versions stale."""

    m: int = 2

    def due(self, state):
        t = state.table
        return state.buffered >= t.num_workers // self.m or (state.buffered > 0 and t.min_clock == t.max_clock)

    def size(self, num_live, num_workers):
        return -(-num_workers // self.m)

    def fixed_size(self, num_workers):
        return None   # a round's last update takes the rest

    def validate(self, num_workers):
        if num_workers % self.m:
            raise ValueError(f"split = {self.m} must divide the number of actors ({num_workers}): each "
                             "learner update takes actors / split rollouts of the round")
