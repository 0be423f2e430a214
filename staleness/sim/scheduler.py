"""Discrete-event scheduler: (policy, cluster, budget, seed) -> Schedule.

Only timing and control are simulated here; numerics come later, when
`staleness.engine` replays the schedule. A worker's life, as in the real
runtime: released by the gate at `pull_time` (it pulls the current version),
params arrive after the pull's transfer (`start`), it computes for the
cluster's compute time (`end`), its push reaches the server after the push's
transfer (`push_time`), where the policy decides on the gradient and on the
worker's next release.

The bookkeeping of each event (release, record, apply, fail, join) is
`staleness.driver.Driver`'s, the same the real server uses; this module only
draws the cluster's times and orders the events.

Network (see `staleness.cluster.network`). A transfer of B bytes takes
latency + B / bandwidth on the worker's path; B is what the caller passes
(`payload_bytes`, `push_bytes`; None: no bytes, every transfer takes its
latency only, as before the network model). Three cases:

- independent links (no server link, or no bytes): each transfer's time is
  fixed when it starts; one heap entry per gradient, as below;
- a shared server link: pushes and pulls through it share its bandwidth by
  exact processor sharing (max-min fair under the workers' own link caps). A
  transfer's data phase runs while it holds a share, then its latency
  elapses; every start or end of a transfer re-times the others: the link
  keeps a token that changes with its rates, and a heap entry carrying an
  old token is skipped;
- an all-reduce, for policies that aggregate every live worker's gradient per
  round (bsp, local_sgd, diloco) on a cluster with `.allreduce(...)`: the
  collective starts when no live worker is still computing and all its
  participants' pushes arrive when it ends (the cost model's time later);
  there is no pull (every worker holds the reduced gradient); a worker that
  (re)joins pulls the parameters over its own link first.

Overlap (`overlap=True`, for methods whose gradient can leave while it is
being computed, e.g. a backward pass that sends each layer's gradient as soon
as it is ready): a push's data phase starts with the compute and the push
arrives at max(data phase end, compute end) + latency; an all-reduce's data
phase starts with the round's last compute start and it completes at
max(that + bandwidth part, last compute end) + latency part. Pulls never
overlap compute (a worker needs its parameters to start), and a worker's next
pull always waits for its gate, which opens when its push has arrived.

Streaming DiLoCo with an overlap of τ inner steps (`streaming_diloco(...,
overlap=τ)`) is credited whatever the cluster: a worker runs on for τ steps
after each sync while its fragment is in flight, so an iteration whose
parameters arrive at `start` ends at max(start + (H/P − τ)·t, previous end +
(H/P)·t) for a step time t (`policies.Streaming.timing`).

Asynchronous RL (a policy with a learner, `staleness.policies.Rollout`): one more heap
entry per update, completed when the learner has trained it. With partial rollouts
(`rl_partial`) a completed version interrupts the rollouts it reaches mid-decode, which then
end later: the update's event moves their pushes (a new heap entry; the old one, no longer
the worker's `due` entry, is skipped).

Why a bare `heapq` loop rather than SimPy: one heap entry per gradient (the
push arrival) plus one per membership change, and no generator switching;
the design note measured SimPy at ~300k vs ~700k events/s for a bare heap on
a trivial model, and our per-event policy work leaves no room for a 2x tax.
Cost per gradient: O(log λ) heap work + O(1) amortized clock tracking (with a
shared link, a few more heap entries and O(distinct link speeds) re-timing).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator

import numpy as np

from staleness.infra import checks, interrupts
from staleness import policies as _policies
from staleness.cluster.network import SharedLink, allreduce_parts
from staleness.driver import Driver, SyncWindow
from staleness.sim.inflight import Decode
from staleness.schedule import Schedule

__all__ = ["simulate_schedule", "stream_schedule", "ScheduleStream"]

EVENTS_PER_BLOCK = 2048
"""Events a `ScheduleStream` runs with Ctrl-C held (about 10 ms): an interrupt is raised
between two blocks, so the simulation it stops can still be finished."""

_PUSH, _FAIL, _JOIN, _PULLED, _COMPUTED, _LINK, _REDUCED, _TRAINED, _CLOSE, _HIDDEN = range(10)

# Membership changes (`ClusterSampler.membership`) as heap entries: `_HIDDEN` is a layer's
# boundary that the union of the layers' outages hides (nothing happens). Their sequence
# numbers start below every other entry's, so a fail or join comes before any other event
# at the same time, in the order the cluster gives them.
_MEMBERSHIP = {"fail": _FAIL, "join": _JOIN, None: _HIDDEN}
_MEMBERSHIP_SEQ = -(1 << 62)
_MEMBERSHIP_KINDS = (_FAIL, _JOIN, _HIDDEN)


def _membership_feed(sampler, push):
    """Queue the cluster's membership changes one at a time, as they are generated (a
    periodic layer's never end): `push(time, seq, kind, worker)` the first now, and the
    next one each time the returned `feed()` is called (when a membership entry is handled)."""
    changes = sampler.membership()
    seq = itertools.count(_MEMBERSHIP_SEQ)

    def feed() -> None:
        change = next(changes, None)
        if change is not None:
            t, kind, w = change
            push(float(t), next(seq), _MEMBERSHIP[kind], int(w))
    feed()
    return feed


def _bytes_arg(name: str, value) -> int | None:
    if value is None:
        return None
    must = "must be an integer number of bytes >= 0"
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise checks.ArgumentError(name, value, must + " (or None)", where="simulate_schedule") from None
    if n < 0:
        raise checks.ArgumentError(name, value, must, where="simulate_schedule")
    return int(n)


def simulate_schedule(
    policy,
    cluster,
    *,
    num_updates: int | None = None,
    max_time: float | None = None,
    seed: int = 0,
    max_gradients: int | None = None,
    payload_bytes: int | None = None,
    push_bytes: int | None = None,
    overlap: bool = False,
    sizes=None,
) -> Schedule:
    """Simulate when every gradient is computed, pushed and applied.
    (`stream_schedule` takes the same arguments and runs it piece by piece.)

    Args:
      policy: a `staleness.policies` policy (or a spec string like "ssp:3").
      cluster: a `staleness.cluster.Cluster` (or a spec string).
      num_updates: stop after this many server updates.
      max_time: stop at this simulated time (seconds); events after it are not run.
      seed: seeds the cluster's random draws; same seed -> identical schedule.
      max_gradients: optional cap on pushed gradients (a guard for sweeps).
      payload_bytes: bytes of the parameters a worker pulls (the parameter
        pytree's size, dtype-aware) and, unless `push_bytes` is given, of what it
        pushes. None: transfers carry no bytes (latency only).
      push_bytes: bytes of a push when they differ from `payload_bytes` (a
        compressed or quantized gradient or delta); needs `payload_bytes`.
      overlap: a push's transfer may run while its gradient is computed (see
        the module docstring); False: it starts when the compute ends.
      sizes: sizes(worker, iteration) -> how many of the cluster's steps iteration
        `iteration` of `worker` takes (asynchronous RL: the tokens its rollout decodes,
        `RLTask.rollout_sizes`); None: one step each.
    At least one of num_updates / max_time / max_gradients is required.

    Returns: a `Schedule` holding every gradient pushed (applied or dropped)
    and every gradient lost to a failure, with the bytes of its pull and push.
    Gradients still in flight, or pushed but not yet aggregated, when the
    budget runs out are not included.
    """
    return stream_schedule(policy, cluster, num_updates=num_updates, max_time=max_time, seed=seed,
                           max_gradients=max_gradients, payload_bytes=payload_bytes, push_bytes=push_bytes,
                           overlap=overlap, sizes=sizes).finish()


def stream_schedule(policy, cluster, *, num_updates: int | None = None, max_time: float | None = None,
                    seed: int = 0, max_gradients: int | None = None, payload_bytes: int | None = None,
                    push_bytes: int | None = None, overlap: bool = False, sizes=None) -> "ScheduleStream":
    """`simulate_schedule` (same arguments, checked here) as a `ScheduleStream`: nothing
    is simulated until it is advanced."""
    from staleness import cluster as _cluster

    policy, cluster = _policies.resolve(policy), _cluster.resolve(cluster)
    if num_updates is None and max_time is None and max_gradients is None:
        raise ValueError("simulate_schedule: give a budget: num_updates, max_time or max_gradients")
    checks.at_least("num_updates", num_updates, 1, allow_none=True)
    checks.seconds("max_time", max_time, allow_none=True)
    if max_gradients is not None and (not isinstance(max_gradients, (int, np.integer)) or max_gradients < 1):
        raise ValueError(f"max_gradients = {max_gradients!r} must be an integer >= 1")
    if not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed = {seed!r} must be an integer")
    pull_b = _bytes_arg("payload_bytes", payload_bytes)
    push_b = _bytes_arg("push_bytes", push_bytes)
    if push_b is not None and pull_b is None:
        raise ValueError(f"simulate_schedule: push_bytes = {push_bytes!r} needs payload_bytes (the bytes "
                         f"of the parameters pulled); pass payload_bytes too")
    if not isinstance(overlap, bool):
        raise ValueError(f"simulate_schedule: overlap = {overlap!r} must be True or False")
    budgets = (int(num_updates) if num_updates is not None else math.inf,
               float(max_time) if max_time is not None else math.inf,
               int(max_gradients) if max_gradients is not None else math.inf)

    if sizes is not None and not callable(sizes):
        raise ValueError(f"simulate_schedule: sizes = {sizes!r} must be a function (worker, iteration) -> steps "
                         "(or None)")
    lam = cluster.num_workers
    sampler = cluster.sampler(int(seed))
    learner = policy.work.learner_seconds if policy.learner else None   # optional (staleness.policies.work)
    driver = Driver(policy, lam, 0.0, complete_later=policy.learner)
    steps = policy.work.steps_per_worker(cluster.mean_seconds)
    one_step = sampler.compute_time
    if sizes is not None:
        def one_step(w, it, start, _base=sampler.compute_time):
            return _base(w, it, start) * sizes(w, it)
    compute_time, forget = policy.work.timing(one_step, steps, lam)

    nbytes = None if pull_b is None else (pull_b, pull_b if push_b is None else push_b)
    collective = sampler.allreduce is not None and policy.aggregation.all_live
    shared = sampler.server is not None and nbytes is not None and nbytes != (0, 0)
    if learner is not None:
        if collective or shared:
            raise ValueError(f"simulate_schedule: cluster = {cluster.describe()!r} has an all-reduce or a shared "
                             f"server link, which are not modelled for policy {policy.describe()!r} (a learner); "
                             "give the workers their own links (+net=BANDWIDTH:LATENCY)")
        train = _Learner(learner, sizes, float(np.mean(cluster.mean_seconds)), lam, policy.work.inflight,
                         policy.work.refill)
        events = _Independent(driver, sampler, compute_time, forget, nbytes, overlap, train).run(budgets)
    elif collective or shared:
        if policy.grace or policy.merges:
            raise ValueError(f"simulate_schedule: policy {policy.describe()!r} has a synchronization window, which "
                             f"is not modelled on cluster {cluster.describe()!r} (a shared server link); give the "
                             "workers their own links (+net=BANDWIDTH:LATENCY)")
        events = _Network(driver, sampler, compute_time, forget, nbytes or (0, 0), overlap, collective).run(budgets)
    else:
        events = _Independent(driver, sampler, compute_time, forget, nbytes, overlap, None, steps).run(budgets)

    # Gradients pushed but not aggregated when the budget ran out are not part of the run.
    meta = {} if steps is None else {"local_steps": list(steps)}
    if nbytes is not None or overlap or collective:
        meta["network"] = {"payload_bytes": nbytes[0] if nbytes else None,
                           "push_bytes": nbytes[1] if nbytes else None, "overlap": overlap,
                           "aggregation": "allreduce" if collective else ("server" if shared else "links")}

    def finish(now: float) -> Schedule:
        _check_not_stalled(driver, policy)
        sched = driver.to_schedule(policy=policy, cluster=cluster.describe(), seed=int(seed),
                                   end_time=float(now), meta=meta)
        if sampler.partial:   # elastic learners: goodput counts their full-rate compute (`Schedule.goodput`)
            c, ok = sched.columns, sched.applied
            sched.meta["useful_seconds"] = float(sum(sampler.useful(int(w), float(a), float(b)) for w, a, b in
                                                     zip(c["worker"][ok], c["start"][ok], c["end"][ok])))
        return sched

    steady = next(sampler.membership(), None) is None
    return ScheduleStream(events, driver, finish, budgets, steady, cluster.describe(), int(seed), meta)


class ScheduleStream:
    """A simulation run piece by piece (`stream_schedule`), so that the compiled replay of
    its first updates overlaps the simulation of the next ones (`engine.run.simulate`).

    `advance(n)` runs the events until `n` updates are completed (or the run ended) and
    returns how many are; `driver.rec` then holds their rows (`Recorder`; rows still
    buffered for an update are not applied yet). `finish()` runs the rest and returns the
    `Schedule`, the same as `simulate_schedule`'s: pausing changes no event, and neither
    does a Ctrl-C (raised between two events, `EVENTS_PER_BLOCK`), after which the stream
    can still be finished.
    Attributes: `driver`, `num_updates` (the update budget; None: none), `bounded` (the
    updates are the only budget), `steady` (no worker ever fails or joins, so the run
    reaches its update budget unless its policy stalls), and as a `Schedule` has them
    `policy`, `num_workers`, `cluster` (its description), `seed`, `meta` (so far)."""

    def __init__(self, events, driver, finish, budgets, steady: bool, cluster: str, seed: int, meta: dict):
        self.driver = driver
        self.num_updates = None if budgets[0] == math.inf else int(budgets[0])
        self.bounded = self.num_updates is not None and budgets[1] == math.inf and budgets[2] == math.inf
        self.steady = steady
        self.policy, self.num_workers, self.cluster, self.seed = driver.policy, driver.num_workers, cluster, seed
        self.meta = meta
        self._events, self._finish, self._now = events, finish, None
        self._failed = False

    @property
    def ended(self) -> bool:
        return self._now is not None

    def advance(self, num_updates: int) -> int:
        state = self.driver.state
        while self._now is None and state.completed < num_updates:
            with interrupts.deferred():   # Ctrl-C lands between two blocks of events, never inside one
                self._run(num_updates)
        return state.completed

    def _run(self, num_updates: int) -> None:
        """Up to `EVENTS_PER_BLOCK` events, until `num_updates` are completed or the run ended.
        An exception inside an event ends the simulation's generator: later calls say so
        (rather than wait forever for an end that cannot come)."""
        if self._failed:
            raise RuntimeError("ScheduleStream: the simulation ended with an error earlier; it cannot go on")
        state = self.driver.state
        for _ in range(EVENTS_PER_BLOCK):
            if state.completed >= num_updates:
                return
            try:
                next(self._events)
            except StopIteration as stop:
                self._now = stop.value
                return
            except BaseException:
                self._failed = True
                raise

    def finish(self) -> Schedule:
        self.advance(math.inf)
        return self._finish(self._now)


def _check_not_stalled(driver, policy) -> None:
    """A run that ran out of events with live workers all waiting at the gate and none
    computing can never go on: the policy deadlocked (a bug in a gate, or a gate whose
    level cannot rise once its workers wait). Say so rather than return a short run."""
    state = driver.state
    live = [w for w in range(driver.num_workers) if state.live[w]]
    if live and all(driver.inflight[w] is None for w in live) and all(state.blocked[w] for w in live):
        raise RuntimeError(f"simulate_schedule: policy {policy.describe()!r} deadlocked after "
                           f"{state.completed} updates: every live worker waits at the gate and none is computing")


def _byte_seconds(nbytes: int, bandwidth) -> list[float]:
    """[W] seconds of the data phase of `nbytes` on each worker's own link."""
    return [nbytes / b if nbytes and b != math.inf else 0.0 for b in bandwidth]


