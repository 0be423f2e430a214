"""`Policy`: a gate, an aggregation and a work, and the driver protocol over them.

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
    out = policy.complete(state, now)              # the oldest decided update's parameters now exist
    out = policy.merge(state, now[, count])        # a merging window closed: its arrivals make one update

An update is decided by `push` (or `fail`) and completed by `complete`: the
drivers call it at once (the server trains in no simulated time), except
where a learner trains for a while (asynchronous RL, `staleness.sim.scheduler`);
released workers pull the newest completed version.

Time is always passed in (simulated seconds, or the runtime's
`time.monotonic()`); nothing here reads a clock, draws a random number or
touches parameters.

A policy value travels with the `Schedule` it made; its spec string
(`describe()`, `str(policy)`) is only its serialization, parsed once at the
entry points by `staleness.policies.parse`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from staleness.policies.aggregations import Aggregation
from staleness.policies.gates import Gate
from staleness.policies.state import PushOutcome, SyncState
from staleness.policies.work import Gradient, Work

__all__ = ["Policy", "Unknown"]


@dataclasses.dataclass(frozen=True)
class Policy:
    """A gate and an aggregation, and the driver protocol over them (see the module docstring).

    spec: the policy's spec string (`describe()`; parseable by `parse`).
    work: what a worker computes per iteration: `Gradient()` or `LocalSteps(H)` (the
      local-update methods: Local SGD, DiLoCo and their asynchronous variants).
    optimizer: the server's (outer) optimizer the method is defined with, used when a
      run names none (e.g. DiLoCo's Nesterov SGD, lr 0.7, momentum 0.9); None: the task's.
    """

    gate: Gate
    aggregation: Aggregation
    spec: str
    work: Work = Gradient()
    optimizer: Any = None

    def __post_init__(self):
        for name, part, protocol in (("gate", self.gate, Gate), ("aggregation", self.aggregation, Aggregation),
                                     ("work", self.work, Work)):
            missing = [m for m in _members(protocol) if m not in _optional(protocol) and not hasattr(part, m)]
            if missing:
                raise TypeError(f"Policy: {name} = {part!r} does not follow the {protocol.__name__} protocol (it lacks "
                                f"{', '.join(missing)}); see staleness.policies.{protocol.__name__}")
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise TypeError(f"Policy: spec = {self.spec!r} must be a non-empty string (how the policy is named "
                            "in results and on the command line)")

    def __str__(self) -> str:
        return self.spec

    @property
    def local(self) -> bool:
        """Whether workers take local steps and push deltas (a local-update method)."""
        return self.work.local

    @property
    def learner(self) -> bool:
        """Whether a learner trains each update for a while (asynchronous RL: the work has
        `learner_seconds`); its updates are completed after they are decided (`complete`)."""
        return _member(self.work, Work, "learner_seconds") is not None

    @property
    def grace(self) -> float:
        """Seconds of the synchronization window an arrival opens (`aggregations.Window`);
        0.0: none, a released worker restarts at once."""
        return float(_member(self.aggregation, Aggregation, "grace"))

    @property
    def quorum(self) -> int:
        """Arrivals that open the synchronization window (`aggregations.Quorum`; 1: the first)."""
        return int(_member(self.aggregation, Aggregation, "quorum"))

    @property
    def merges(self) -> bool:
        """Whether a window's arrivals make one update at its close (`merge`) rather than one
        each on arrival (`aggregations.Quorum`)."""
        return bool(_member(self.aggregation, Aggregation, "merges"))

    @property
    def merge_keys(self) -> int:
        """How many merging windows run side by side, one per fragment (a push of iteration k is
        fragment k mod P's: Decoupled DiLoCo's fragments, `work.iterations_per_sync`); 1 for a
        window that does not merge (`Window`) or a policy without fragments."""
        return int(self.work.iterations_per_sync) if self.merges else 1

    @property
    def window_seconds(self):
        """(step, to_quorum, sync) -> the seconds a window waits once its quorum is met
        (`aggregations.Quorum`'s adaptive grace), or None: `grace`."""
        return _member(self.aggregation, Aggregation, "window_seconds")

    @property
    def lockstep(self) -> bool:
        """Whether every live worker starts each round together and one update takes
        all of their results (BSP's barrier and aggregation): the gate allows no
        clock gap and the aggregation waits for every live worker."""
        return self.gate.bound() == 0 and self.aggregation.all_live

    @property
    def collective(self) -> bool:
        """Whether a round can run as one collective step on real devices (a `pmean`
        of every worker's result): a lockstep policy whose work allows it."""
        return self.lockstep and self.work.collective_round

    def describe(self) -> str:
        """Short spec string, parseable by `parse`."""
        return self.spec

    def staleness_bound(self) -> int | None:
        """Largest allowed clock gap at the start of an iteration (None: unbounded)."""
        return self.gate.bound()

    def gradients_per_update(self, num_live: int, num_workers: int) -> int:
        """Number of accepted gradients that make an update."""
        return self.aggregation.size(num_live, num_workers)

    def streamable(self, num_workers: int) -> int | None:
        """The gradients every update holds, when a schedule of this policy can be replayed
        while it is simulated (`engine.run.simulate`): workers compute one gradient each
        iteration (no local steps, no learner) and the aggregation declares a `fixed_size`
        (an optional method of `Aggregation`); else None."""
        fixed = _member(self.aggregation, Aggregation, "fixed_size")
        if fixed is None or self.local or self.learner or self.grace:
            return None
        size = fixed(num_workers)
        return None if size is None else int(size)

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
        if accepted or not _member(self.aggregation, Aggregation, "requeue"):   # a requeued rollout is redone
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

    def complete(self, state: SyncState, now: float) -> PushOutcome:
        """The oldest decided, not yet completed update's parameters exist at `now`:
        gates whose level counts completed versions (`RoundLag`, `Capacity`) may
        release workers."""
        if state.completed >= state.version:
            raise ValueError(f"complete: no decided update is pending (version {state.version}, "
                             f"completed {state.completed})")
        state.completed += 1
        released: list[int] = []
        state.table.drain(self.gate.level(state), released)
        state.table.note_gaps(released)
        return PushOutcome(False, False, tuple(released))

    def merge(self, state: SyncState, now: float, count: int | None = None) -> PushOutcome:
        """A merging window (`merges`) closed at `now`: the buffered gradients make one update
        (count: that many of them, the window's fragment's; the others stay buffered)."""
        rest = 0 if count is None else state.buffered - count
        update = state.buffered > rest
        if update:
            _close_round(state)
            state.buffered = rest
        return PushOutcome(False, update, ())

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


def _members(protocol) -> list[str]:
    """The attributes and methods a protocol declares."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {k for k, v in vars(protocol).items() if callable(v) and not k.startswith("_")}
    return sorted(names)


@functools.cache
def _optional(protocol) -> dict:
    """{name: default} of the optional members a protocol declares: its attributes given a
    value in its body (a part may leave them out; it then has that value). Cached: `push`
    reads one per gradient."""
    return {k: vars(protocol)[k] for k in getattr(protocol, "__annotations__", {}) if k in vars(protocol)}


def _member(part, protocol, name: str):
    """`part`'s member `name`, or the default its protocol declares for it."""
    return getattr(part, name, _optional(protocol)[name])


def _close_round(state: SyncState) -> None:
    """The buffered gradients become one update: the version rises by one."""
    state.buffered = 0
    state.version += 1
    state.contributors.clear()
    state.live_contributors = 0


class Unknown:
    """The gate and aggregation of a policy this build cannot rebuild from its spec
    (a hand-written schedule, or a trace recorded with a policy defined elsewhere):
    its schedule is data and replays as such, but it cannot drive a simulation.
    Every driver method raises a ValueError that names the spec."""

    all_live = False

    def __init__(self, spec: str):
        self.spec = spec

    def __repr__(self) -> str:
        return f"Unknown({self.spec!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Unknown) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(("Unknown", self.spec))

    def _refuse(self, *args, **kwargs):
        raise ValueError(f"policy {self.spec!r} is not known to this build (its schedule can be replayed, "
                         "not simulated); register it with staleness.policies.register or name it as "
                         "'package.module:factory'")

    init = level = after_push = on_join = pushed = failed = joined = accepts = due = size = _refuse

    def validate(self, num_workers):
        self._refuse()

    def bound(self):
        return None
