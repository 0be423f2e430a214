"""The serve loop: the shared policy gates real workers; updates are jitted.

One loop for every way of executing a run: a builder (`runtime.build`) hands it
a transport (`ServerLink`: where releases go and events come from) and an
update function (e.g. `Numerics.update`, `CollectiveLink.update`). The loop owns
the parameters and the optimizer state and drives the policy through
`staleness.driver.Driver` with real time (seconds since the run's start),
exactly as the simulator drives it with simulated time: a gradient arrives
(`policy.push`, record its row, apply an update, release workers), a worker is
lost (its process died, it exceeded `worker_timeout`, or the cluster's failure
model: `policy.fail`), a worker rejoins (`policy.join`).

Each wait on the transport is bounded (`TICK_SECONDS`), so stop requests,
deadlines, failure events and progress are checked even when nothing arrives.
A collective round's loss arrives as a `LateLoss` (still on the devices),
fetched later with others in one transfer (`_settle`) before any divergence
check, checkpoint or progress report. Checkpoints keep `saved_state()`, the
explicit `ServerState`; `restore(state)` continues from one (`PolicyCalls`).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from staleness.infra import interrupts
from staleness.driver import Driver, Recorder, SyncWindow
from staleness.runtime.errors import WorkerError, WorkerLostError
from staleness.runtime.messages import LateLoss, Release, WorkerFailed, WorkerJoined, WorkerLost
from staleness.runtime.transport import Arrival, ServerLink

__all__ = ["Server", "ServerState", "PolicyCalls", "Diverged", "TICK_SECONDS", "SETTLE_EVERY", "PROGRESS_SECONDS"]

TICK_SECONDS = 0.05  # longest wait on the transport between housekeeping checks
SETTLE_EVERY = 4096  # late losses fetched at least this often (rows)
PROGRESS_SECONDS = 0.5  # how often the progress callback is called


class Diverged(FloatingPointError):
    """A gradient with a non-finite loss was applied (message names it)."""


class PolicyCalls:
    """The calls a run makes to its policy (`init`, then `push` / `fail` / `join`), in order.

    Policies are deterministic (a user's too), so a run that checkpoints hands the driver
    this object in place of its policy (it forwards each call and records its plain-number
    arguments) and a resumed run rebuilds the `SyncState` by making the same calls again (`replay`).

    start: the `now` of `init` (None until it was called); calls: [('push', worker,
    pull_version, now) | ('fail', worker, now) | ('join', worker, now) | ('merge', now[, count]): a
    merging window's close (`Policy.merge`)].
    """

    def __init__(self, policy, start: float | None = None, calls=()):
        self.policy = policy
        self.merge_keys = getattr(policy, "merge_keys", 1)   # read by the driver
        self.start = start
        self.calls = [tuple(c) for c in calls]

    def init(self, num_workers: int, now: float = 0.0):
        state = self.policy.init(num_workers, now)
        self.start = float(now)
        return state

    def push(self, state, worker: int, pull_version: int, now: float):
        out = self.policy.push(state, worker, pull_version, now)
        self.calls.append(("push", worker, pull_version, now))
        return out

    def fail(self, state, worker: int, now: float):
        out = self.policy.fail(state, worker, now)
        self.calls.append(("fail", worker, now))
        return out

    def join(self, state, worker: int, now: float):
        out = self.policy.join(state, worker, now)
        self.calls.append(("join", worker, now))
        return out

    def merge(self, state, now: float, count: int | None = None):
        out = self.policy.merge(state, now, count)
        self.calls.append(("merge", now) if count is None else ("merge", now, count))
        return out

    def complete(self, state, now: float):
        """Not recorded: the server completes every update as it decides it, and
        `replay` does the same."""
        return self.policy.complete(state, now)

    def replay(self, num_workers: int):
        """The policy's `SyncState` after these calls (made again on a fresh state)."""
        if self.start is None:
            raise ValueError("resume: the checkpoint records no start of the policy")
        policy = self.policy
        state = policy.init(num_workers, self.start)
        for kind, *args in self.calls:
            if kind not in ("push", "fail", "join", "merge"):
                raise ValueError(f"resume: unknown policy call {(kind, *args)!r} in the checkpoint")
            if getattr(policy, kind)(state, *args).update:   # the server completes each update when it decides it
                policy.complete(state, args[0] if kind == "merge" else args[-1])
        return state


@dataclasses.dataclass
class ServerState:
    """What the serve loop continues a run from (what a checkpoint keeps).

    params, opt_state: the version the checkpoint was taken at (right after an update).
    policy_start, policy_calls: the policy's calls so far (`PolicyCalls`): its SyncState
      is rebuilt from them.
    recorder: the trace so far. rows: evaluated history rows. epoch: [λ] membership
    epochs. lost_for_real: workers lost to a fault (they rejoin on resume). elapsed:
    seconds recorded (the resumed run's times continue from there). checked: rows whose
    loss was checked for divergence. inner: a local-update method's worker states
    ({worker: (iteration, state)}, `runtime.numerics.Numerics.inner_at`).
    """

    params: Any
    opt_state: Any
    policy_start: float
    policy_calls: list
    recorder: Recorder
    rows: list
    epoch: list
    lost_for_real: list
    elapsed: float
    checked: int
    inner: dict = dataclasses.field(default_factory=dict)


class Server:
    """Parameter server of one real run (see the module docstring).

    Args:
      spec: the run (`runtime.spec.RunSpec`, its fields as in `runtime.run`): max_time
        counts resumed runs' seconds too; worker_timeout does not count seconds the loop
        itself spent blocked in one step longer than a tick; failures of the cluster's
        failure model (`spec.membership`) always continue.
      link: the server's end of the transport.
      update: the update function (params, opt_state, grads, staleness, update, zeros, workers)
        -> (params, opt_state), e.g. `Numerics.update` or `CollectiveLink.update`.
      params, opt_state: version 0, on the server's device (`restore` puts a checkpoint's).
      zeros: params-shaped zeros on the server's device (pads update slots), or None.
      row_bytes: (pull, push) bytes one gradient moves on this transport (trace columns).
      progress: callable(dict) called about every `PROGRESS_SECONDS`, or None.
      on_checkpoint: callable(server) called every `spec.checkpoint_every` updates (it
        reads `saved_state()`), right after the update, or inside a synchronization window
        at its close (`_quiet`).
      stop_event: a threading.Event that stops the run (status 'stopped') when set.
      clock: seconds (default `time.monotonic`).
    """

    def __init__(self, spec, *, link: ServerLink, update, params, opt_state, zeros=None,
                 row_bytes: tuple[int, int] = (0, 0), progress: Callable | None = None,
                 on_checkpoint: Callable | None = None, stop_event: threading.Event | None = None,
                 clock=time.monotonic):
        self.spec = spec
        self.policy = spec.policy
        self.num_workers = num_workers = spec.num_workers
        self.update = update
        self.params = params
        self.opt_state = opt_state
        self.zeros = zeros
        self.link = link
        self.num_updates = int(spec.num_updates)
        self.max_time = spec.max_time
        self.eval_every = max(1, int(spec.eval_every))
        self.worker_timeout = float(spec.worker_timeout)
        self.on_worker_failure = spec.on_worker_failure
        self.membership: deque = deque()        # (seconds, 'fail' | 'join', worker) still due (made at `start`)
        self.progress = progress
        self.progress_every = PROGRESS_SECONDS
        self.checkpoint_every = spec.checkpoint_every
        self.on_checkpoint = on_checkpoint if spec.checkpoint_every else None
        self.stop_event = stop_event or threading.Event()
        self.clock = clock

        self.driver: Driver | None = None       # the control plane (made at `start`)
        self.window: SyncWindow | None = None   # a policy's synchronization window (made at `start`)
        self.close_at: dict[int, float] = {}    # when each open window closes, by merge key (`SyncWindow`)
        self._span = [(0.0, 0.0)] * num_workers   # each worker's last computation (an adaptive window's estimates)
        self.rec = Recorder()                   # the trace (the driver's, from `start`)
        self.row_bytes = (int(row_bytes[0]), int(row_bytes[1]))
        self.busy = 0.0                         # seconds spent handling events (not waiting for them)
        self._late: list[tuple[int, object, int]] = []   # (row, device losses, index) not fetched yet
        self._saved: ServerState | None = None  # the state `restore` set, to `start` from
        self._calls: PolicyCalls | None = None  # the policy's calls (recorded when the run checkpoints)
        self.lost_for_real: set[int] = set()    # lost by a fault (not by the failure model)
        self.grads: dict[int, tuple[object, int]] = {}   # row -> (gradient, pull version) awaiting an update
        self.snapshots: list[tuple[int, object]] = [(0, params)]   # (update, params) to evaluate
        self.rows: list[dict] = []              # evaluated history rows
        self.t_offset = 0.0                     # seconds recorded before a resume
        self.t0 = None
        self.end_time = None                    # seconds since the start when serving ended
        self.status = "running"
        self._checked = 0                       # rows whose loss was checked for divergence
        self._last_progress = -math.inf
        self._last_deadline_check = -math.inf
        self.blocked = 0.0                      # seconds the loop spent in steps longer than a tick
        self._blocked_at = [0.0] * num_workers  # `blocked` when each worker was last released
        self._progress_mark = (0.0, 0, 0, 0.0)
        self._due = False                       # a checkpoint is due (taken once `_quiet`)

    # -- saved state -------------------------------------------------------------
    def restore(self, saved: ServerState) -> None:
        """Continue from `saved` (a checkpoint's state, its arrays already placed) at `start`."""
        self._saved = saved
        self.params, self.opt_state = saved.params, saved.opt_state
        self.rec = saved.recorder
        self.rows = list(saved.rows)
        self.snapshots = []
        self.lost_for_real = set(saved.lost_for_real)
        self.t_offset = float(saved.elapsed)
        self._checked = int(saved.checked)

    def saved_state(self) -> ServerState:
        """The state a checkpoint keeps (taken right after an update; needs `on_checkpoint`,
        under which the policy's calls are recorded)."""
        if self.pending_rows():  # cannot happen right after an update; guard the invariant anyway
            raise RuntimeError("checkpoint: gradients are buffered; checkpoints are taken right after an update")
        if self._calls is None:
            raise RuntimeError("checkpoint: the policy's calls were not recorded (a Server without on_checkpoint)")
        self._settle()
        return ServerState(params=self.params, opt_state=self.opt_state, policy_start=self._calls.start,
                           policy_calls=list(self._calls.calls), recorder=self.rec, rows=list(self.rows),
                           epoch=list(self.driver.epoch), lost_for_real=sorted(self.lost_for_real),
                           elapsed=self.now(), checked=self._checked)

    # -- time --------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the run's start (continuing across a resume)."""
        return self.clock() - self.t0 + self.t_offset

    @property
    def state(self):
        """The policy's SyncState (None before `start`)."""
        return self.driver.state if self.driver is not None else None

    # -- the driver step, and what the server does with it ---------------------------------
    def _send(self, released) -> None:
        """Offer the current parameters to each released (worker, iteration, version, epoch)."""
        for w, it, v, ep in released:
            self._blocked_at[w] = self.blocked
            self.link.release(Release(w, it, v, ep), self.params)

    def _do(self, step, now: float) -> None:
        if step.applied is not None and self.driver.complete_later:
            # a learner (asynchronous RL): workers released with the decision generate on the
            # version before it while the update is computed; the update's own version
            # releases the rest when it is complete
            self._send(step.released)
            self._apply(step.applied, now)
            self._send(self.driver.complete(self.now()).released)
            return
        if step.applied is not None:
            self._apply(step.applied, now)
        # after the update: released workers pull the new version (a window holds them to its close)
        self._send(step.released if self.window is None else self.window.hold(step.released, now))

    def _on_arrival(self, a: Arrival) -> None:
        m = a.push
        w = m.worker
        d = self.driver
        f = d.inflight[w] if 0 <= w < self.num_workers else None
        if f is None or m.epoch != f[4] or not d.state.live[w]:
            return  # the gradient of a worker declared lost after its release: ignored
        iteration, pull_version, pull_time = f[0], f[1], f[2]
        if m.iteration != iteration or m.version != pull_version:
            raise RuntimeError(f"worker {w} pushed iteration {m.iteration} on version {m.version}, "
                               f"but was released for iteration {iteration} on version {pull_version}")
        now = self.now()
        # the worker's interval on the server's clock (`runtime.messages`: as NTP does)
        half = max(0.0, now - pull_time - m.since_recv) / 2
        start = pull_time + half + (m.since_recv - m.since_start)
        end = max(now - half - m.since_end, start)
        loss = a.loss
        if type(loss) is LateLoss:   # still on the devices: fetched later, with others
            step = d.push(w, now, start, end, None)
            if step.row is not None:
                self._late.append((step.row, loss.array, loss.index))
                if len(self._late) >= SETTLE_EVERY:
                    self._settle()
        else:
            step = d.push(w, now, start, end, loss)
        self._span[w] = (start, end)
        if self.window is not None:
            self.close_at.update((key, until) for until, key in self.window.opens(now, w))
        if m.segments and step.row is not None:   # an in-flight rollout's switches
            self.rec.segments[step.row] = [(int(k), int(v)) for k, v in m.segments]
        if step.accepted:
            self.grads[step.row] = (a.grad, pull_version)
        self._do(step, now)

    def _apply(self, rows, now: float) -> None:
        """Apply the update the driver just recorded (version v -> v + 1) from `rows`' gradients."""
        v = self.rec.num_updates - 1
        held = [self.grads.pop(r) for r in rows]
        grads = [g for g, _ in held]
        staleness = [v - pv for _, pv in held]
        workers = [self.rec.rows[r][0] for r in rows]   # a token-weighted merge weighs them (`Numerics.update`)
        # fragments: an update synchronizes its members' fragment, iteration mod P (`Numerics.update`)
        more = {"iterations": [self.rec.rows[r][1] for r in rows]} if self.policy.work.iterations_per_sync > 1 else {}
        self.params, self.opt_state = self.update(self.params, self.opt_state, grads, staleness, v, self.zeros,
                                                  workers, **more)
        u = v + 1
        if self.spec.inflight:   # actors mid-rollout on an older version take it between two tokens
            self.link.publish(u, self.params, [w for w, f in enumerate(self.driver.inflight)
                                               if f is not None and f[1] < u])
        if u % self.eval_every == 0 or u == self.num_updates:
            self.snapshots.append((u, self.params))
            self._check_divergence()

    def _lose(self, w: int, now: float, reason: str, real: bool) -> None:
        d = self.driver
        if not d.state.live[w]:
            return
        if real and self.on_worker_failure == "stop":
            raise WorkerLostError(w, reason)
        step = d.fail(w, now)   # its in-flight gradient: a lost row, from its release to now
        if step.row is not None and hasattr(self.rec, "set_bytes"):   # pulled, never pushed
            self.rec.set_bytes(step.row, self.row_bytes[0], 0)
        if real:
            self.lost_for_real.add(w)
        if d.state.num_live == 0:
            raise WorkerLostError(w, f"{reason}; no live worker is left")
        self._do(step, now)
        if self.window is not None:   # fewer live learners: a quorum may be met now
            self.close_at.update((key, until) for until, key in self.window.opens(now, None))

    def _join(self, w: int, now: float) -> None:
        if self.driver.state.live[w]:
            return
        self.lost_for_real.discard(w)
        self._do(self.driver.join(w, now), now)

    # -- housekeeping -------------------------------------------------------------
    def _check_deadlines(self, now: float) -> None:
        """Lose released workers silent for `worker_timeout`. Time the loop spent blocked
        in one step (longer than a tick: a release that ran a step inline, a slow
        checkpoint) does not count: gradients that arrived meanwhile were waiting on it."""
        for w, f in enumerate(self.driver.inflight):
            if f is not None and now - f[2] - (self.blocked - self._blocked_at[w]) > self.worker_timeout:
                self._lose(w, now, f"no gradient {now - f[2]:.1f} s after its release "
                           f"(worker_timeout = {self.worker_timeout:g} s)", real=True)

    def _settle(self, block: bool = True) -> None:
        """Fetch the late losses (the transport's `fetch`) into the trace;
        block=False: only those already computed (the others stay NaN: a run that
        failed must not wait on a device that hung)."""
        if not self._late:
            return
        late = self._late if block else [e for e in self._late if e[1].is_ready()]
        arrays = {id(a): a for _, a, _ in late}
        host = dict(zip(arrays, self.link.fetch(list(arrays.values()))))
        losses = self.rec.losses
        for row, a, k in late:
            losses[row] = float(host[id(a)][k])
        self._late = []

    def _check_divergence(self) -> None:
        self._settle()
        losses = self.rec.fetch_losses(self._checked)
        av = np.asarray(self.rec.apply_version[self._checked:])
        bad = np.flatnonzero((av >= 0) & ~np.isfinite(losses))
        if len(bad):
            r = self._checked + int(bad[0])
            worker, iteration, pull_version = self.rec.rows[r][:3]
            applied = self.rec.apply_version[r]
            raise Diverged(f"non-finite loss at update {applied} (gradient of worker {worker}, iteration "
                           f"{iteration}, staleness {applied - pull_version})")
        self._checked = self.rec.num_rows

    def _report(self, now: float) -> None:
        self._settle()
        t_prev, u_prev, g_prev, b_prev = self._progress_mark
        u, g = self.rec.num_updates, self.rec.num_rows
        dt = now - t_prev
        rate = (u - u_prev) / dt if dt > 0 else 0.0
        self._progress_mark = (now, u, g, self.busy)
        lo = max(0, self.rec.num_rows - 256)
        av = self.rec.apply_version[lo:]
        pv = self.rec.column("pull_version", lo)
        stal = [a - p for a, p in zip(av, pv) if a >= 0]
        self.progress({
            "updates": u, "num_updates": self.num_updates, "time": now, "updates_per_s": rate,
            "gradients_per_s": (g - g_prev) / dt if dt > 0 else 0.0,
            "server_busy": min(1.0, (self.busy - b_prev) / dt) if dt > 0 else 0.0,
            "staleness_mean": float(np.mean(stal)) if stal else math.nan,
            "staleness_max": max(stal) if stal else 0,
            "clocks": list(self.state.clocks), "live": self.state.num_live, "workers": self.num_workers,
        })

    def _apply_membership(self, now: float) -> None:
        """Emulated failures and rejoins (the cluster's failure model) that are due by `now`."""
        while self.membership and self.membership[0][0] <= now:
            _, kind, w = self.membership.popleft()
            if kind == "fail":
                self._lose(w, now, "cluster failure model", real=False)
            else:
                self._join(w, now)

    def _mark_due(self, before: int) -> None:
        """A checkpoint falls due when the updates since `before` crossed a multiple of
        `checkpoint_every` (not after the last update: the Result keeps that)."""
        if (self.on_checkpoint is not None and self.checkpoint_every
                and self.rec.num_updates // self.checkpoint_every > before // self.checkpoint_every
                and self.rec.num_updates < self.num_updates):
            self._due = True

    def _quiet(self) -> bool:
        """Whether a checkpoint can be taken now: no synchronization window open, no worker
        held for one, no gradient buffered (always, without a window: right after the update
        that made it due). A checkpoint due inside a window is taken at its close, so a
        resumed run starts, as any, with every worker computing or released."""
        w = self.window
        return w is None or (not self.close_at and not w.held and not w.pending and not self.pending_rows())

    def _close_window(self) -> None:
        """Close the open windows that are due: at their grace's end, or once no worker is in
        flight (none can join them); a merging window's update is applied, then its held
        workers restart on the newest version. Windows of several merge keys (fragments) close
        in the order of their close times."""
        for key, at in sorted(self.close_at.items(), key=lambda kv: (kv[1], kv[0])):
            now = self.now()
            if now < at and self.window.in_flight():
                continue
            del self.close_at[key]
            merged, held = self.window.close(self.driver, now, key)
            if merged is not None:
                self._do(merged, now)
            self._send(held)

    def _housekeeping(self) -> None:
        interrupts.check()   # a Ctrl-C that a callback swallowed (or one before serving) stops the run here
        now = self.now()
        if self.membership:
            self._apply_membership(now)
        if now - self._last_deadline_check >= TICK_SECONDS and not self.link.times_rounds:
            self._last_deadline_check = now
            self._check_deadlines(now)
        if self.progress is not None and now - self._last_progress >= self.progress_every:
            self._last_progress = now
            self._report(now)

    # -- the loop -------------------------------------------------------------------
    def start(self) -> None:
        """Start the clock; release every worker (a fresh run) or continue from the state
        `restore` set."""
        self.t0 = self.clock()
        now = self.now()
        saved, record = self._saved, self.on_checkpoint is not None
        if saved is None:
            self._calls = PolicyCalls(self.policy) if record else None
            d = Driver(self._calls or self.policy, self.num_workers, now, complete_later=self.policy.learner)
        else:
            calls = PolicyCalls(self.policy, saved.policy_start, saved.policy_calls)
            state = calls.replay(self.num_workers)
            self._calls = calls if record else None
            d = Driver.resume(self._calls or self.policy, self.num_workers, now, state=state, recorder=self.rec,
                              epoch=saved.epoch)
            d.complete_later = self.policy.learner
        self.driver = d
        if self.policy.grace or self.policy.merges:
            steps = self.spec.local_steps
            def step_seconds(w, now):   # (seconds of one of `w`'s inner steps, its push's transfer)
                start, end = self._span[w]
                return (end - start) / (1 if steps is None else steps[w]), now - end
            self.window = SyncWindow(self.policy, d.inflight, d.state.table, step_seconds, pushed_key=d.pushed_key)
        self.rec = d.rec
        self.rec.row_bytes = self.row_bytes
        if self.spec.inflight and self.rec.segments is None:
            self.rec.segments = {}
        self.membership = deque(self.spec.membership(after=self.t_offset))   # sorted by time
        # Resume: gradients in flight at the checkpoint are gone; those workers
        # start their iteration again on the checkpoint's version. Blocked ones
        # stay blocked; workers lost to a fault rejoin (this is a fresh start).
        lost, self.lost_for_real = sorted(self.lost_for_real), set()
        self.link.started(self.t0 - self.t_offset)
        self._send(d.start(now))
        for w in lost:
            self._join(w, now)

    def serve(self) -> str:
        """Run until the budget is spent or the run is stopped; returns the status
        ('complete' or 'stopped'). Raises WorkerError, WorkerLostError or Diverged."""
        perf = time.perf_counter
        try:
            while self.rec.num_updates < self.num_updates:
                wait = (TICK_SECONDS if not self.close_at
                        else min(TICK_SECONDS, max(0.0, min(self.close_at.values()) - self.now())))
                ev = self.link.poll(wait)
                t_busy = perf()
                if self.membership:   # a failure due by now comes before this push
                    self._apply_membership(self.now())
                if isinstance(ev, Arrival):
                    before = self.rec.num_updates
                    self._on_arrival(ev)
                    self._mark_due(before)
                elif isinstance(ev, WorkerFailed):
                    raise WorkerError(ev.worker, ev.message) from ev.exception
                elif isinstance(ev, WorkerLost):
                    if 0 <= ev.worker < self.num_workers:
                        self._lose(ev.worker, self.now(), ev.reason, real=True)
                elif isinstance(ev, WorkerJoined):  # its process was restarted and rejoined
                    if 0 <= ev.worker < self.num_workers:
                        self._join(ev.worker, self.now())
                if self.close_at:
                    before = self.rec.num_updates
                    self._close_window()
                    self._mark_due(before)
                if self._due and self._quiet():
                    self._due = False
                    self._settle()
                    self.on_checkpoint(self)
                took = perf() - t_busy
                if took > TICK_SECONDS:   # the loop itself was blocked: not the workers' time
                    self.blocked += took
                self._housekeeping()
                self.busy += perf() - t_busy
                if self.link.agreed_stop is not None:   # collectives across processes
                    self.status = self.link.agreed_stop
                    break
                if self.stop_event.is_set() or (self.max_time is not None and self.now() >= self.max_time):
                    self.status = "stopped" if self.stop_event.is_set() else "complete"
                    break
            else:
                self.status = "complete"
            lost = self.link.finish()   # collectives: rounds still on the devices
            if lost is not None:
                raise WorkerLostError(lost.worker, lost.reason)
            if self.progress is not None:   # the line ends on the run's final state
                self._report(self.now())
        except KeyboardInterrupt:
            self.status = "stopped"
        finally:
            self.end_time = self.now()
            self.link.stop()
            self._settle(block=False)
        return self.status

    # -- results ----------------------------------------------------------------------
    def pending_rows(self) -> list[int]:
        """Rows pushed and accepted but not applied (left out of the trace)."""
        return list(self.driver.buffer) if self.driver is not None else []