class _Learner:
    """Asynchronous RL's learner: it trains one decided update at a time, each for
    `seconds(sizes of its rows, mean step seconds, λ)`; `decided` returns when the
    update just decided will be trained.

    In-flight weight updates (`inflight`, PipelineRL): every completed version is sent to
    the actors mid-rollout, arriving `delay(worker, iteration)` later (the pull's transfer)
    and taken between two tokens without pausing the decode (the transfer overlaps it). A
    pushed rollout's switches are recorded on the recorder (`Recorder.segments`): the first
    decoded token, counting its prefill in the simulator's size units, of each newer
    version that arrived while it decoded.

    Partial rollouts (`refill` not None, AReaL): such a version interrupts the decode
    instead: after the token in progress the actor pauses for the transfer again and
    `refill` token-times (`interrupt`), so the rollout's end moves later; the switches
    are then kept per actor as they happen ((iteration, `inflight.Decode`)) rather than rebuilt
    at the push."""

    def __init__(self, seconds, sizes, mean_step: float, num_workers: int, inflight: bool = False,
                 refill: float | None = None):
        self.seconds, self.sizes, self.mean_step, self.num_workers = seconds, sizes, mean_step, num_workers
        self.row_size: dict[int, float] = {}
        self.free = 0.0
        self.inflight = inflight
        self.refill = refill
        self.decoding: list[tuple | None] = [None] * num_workers   # partial rollouts: each actor's rollout
        self.delay = None                       # (worker, iteration) -> seconds, set by the event loop
        self.times: list[float] = []            # completion time of version v + 1 at index v

    def attach(self, rec, sampler, nbytes) -> None:
        """Record in-flight switches on `rec`; a version reaches an actor after the pull's
        latency and the parameters' bytes (`nbytes` = (pull, push) or None) on its link."""
        if not self.inflight:
            return
        rec.segments = {}
        data = _byte_seconds(nbytes[0], sampler.bandwidth) if nbytes else [0.0] * self.num_workers
        pull_delay = sampler.pull_delay
        self.delay = lambda w, it: pull_delay(w, it) + data[w]

    def pushed(self, rec, row: int | None, start: float, end: float) -> None:
        """Row `row` of the recorder `rec` was pushed after decoding from `start` to `end`:
        remember its rollout's size (and record its in-flight switches)."""
        if row is None:
            return
        worker, iteration, pulled = rec.rows[row][:3]
        size = self.size(worker, iteration)
        self.row_size[row] = size
        if self.refill is not None:
            switches = self.decoding[worker][1].switches
        elif self.inflight:
            switches = self.switches(pulled, start, end, size, self.delay(worker, iteration))
        else:
            return
        if switches:
            rec.segments[row] = switches

    def size(self, worker: int, iteration: int) -> float:
        return 1.0 if self.sizes is None else float(self.sizes(worker, iteration))

    def began(self, worker: int, iteration: int, start: float, end: float) -> None:
        """Partial rollouts: `worker` decodes iteration `iteration` from `start`, until `end`
        if nothing interrupts it."""
        if self.refill is not None:
            size = self.size(worker, iteration)
            tau = (end - start) / size if size > 0 else 0.0
            self.decoding[worker] = (iteration, Decode(start, end, size, self.delay(worker, iteration)
                                                       + self.refill * tau))

    def interrupt(self, now: float, inflight) -> list:
        """Partial rollouts: version len(times) completed at `now` and interrupts the rollouts
        it reaches mid-decode (`inflight`: the driver's [λ] in-flight iterations, whose
        pulled version is older); [(worker, its rollout's new end), ...] of those that moved."""
        if self.refill is None:
            return []
        v = len(self.times)
        moved = []
        for w, f in enumerate(inflight):
            if f is None or f[1] >= v:
                continue
            it, d = self.decoding[w]
            if d.arrive(now + self.delay(w, it), v):
                moved.append((w, d.end))
        return moved

    def switches(self, pulled: int, start: float, end: float, size: float, delay: float) -> list:
        """[(first decoded token, version), ...] of the versions newer than `pulled` that
        reach the actor while it decodes [start, end) tokens of `size` (`inflight.Decode`)."""
        d = Decode(start, end, size)
        for v in range(pulled + 1, len(self.times) + 1):
            arrive = self.times[v - 1] + delay
            if arrive >= end:
                break
            d.arrive(arrive, v)
        return d.switches

    def trained(self, now: float) -> None:
        """The oldest decided update finished training at `now`."""
        self.times.append(now)

    def decided(self, rows, now: float) -> float:
        took = self.seconds([self.row_size.pop(r, 1.0) for r in rows], self.mean_step, self.num_workers)
        self.free = max(now, self.free) + took
        return self.free


