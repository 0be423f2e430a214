"""Gates: when a worker may start its next iteration.

A gate is any value with the methods of `Gate` (a protocol: built-in gates
share no-op defaults by deriving from `Free`, user gates need not): its own
small state, made by `init`, sits in `SyncState.gate`; the level that blocked
workers wait for; and what happens after a push, a failure or a join.

- `Free` never blocks (ASP, softsync);
- `ClockBound(s)`: no worker more than s clocks ahead of the slowest live one
  (SSP, and BSP's barrier at s = 0);
- `DynamicBound(s_low, r_max, cap)`: DSSP, `ClockBound(s_low)` plus the
  synchronization controller (`dssp_controller`);
- `RoundBound()`: backup workers; a worker that pushed on time waits for its
  round's update;
- `RoundLag(η)`: asynchronous RL in rounds (`rl_sync`, `rl_one_step_off`): the
  round's barrier, and the learner at most η completed versions behind;
- `Capacity(η)`: asynchronous RL (AReaL's η): rollout j may start once version
  ⌊j / λ⌋ − η is completed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, runtime_checkable

from staleness.policies.state import SyncState

__all__ = ["Gate", "Free", "ClockBound", "DynamicBound", "RoundBound", "RoundLag", "Capacity", "dssp_controller"]


@runtime_checkable
class Gate(Protocol):
    """What the driver asks of a gate (all times in seconds, passed in).

    init(num_workers, now): the gate's own state (None if it keeps none).
    level(state): the value that blocked workers' keys are compared with
      (the slowest live clock for clock gates, the server version for `RoundBound`).
    after_push(state, worker, pull_version, now): None to release `worker` at
      once, else the level key it waits for.
    on_join(state, worker): the same for a worker that (re)joins.
    pushed / failed / joined: keep the gate's own state after those events.
    bound(): the largest clock gap at the start of an iteration (None: unbounded);
      the engine sizes its ring of parameter versions from it and the runtime
      asks `bound() == 0` for a lockstep round.
    """

    def init(self, num_workers: int, now: float) -> Any: ...
    def level(self, state: SyncState) -> int: ...
    def after_push(self, state: SyncState, worker: int, pull_version: int, now: float) -> int | None: ...
    def on_join(self, state: SyncState, worker: int) -> int | None: ...
    def pushed(self, state: SyncState, worker: int, now: float) -> None: ...
    def failed(self, state: SyncState, worker: int) -> None: ...
    def joined(self, state: SyncState, worker: int, now: float) -> None: ...
    def bound(self) -> int | None: ...


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
    the slowest, so that it then waits least.

    The start of a run counts as a push: `DynamicBound.init` stamps every
    worker's last push at the start time, so after its first real push a worker
    already has the two stamps the estimate needs. 0 is returned only when an
    interval is not positive or not known (a NaN stamp: a worker that has just
    (re)joined, whose previous push is forgotten; or two pushes at one time).
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


@dataclasses.dataclass(frozen=True)
class RoundLag(Free):
    """Rounds of rollouts in lockstep with a learner η versions behind (asynchronous
    RL: `rl_sync` at η = 0, `rl_one_step_off` at η = 1).

    An actor starts its rollout i when every live actor has pushed rollout i − 1
    (the round's barrier, BSP's `ClockBound(0)`) and the learner has completed
    update i − 1 − η. The learner's update i trains on round i, so a rollout of
    round i is generated on version >= i − η and is consumed at version i:
    staleness <= η (exactly η once the learner is the bottleneck: one-step
    off-policy is one version stale). Its level is min(slowest live clock,
    completed rounds + η). With `per_round` m > 1 the learner takes m updates per
    round (minibatches, `Minibatches`), so a round is complete after m updates and
    the j-th minibatch of a round is j versions staler.
    """

    eta: int = 0
    per_round: int = 1   # learner updates per round (minibatches of the round's rollouts)

    def level(self, state):
        return min(state.table.min_clock, state.completed // self.per_round + self.eta)

    def after_push(self, state, worker, pull_version, now):
        return self.on_join(state, worker)

    def on_join(self, state, worker):
        key = state.table.clocks[worker]
        return None if key <= self.level(state) else key

    def bound(self):
        return 0


class _CapacityState:
    """`Capacity`'s own state: tickets handed out (rollouts started or waiting to start),
    rollouts per update, tickets that will never be consumed because their actor failed,
    and which actors hold an outstanding ticket."""

    __slots__ = ("tickets", "per_update", "abandoned", "holding")

    def __init__(self, num_workers: int, per_update: int):
        self.tickets = num_workers      # every actor starts one rollout at the beginning
        self.per_update = per_update
        self.abandoned = 0
        self.holding = set(range(num_workers))


@dataclasses.dataclass(frozen=True)
class Capacity(Free):
    """AReaL's staleness control (`max_head_offpolicyness` η): an actor may start a
    rollout only while the rollouts started and not thrown away number at most
    (η + 1 + completed versions) × c, c the rollouts per update (`batch`; None: one per
    actor). So rollouts are consumed at most η versions after the version they start
    on, if they arrive in the order they started. Implemented with tickets: the actor's
    request gets ticket j (in request order) and starts once
    j < (η + 1 + completed) × c + (rollouts dropped) + (tickets abandoned by failed actors),
    the gate's level + 1 (dropped rollouts and lost ones free their place, as AReaL counts
    accepted and running rollouts only). Every actor starts one rollout at the beginning.
    A rollout that arrives out of order and would still be staler than η is the
    aggregation's to drop (`Fresh`)."""

    eta: int = 0
    batch: int | None = None

    def init(self, num_workers, now):
        return _CapacityState(num_workers, num_workers if self.batch is None else self.batch)

    def level(self, state):
        g = state.gate
        return (self.eta + 1 + state.completed) * g.per_update + state.dropped + g.abandoned - 1

    def pushed(self, state, worker, now):
        state.gate.holding.discard(worker)

    def failed(self, state, worker):
        g = state.gate
        if worker in g.holding:   # its rollout (running or waiting to start) will never arrive
            g.holding.discard(worker)
            g.abandoned += 1

    def after_push(self, state, worker, pull_version, now):
        return self.on_join(state, worker)

    def on_join(self, state, worker):
        g = state.gate
        key = g.tickets
        g.tickets += 1
        g.holding.add(worker)
        return None if key <= self.level(state) else key

    def bound(self):
        return None