class _EventLoop:
    """The one event loop of every cluster kind: a heap of (time, sequence, kind, a, b)
    entries and a handler per kind (`handlers`) returning the releases its event caused
    (None: the event changed nothing). Membership changes (fail, join), the learner's and
    the window's share of an event's outcome (`released`), the budgets and the pauses (`run`
    yields after each event that completed updates) are handled here, once. A cluster kind
    (`_Independent`, `_Network`) adds its own events and says how a released worker is
    scheduled (`release`), what a failure cuts off (`cut`) and which bytes it lost (`lost`)."""

    learner: _Learner | None = None
    window: SyncWindow | None = None

    def __init__(self, driver, sampler, compute_time, forget):
        self.driver, self.sampler, self.compute_time, self.forget = driver, sampler, compute_time, forget
        self.epoch, self.live, self.rec = driver.epoch, driver.state.live, driver.rec
        self.span: list = [None] * driver.num_workers   # (start, end) of each worker's in-flight computation
        self.heap: list = []
        self.seq = 0
        self.pushed = 0
        self.budgets = (math.inf, math.inf, math.inf)
        self.handlers = {_FAIL: self.on_fail, _JOIN: self.on_join}

    def push_event(self, t, kind, a=-1, b=-1) -> int:
        """Queue an event; its sequence number (ties at equal times go in queueing order)."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))
        return self.seq

    def release(self, rel, now: float) -> None:
        raise NotImplementedError

    def cut(self, w: int, t: float) -> tuple:
        """(start, end) of the computation that `w`'s failure at `t` loses."""
        return self.span[w]

    def lost(self, w: int, t: float, row) -> None:
        """`w` failed at `t`, losing recorded row `row` (None: none): its bytes."""

    def joined(self, w: int) -> None:
        """`w` (re)joins."""

    def exhausted(self) -> bool:
        return self.driver.state.completed >= self.budgets[0] or self.pushed >= self.budgets[2]

    def released(self, step, t: float):
        """What `step` (a driver outcome at `t`) releases now: a decided update goes to the
        learner (a `_TRAINED` event when trained); an open window holds the releases."""
        if self.learner is not None and step.applied is not None:
            self.push_event(self.learner.decided(step.applied, t), _TRAINED)
        return step.released if self.window is None else self.window.hold(step.released, t)

    def on_fail(self, t, s, w, b):
        if not self.live[w]:
            return None
        step = self.driver.fail(w, t, *self.cut(w, t))
        self.lost(w, t, step.row)
        if self.forget is not None:
            self.forget(w)
        return self.released(step, t)

    def on_join(self, t, s, w, b):
        if self.live[w]:
            return None
        self.joined(w)
        return self.released(self.driver.join(w, t), t)

    def run(self, budgets):
        """Run the events until the budgets (updates, seconds, gradients) run out: a generator
        yielding after each event that completed updates (`ScheduleStream` pauses there),
        returning the simulated time at which the run stopped."""
        self.budgets = budgets
        time_budget, heap, handlers = budgets[1], self.heap, self.handlers
        feed = _membership_feed(self.sampler, lambda t, s, kind, w: heapq.heappush(heap, (t, s, kind, w, -1)))
        for rel in self.driver.start(0.0):
            self.release(rel, 0.0)
        state, heappop = self.driver.state, heapq.heappop
        now = 0.0
        completed = 0
        while heap:
            t, s, kind, a, b = heappop(heap)
            if t > time_budget:
                return time_budget
            if kind in _MEMBERSHIP_KINDS:
                feed()
                if kind == _HIDDEN:
                    continue
            now = t
            released = handlers[kind](t, s, a, b)
            if released is None:
                continue
            for rel in released:
                self.release(rel, t)
            if self.exhausted():
                break
            if state.completed != completed:
                completed = state.completed
                yield completed
        return now


class _Independent(_EventLoop):
    """Every transfer's time is fixed when it starts: one `_PUSH` entry per gradient, one
    valid per worker (`due`: its sequence number; `arrive_at`: when it arrives). With a
    `learner`, one `_TRAINED` entry per update, completed when trained; with partial
    rollouts an update that interrupts a rollout moves its push (`move`: a new entry, the
    old one skipped). With a grace window, a `_CLOSE` entry per window."""

    def __init__(self, driver, sampler, compute_time, forget, nbytes, overlap: bool, learner, steps=None):
        super().__init__(driver, sampler, compute_time, forget)
        lam = driver.num_workers
        self.span = [(0.0, 0.0)] * lam
        self.nbytes, self.overlap = nbytes, overlap
        self.push_delay, self.pull_delay = sampler.push_delay, sampler.pull_delay
        pull_n, push_n = nbytes or (0, 0)
        self.pdur, self.qdur = _byte_seconds(pull_n, sampler.bandwidth), _byte_seconds(push_n, sampler.bandwidth)
        self.due = [0] * lam
        self.arrive_at = [math.inf] * lam
        self.learner = learner
        self.began = None if learner is None or learner.refill is None else learner.began
        if learner is not None:
            learner.attach(self.rec, sampler, nbytes)
        self.rec.row_bytes = nbytes or (0, 0)
        if driver.policy.grace or driver.policy.merges:
            def step_seconds(w, now, _steps=steps):   # an adaptive window's estimates from `w`'s push
                start, end = self.span[w]
                return (end - start) / (1 if _steps is None else _steps[w]), now - end
            def arrivals(end, _at=self.arrive_at, _inflight=driver.inflight):   # O(λ): the pushes in flight by `end`
                return [a for w, a in enumerate(_at) if _inflight[w] is not None and a <= end]
            self.window = SyncWindow(driver.policy, driver.inflight, driver.state.table, step_seconds, arrivals,
                                     driver.pushed_key)
        self.handlers.update({_PUSH: self.on_push, _CLOSE: self.on_close, _TRAINED: self.on_trained})

    def queue(self, w: int, it: int, ep: int, start: float, end: float) -> None:
        """`w` computes iteration `it` from `start` to `end`: queue its push's arrival."""
        self.span[w] = (start, end)
        if self.overlap:
            arrive = max(start + self.qdur[w], end) + self.push_delay(w, it)
        else:
            arrive = end + (self.push_delay(w, it) + self.qdur[w])
        self.arrive_at[w] = arrive
        self.due[w] = self.push_event(arrive, _PUSH, w, ep)

    def release(self, rel, now: float) -> None:
        """A released worker pulls (latency + bytes / bandwidth), computes, and pushes."""
        w, it, _, ep = rel
        start = now + (self.pull_delay(w, it) + self.pdur[w])
        end = start + self.compute_time(w, it, start)
        if self.began is not None:
            self.began(w, it, start, end)
        self.queue(w, it, ep, start, end)

    def lost(self, w: int, t: float, row) -> None:
        if self.nbytes is not None and row is not None and t < self.span[w][0 if self.overlap else 1]:
            self.rec.set_bytes(row, self.nbytes[0], 0)   # its push had not left yet: only the pull's bytes moved
        if self.window is not None:
            for until, key in self.window.opens(t, arrived=None):
                self.push_event(until, _CLOSE, key)   # fewer live learners: a quorum may be met now

    def on_push(self, t, s, w, ep):
        if ep != self.epoch[w] or s != self.due[w]:
            return None   # its worker failed since, or its push moved
        step = self.driver.push(w, t, *self.span[w])
        self.pushed += 1
        if self.learner is not None:
            self.learner.pushed(self.rec, step.row, *self.span[w])
        if self.window is not None:
            for until, key in self.window.opens(t, w):
                self.push_event(until, _CLOSE, key)
        return self.released(step, t)

    def on_close(self, t, s, a, b):
        merged, held = self.window.close(self.driver, t, a)
        return held if merged is None else list(merged.released) + held

    def on_trained(self, t, s, a, b):
        step = self.driver.complete(t)
        self.learner.trained(t)
        inflight = self.driver.inflight
        for v, end in self.learner.interrupt(t, inflight):
            self.queue(v, inflight[v][0], self.epoch[v], self.span[v][0], end)   # an interrupted rollout ends later
        return self.released(step, t)


class _Network(_EventLoop):
    """Transfers that interact: a shared server link (processor sharing) or all-reduce rounds.

    Per worker: release -> pull (a flow on the link, then its latency) -> compute
    -> push (a flow, then its latency) -> arrival; or, in all-reduce rounds,
    release -> compute -> wait for the round's collective -> arrival. Its events: a link
    completion, a push's data start, a compute end, an arrival, a collective's end."""

    def __init__(self, driver, sampler, compute_time, forget, nbytes, overlap: bool, collective: bool):
        super().__init__(driver, sampler, compute_time, forget)
        lam = driver.num_workers
        self.overlap, self.collective = overlap, collective
        self.pull_n, self.push_n = nbytes
        self.push_delay, self.pull_delay = sampler.push_delay, sampler.pull_delay
        self.bw = sampler.bandwidth
        self.pdur = _byte_seconds(self.pull_n, self.bw)
        self.default_bytes = (0, self.push_n) if collective else (self.pull_n, self.push_n)
        self.rec.row_bytes = self.default_bytes
        self.link = SharedLink(sampler.server[0]) if sampler.server is not None and not collective else None
        self.allreduce = sampler.allreduce if collective else None
        # per worker, for its in-flight iteration
        self.iteration = [0] * lam
        self.flow = [-1] * lam                  # its flow on the link (-1: none)
        self.flow_owner: dict[int, tuple[int, bool]] = {}   # flow id -> (worker, is_pull)
        self.pulled = [0] * lam                 # bytes of its pull
        self.push_begun = [False] * lam         # its push's bytes have started to leave
        self.computed = [False] * lam
        self.data_done = [False] * lam          # overlap: its push's data phase is over
        self.fresh = [False] * lam              # all-reduce rounds: it (re)joined and must fetch parameters
        self.computing: set[int] = set()        # all-reduce rounds: live workers still before their compute end
        self.waiting: list[int] = []            # all-reduce rounds: workers waiting for the next collective
        self.rounds: dict[int, list] = {}       # collective id -> [(worker, epoch), ...], in arrival order
        self.next_round = 0
        self.handlers.update({_LINK: self.on_link, _PULLED: self.on_pulled, _COMPUTED: self.on_computed,
                              _PUSH: self.on_push, _REDUCED: self.on_reduced})

    # -- helpers -----------------------------------------------------------------------------
    def retime(self, now: float) -> None:
        """The link's rates changed: queue its next completion under its new token."""
        nc = self.link.next_completion()
        if nc is not None:
            self.push_event(nc[0], _LINK, nc[1], self.link.token)

    def add_flow(self, now: float, w: int, n: int, is_pull: bool) -> None:
        fid = self.link.add(now, n, self.bw[w])
        self.flow[w] = fid
        self.flow_owner[fid] = (w, is_pull)
        self.retime(now)

    def begin(self, w: int, start: float) -> None:
        """`w`'s parameters arrive at `start`: draw its compute and queue what follows."""
        end = start + self.compute_time(w, self.iteration[w], start)
        self.span[w] = (start, end)
        ep = self.epoch[w]
        if self.overlap and self.push_n and not self.collective:
            self.push_event(start, _PULLED, w, ep)   # its push's data starts with the compute
        self.push_event(end, _COMPUTED, w, ep)

    def release(self, rel, now: float) -> None:
        w, it, _, ep = rel
        self.iteration[w] = it
        self.span[w] = None
        self.push_begun[w] = self.computed[w] = self.data_done[w] = False
        if self.collective:
            self.computing.add(w)
            if self.fresh[w]:
                self.fresh[w] = False
                self.pulled[w] = self.pull_n
                self.begin(w, now + (self.pull_delay(w, it) + self.pdur[w]))
            else:
                self.pulled[w] = 0
                self.begin(w, now)
            return
        self.pulled[w] = self.pull_n
        if self.pull_n:
            self.add_flow(now, w, self.pull_n, True)
        else:
            self.begin(w, now + self.pull_delay(w, it))

    def start_collective(self, now: float) -> None:
        """No live worker is computing: the waiting ones all-reduce now."""
        parts = list(self.waiting)
        self.waiting.clear()
        algorithm, ar_bw, ar_lat = self.allreduce
        bw_part, lat_part = allreduce_parts(algorithm, self.push_n, len(parts), ar_bw, ar_lat)
        if self.overlap:
            last_start = max(self.span[w][0] for w in parts)
            done = max(now, last_start + bw_part) + lat_part
        else:
            done = now + (bw_part + lat_part)
        for w in parts:
            self.push_begun[w] = True
        self.rounds[self.next_round] = [(w, self.epoch[w]) for w in parts]
        self.push_event(done, _REDUCED, self.next_round)
        self.next_round += 1

    def record_bytes(self, w: int, row) -> None:
        b = (self.pulled[w], self.push_n if self.push_begun[w] else 0)
        if row is not None and b != self.default_bytes:
            self.rec.set_bytes(row, *b)

    def arrive(self, t, w) -> None:
        """`w`'s push is in flight for its latency, then arrives."""
        self.push_event(t + self.push_delay(w, self.iteration[w]), _PUSH, w, self.epoch[w])

    def push(self, t, w):
        step = self.driver.push(w, t, *self.span[w])
        self.record_bytes(w, step.row)
        self.pushed += 1
        return step.released

    # -- events ------------------------------------------------------------------------------
    def on_link(self, t, s, fid, token):
        if token != self.link.token:
            return None   # the rates changed since this completion was queued
        self.link.remove(t, fid)
        w, is_pull = self.flow_owner.pop(fid)
        self.flow[w] = -1
        self.retime(t)
        if is_pull:
            self.begin(w, t + self.pull_delay(w, self.iteration[w]))
        elif not self.overlap or self.computed[w]:
            self.arrive(t, w)
        else:
            self.data_done[w] = True
        return None

    def on_pulled(self, t, s, w, ep):   # overlap: the push's data phase starts with the compute
        if ep == self.epoch[w]:
            self.push_begun[w] = True
            self.add_flow(t, w, self.push_n, False)
        return None

    def on_computed(self, t, s, w, ep):
        if ep != self.epoch[w]:
            return None   # its worker failed (or rejoined) since
        self.computed[w] = True
        if self.collective:
            self.computing.discard(w)
            self.waiting.append(w)
            if not self.computing:
                self.start_collective(t)
        elif not self.push_n:
            self.arrive(t, w)
        elif self.overlap:
            if self.data_done[w]:
                self.arrive(t, w)
        else:
            self.push_begun[w] = True
            self.add_flow(t, w, self.push_n, False)
        return None

    def on_push(self, t, s, w, ep):
        return self.push(t, w) if ep == self.epoch[w] else None

    def on_reduced(self, t, s, round_id, b):
        """The collective ended: every participant's push arrives, until the budget runs out."""
        for w, ep in self.rounds.pop(round_id):
            if ep != self.epoch[w]:
                continue   # it failed during the collective: recorded as lost then
            for rel in self.push(t, w):
                self.release(rel, t)
            if self.exhausted():
                break
        return ()

    def cut(self, w: int, t: float) -> tuple:
        start_end = self.span[w]
        if self.flow[w] >= 0:   # a transfer cut off: its bytes are lost
            fid = self.flow[w]
            if start_end is None:   # mid-pull: when it would have started at the current rates
                it = self.iteration[w]
                est = t + self.link.remaining(fid, t) / self.link.rate(fid) + self.pull_delay(w, it)
                start_end = (est, est + self.compute_time(w, it, est))
            self.link.remove(t, fid)
            del self.flow_owner[fid]
            self.flow[w] = -1
            self.retime(t)
        return (t, t) if start_end is None else start_end   # (t, t): blocked at its gate, no row

    def lost(self, w: int, t: float, row) -> None:
        self.record_bytes(w, row)
        if self.collective:
            self.computing.discard(w)
            if w in self.waiting:
                self.waiting.remove(w)
            if self.waiting and not self.computing:
                self.start_collective(t)

    def joined(self, w: int) -> None:
        self.fresh[w] = True


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
