"""One step of the control plane, shared by the simulator and the real server.

A `Driver` owns what both the discrete-event simulator (`staleness.sim.scheduler`) and
the runtime's server (`staleness.runtime.server`) keep about a run: the
policy's `SyncState`, each released worker's in-flight iteration, the rows of
the trace (`Recorder`: the `Schedule` columns, filled as events happen) and
the rows buffered for the next update. Each event is one call that returns
what to do next:

    driver = Driver(policy, num_workers, now)
    released = driver.start(now)                    # every worker may start iteration 0
    step = driver.push(worker, now, start, end)     # its gradient arrived
    step = driver.fail(worker, now)                 # it died (its in-flight gradient is lost)
    step = driver.join(worker, now)                 # it (re)joins
    step = driver.complete(now)                     # (complete_later) the oldest decided update is trained
    #   step.row:      the trace row the event recorded (None: none)
    #   step.accepted: the gradient is kept for an update (False: dropped)
    #   step.applied:  rows of the update applied now, in push order (None: no update)
    #   step.released: Released(worker, iteration, version, epoch) of every worker that
    #                  may start its next iteration now, on the newest completed version

An update is completed (its parameters exist) as soon as it is decided, unless
the driver is made with `complete_later=True` (asynchronous RL's learner, which
trains an update for a while): then the caller calls `complete(now)` when it is
trained; its update time is then, and workers released meanwhile pull the
version before it.

The two drivers differ only in where events come from (a heap of simulated
times; the transport) and what they do with a step: the simulator draws the
released workers' compute times and schedules their pushes; the server sends
them the parameters and applies the update's gradients with its jitted
numerics. Time is passed in (simulated seconds, or seconds since the run's
start from `time.monotonic()`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from staleness.schedule import NOT_APPLIED, Schedule

__all__ = ["Driver", "Step", "Released", "Recorder", "InFlight"]

_COLS = ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start", "end",
         "push_time", "wait", "dropped", "lost", "pull_bytes", "push_bytes")


class Released(NamedTuple):
    """A worker released by the gate: it starts `iteration` on `version`; `epoch`
    changes whenever the worker fails or rejoins (a push of an older epoch is stale)."""

    worker: int
    iteration: int
    version: int
    epoch: int


class Step(NamedTuple):
    """What one event did (see the module docstring)."""

    row: int | None
    accepted: bool
    applied: tuple[int, ...] | None
    released: tuple[Released, ...]


class InFlight(NamedTuple):
    """What the driver knows of a released worker's current iteration."""

    iteration: int
    pull_version: int
    pull_time: float
    wait: float
    epoch: int


# the columns of a row tuple, in order (apply_version is kept apart: it is set later)
_ROW = ("worker", "iteration", "pull_version", "pull_time", "start", "end", "push_time", "wait", "dropped", "lost",
        "pull_bytes", "push_bytes")


class Recorder:
    """The trace of a run, filled as events happen (times in seconds since the start).

    One row per gradient in push order (a lost gradient at the time its loss was
    detected) with `staleness.schedule`'s columns, plus the update times and the
    loss of every gradient as a Python float (NaN where there is none: lost, or a
    simulated schedule). Losses are never kept as device arrays: an array pulled
    from another process may fail to materialize long after the pull returned
    (its peer died mid-transfer), and a Result must not depend on a peer that may
    be gone; the transports hand the server a float.

    Bytes: every row gets `row_bytes` = (pull_bytes, push_bytes) when it is
    added (default (0, 0): not measured); `set_bytes` changes one row's (e.g.
    a lost gradient that never pushed).
    """

    def __init__(self):
        self.row_bytes: tuple[int, int] = (0, 0)  # (pull, push) bytes recorded with each new row
        self.rows: list[tuple] = []             # [G] tuples in _ROW order
        self.apply_version: list[int] = []      # [G] NOT_APPLIED until applied
        self.update_time: list[float] = []      # [U]
        self.losses: list[float] = []           # [G]
        self.segments: dict[int, list] | None = None   # in-flight rollouts: row -> [(decoded token, version)]

    @property
    def num_updates(self) -> int:
        return len(self.update_time)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def column(self, name: str, lo: int = 0) -> list:
        """Column `name` of rows lo.. as a list."""
        if name == "apply_version":
            return self.apply_version[lo:]
        i = _ROW.index(name)
        return [r[i] for r in self.rows[lo:]]

    @property
    def cols(self) -> dict[str, list]:
        """Every column as a list (a copy)."""
        out = {name: list(col) for name, col in zip(_ROW, zip(*self.rows))} if self.rows else \
            {name: [] for name in _ROW}
        out["apply_version"] = list(self.apply_version)
        return {c: out[c] for c in _COLS}

    def add(self, worker: int, f: InFlight, start: float, end: float, push_time: float,
            dropped: bool, lost: bool, loss: float | None) -> int:
        """Append one gradient's row; returns its index.

        loss: the gradient's loss as a Python float (None: NaN). Anything else is
        converted with `float()` here, which blocks on a device scalar: transports
        convert it before the server sees it.
        """
        b = self.row_bytes
        self.rows.append((worker, f[0], f[1], f[2], start, end, push_time, f[3], dropped, lost, b[0], b[1]))
        self.apply_version.append(NOT_APPLIED)
        self.losses.append(math.nan if loss is None else (loss if type(loss) is float else float(loss)))
        return len(self.rows) - 1

    def set_bytes(self, row: int, pull_bytes: int, push_bytes: int) -> None:
        """Row `row` moved `pull_bytes` to its worker and `push_bytes` from it."""
        self.rows[row] = self.rows[row][:-2] + (pull_bytes, push_bytes)

    def applied(self, rows, now: float) -> None:
        """Rows `rows` were applied by the next update, at time `now`."""
        v = len(self.update_time)
        av = self.apply_version
        for r in rows:
            av[r] = v
        self.update_time.append(now)

    def fetch_losses(self, lo: int = 0) -> np.ndarray:
        """[G - lo] the losses of rows lo.. (floats already: nothing is fetched)."""
        return np.asarray(self.losses[lo:], np.float64)

    def update_losses(self) -> np.ndarray:
        """[U] mean loss of each update's gradients."""
        losses = self.fetch_losses()
        av = np.asarray(self.apply_version, np.int64)
        ok = av != NOT_APPLIED
        u = self.num_updates
        total = np.bincount(av[ok], weights=losses[ok], minlength=u)[:u]
        count = np.bincount(av[ok], minlength=u)[:u]
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    def to_schedule(self, *, num_workers: int, policy: str, cluster: str, seed: int, rstar,
                    end_time: float, pending, meta: dict, updates: int | None = None) -> Schedule:
        """The trace as a Schedule, without the `pending` (pushed, not applied) rows; with
        `updates`, only the first that many updates (the rows of later ones are pending)."""
        keep = np.ones(self.num_rows, bool)
        if len(pending):
            keep[list(pending)] = False
        dtypes = {"worker": np.int32, "iteration": np.int64, "pull_version": np.int64,
                  "apply_version": np.int64, "dropped": np.bool_, "lost": np.bool_,
                  "pull_bytes": np.int64, "push_bytes": np.int64}
        columns = {k: np.asarray(v, dtypes.get(k, np.float64))[keep] for k, v in self.cols.items()}
        meta = dict(meta, pending_unapplied=len(pending))
        if self.segments is not None:   # [[row, decoded token, version], ...] in the kept rows' numbering
            new = np.cumsum(keep) - 1
            meta["segments"] = [[int(new[r]), int(k), int(v)] for r in sorted(self.segments) if keep[r]
                                for k, v in self.segments[r]]
        return Schedule(columns=columns, update_time=np.asarray(self.update_time[:updates], np.float64),
                        num_workers=num_workers, policy=policy, cluster=cluster, seed=seed,
                        rstar=tuple(rstar), end_time=float(end_time), meta=meta)

    # -- checkpoints ----------------------------------------------------------------
    def state(self) -> dict:
        """Plain-Python copy for a checkpoint."""
        out = {"cols": self.cols, "update_time": list(self.update_time), "losses": list(self.losses)}
        if self.segments is not None:
            out["segments"] = [[r, k, v] for r in sorted(self.segments) for k, v in self.segments[r]]
        return out

    @classmethod
    def from_state(cls, state: dict) -> "Recorder":
        r = cls()
        cols = dict(state["cols"])
        n = len(cols["worker"])
        for k in ("pull_bytes", "push_bytes"):   # checkpoints written before the byte columns
            cols.setdefault(k, [0] * n)
        r.rows = list(zip(*(cols[k] for k in _ROW)))
        r.apply_version = list(cols["apply_version"])
        r.update_time = list(state["update_time"])
        r.losses = [float(x) for x in state["losses"]]
        if "segments" in state:
            r.segments = {}
            for row, k, v in state["segments"]:
                r.segments.setdefault(int(row), []).append((int(k), int(v)))
        return r


class Driver:
    """The control plane of one run (see the module docstring).

    Args:
      policy: a `staleness.policies` policy.
      num_workers: λ.
      now: the start time (seconds).
      state: a `SyncState` to continue from (a resumed run); default `policy.init`.
      complete_later: updates are completed by `complete` calls, not when decided.

    Public attributes: `policy`, `state`, `rec` (the `Recorder`), `inflight` [λ]
    (`InFlight` or None), `epoch` [λ], `buffer` (rows accepted for the next update).
    """

    def __init__(self, policy, num_workers: int, now: float = 0.0, state=None, complete_later: bool = False):
        self.policy = policy
        self.complete_later = complete_later
        self.num_workers = num_workers
        self.state = state if state is not None else policy.init(num_workers, now)
        self.rec = Recorder()
        self.inflight: list[InFlight | None] = [None] * num_workers
        self.ready = [now] * num_workers       # when each worker became ready for its next iteration
        self.epoch = [0] * num_workers
        self.buffer: list[int] = []
        self.keys = getattr(policy, "merge_keys", 1)   # merging windows side by side (`SyncWindow`)
        self.pushed_key = [0] * num_workers   # the merge key (fragment) of each worker's last push

    @classmethod
    def resume(cls, policy, num_workers: int, now: float, *, state, recorder: Recorder, epoch) -> "Driver":
        """A driver that continues a run from saved state (a checkpoint's): the policy's
        `SyncState`, the trace so far (`recorder`, kept and appended to) and the
        membership epochs. No worker is in flight: `start` releases every live worker
        that is not blocked, on the current version, ready since `now`."""
        d = cls(policy, num_workers, now, state=state)
        d.rec = recorder
        d.epoch = [int(e) for e in epoch]
        if len(d.epoch) != num_workers:
            raise ValueError(f"resume: {len(d.epoch)} membership epochs for {num_workers} workers")
        return d

    @property
    def num_updates(self) -> int:
        return self.rec.num_updates

    def release(self, worker: int, now: float) -> Released:
        """Let `worker` start its next iteration on the current version (the gate opened).
        (Plain tuples in the `InFlight` and `Released` layouts: this runs once per event.)"""
        it = self.state.table.clocks[worker]
        v = self.state.completed
        ep = self.epoch[worker]
        wait = now - self.ready[worker]
        self.inflight[worker] = (it, v, now, wait if wait > 0.0 else 0.0, ep)
        return (worker, it, v, ep)

    def start(self, now: float) -> tuple[Released, ...]:
        """Release every live worker that is not blocked (a fresh run: all of them)."""
        state = self.state
        return tuple(self.release(w, now) for w in range(self.num_workers)
                     if state.live[w] and not state.blocked[w])

    def _after(self, out, now: float, row, accepted: bool, rows=None) -> Step:
        applied = None
        released = out.released
        if out.update:
            applied = tuple(self.buffer if rows is None else rows)
            if rows is None:
                self.buffer = []
            else:
                merged = set(rows)
                self.buffer = [r for r in self.buffer if r not in merged]
            self.rec.applied(applied, now)
            if not self.complete_later:
                more = self.policy.complete(self.state, now).released
                if more:
                    released = released + more
        release = self.release
        return Step(row, accepted, applied, tuple([release(r, now) for r in released]))

    def complete(self, now: float) -> Step:
        """The oldest decided update finished training at `now` (`complete_later`): its
        update time becomes `now` and the workers its version releases start on it."""
        out = self.policy.complete(self.state, now)
        self.rec.update_time[self.state.completed - 1] = now
        release = self.release
        return Step(None, False, None, tuple([release(r, now) for r in out.released]))

    def push(self, worker: int, now: float, start: float, end: float, loss=None) -> Step:
        """`worker`'s gradient of its in-flight iteration arrived at `now`; it computed
        from `start` to `end` (seconds). Records its row, then the policy decides."""
        f = self.inflight[worker]
        self.inflight[worker] = None
        out = self.policy.push(self.state, worker, f[1], now)
        row = self.rec.add(worker, f, start, end, now, not out.accepted, False, loss)
        self.ready[worker] = now
        self.pushed_key[worker] = self.key_of(f[0])
        if out.accepted:
            self.buffer.append(row)
        return self._after(out, now, row, out.accepted)

    def fail(self, worker: int, now: float, start: float | None = None, end: float | None = None) -> Step:
        """`worker` died at `now`: its in-flight gradient (if any) is recorded as lost
        (computing from `start` to `end`; default: from its release to `now`)."""
        f = self.inflight[worker]
        row = None
        if f is not None:
            pull_time = f[2]
            row = self.rec.add(worker, f, pull_time if start is None else start,
                               max(now, pull_time) if end is None else end, math.nan, False, True, None)
            self.inflight[worker] = None
        self.epoch[worker] += 1
        out = self.policy.fail(self.state, worker, now)
        return self._after(out, now, row, False)

    def key_of(self, iteration: int) -> int:
        """The merge key (fragment) of a push of `iteration` (`Policy.merge_keys`)."""
        return iteration % self.keys

    def merge(self, now: float, key: int | None = None) -> Step:
        """A merging window closed at `now` (`Policy.merge`): the buffered rows make one update
        (key: those of that merge key, `key_of` their iterations; the fragment)."""
        if key is None or self.keys == 1:
            return self._after(self.policy.merge(self.state, now), now, None, False)
        rows = [r for r in self.buffer if self.key_of(self.rec.rows[r][1]) == key]
        return self._after(self.policy.merge(self.state, now, len(rows)), now, None, False, rows)

    def join(self, worker: int, now: float) -> Step:
        """`worker` (re)joins at `now` and pulls the newest version when its gate opens."""
        self.epoch[worker] += 1
        self.ready[worker] = now
        out = self.policy.join(self.state, worker, now)
        return self._after(out, now, None, False)

    def to_schedule(self, *, policy: str, cluster: str, seed, end_time: float, meta: dict) -> Schedule:
        """The run so far as a Schedule (rows still buffered for an update, or of an update
        decided but not completed, are left out)."""
        pending = list(self.buffer)
        done = self.state.completed
        if done < self.rec.num_updates:   # rows of updates decided but not yet trained
            av = self.rec.apply_version
            pending += [r for r in range(len(av)) if av[r] >= done]
        return self.rec.to_schedule(num_workers=self.num_workers, policy=policy, cluster=cluster, seed=seed,
                                    rstar=self.state.rstar, end_time=end_time, pending=pending, updates=done,
                                    meta={"max_gap": self.state.max_gap, **meta})


class _Open:
    """One merge key's window (`SyncWindow`)."""

    __slots__ = ("until", "open", "pending", "first", "last", "held", "arrived")

    def __init__(self):
        self.until = -math.inf    # the open window's last synchronization
        self.open = False
        self.pending = 0          # arrivals since the last close
        self.first = 0.0          # the first of them
        self.last = (0.0, 0.0)    # the newest arrival's step_seconds
        self.held: list[int] = []
        self.arrived: set[int] = set()   # a merging window's learners that arrived since the last close


class SyncWindow:
    """A policy's synchronization window (`Policy.grace`: `policies.Window`, `policies.Quorum`),
    the same in the simulator and the real server: an arrival while none is open opens one
    (with a quorum k, the k-th arrival since the last close, or fewer once fewer learners are
    live), of `grace` seconds or the policy's `window_seconds` (Quorum's adaptive window);
    every worker released while it is open (or its quorum pending) is held (`hold`) and
    restarts at its close, on the newest version (`close`). A merging window
    (`Policy.merges`) makes one update of its arrivals at its close (`Driver.merge`);
    otherwise each arrival was its own update.

    Merge keys (`Policy.merge_keys`, Decoupled DiLoCo's fragments): one merging window per
    key, side by side, each with its own quorum, arrivals, held learners and close; a push
    counts toward its key's (`Driver.pushed_key`), and a close merges that key's rows only.
    Without fragments there is one key, 0.

    When it closes: `arrivals(end)`, the times of the pushes in flight that arrive by `end`,
    given (the simulator knows them): at the last of them within the grace; None (the real
    server, which does not): at the grace's end, or earlier when no worker is in flight.
    step_seconds(w, now): (seconds of one inner step, seconds of its push's transfer) of the
    push of `w` that arrived at `now` (the adaptive window's estimates), or None."""

    def __init__(self, policy, inflight: list, table, step_seconds=None, arrivals=None, pushed_key=None):
        self.grace, self.inflight, self.table = policy.grace, inflight, table
        self.quorum, self.merges, self.rule = policy.quorum, policy.merges, policy.window_seconds
        self.step_seconds, self.arrivals = step_seconds, arrivals
        keys = policy.merge_keys if self.merges else 1
        if keys > 1 and pushed_key is None:
            raise ValueError(f"SyncWindow: {keys} merge keys need the driver's pushed_key")
        self.pushed_key = pushed_key
        self.wins = [_Open() for _ in range(keys)]

    @property
    def held(self) -> list[int]:
        """The workers every window holds."""
        return [w for win in self.wins for w in win.held]

    @property
    def pending(self) -> int:
        """Arrivals since their windows' last closes."""
        return sum(win.pending for win in self.wins)

    def opens(self, now: float, arrived: int | None) -> list[tuple[float, int]]:
        """A push of worker `arrived` arrived at `now` (None: a learner failed, a quorum may
        now be met): [(close time, key)] of the windows that open (none: one is open, or the
        quorum not met)."""
        if not self.merges:
            win = self.wins[0]
            if arrived is None or now <= win.until:
                return []
            return [(self._open(win, now), 0)]
        out = []
        if arrived is not None:
            key = 0 if self.pushed_key is None else self.pushed_key[arrived]
            win = self.wins[key]
            win.first = now if not win.pending else win.first
            win.pending += 1
            win.arrived.add(arrived)
            if self.step_seconds is not None:
                win.last = self.step_seconds(arrived, now)
            todo = [key]
        else:
            todo = range(len(self.wins))
        for key in todo:
            win = self.wins[key]
            if win.open or not win.pending or win.pending < min(self.quorum, self.table.num_live):
                continue
            win.open = True
            out.append((self._open(win, now), key))
        return out

    def _open(self, win: _Open, now: float) -> float:
        # the adaptive window's sync: the push's transfer and the merged version's way back
        grace = self.grace if self.rule is None else self.rule(win.last[0], now - win.first, 2 * win.last[1])
        if not grace or not self.in_flight():
            win.until = now   # pushes of this very instant were queued before its close: they join it
        elif self.arrivals is None:
            win.until = now + grace
        else:
            win.until = max([now, *self.arrivals(now + grace)])
        return win.until

    def in_flight(self) -> bool:
        """Whether a worker is computing (one that is held or pending is not)."""
        return any(f is not None for f in self.inflight)

    def hold(self, released, now: float) -> tuple:
        """The releases to start at `now`: none while a window is open or its quorum pending
        (they wait for its close), except, for a merging window, the learners that are not
        in one (one that (re)joined starts at once: the quorum may need its arrival)."""
        if not self.merges:
            win = self.wins[0]
            if now > win.until:
                return released
        elif not any(win.open or win.pending for win in self.wins):
            return released
        start = []
        for rel in released:
            w = rel[0]
            if self.merges:
                win = next((x for x in self.wins if w in x.arrived), None)
                if win is None:
                    start.append(rel)
                    continue
            self.inflight[w] = None   # not in flight while held: a failure then loses no computation
            if w not in win.held:
                win.held.append(w)
        return tuple(start)

    def close(self, driver: Driver, now: float, key: int = 0) -> tuple[Step | None, list]:
        """Window `key` closed at `now`: (a merging window's update: its `Step`, else None; the
        held workers, still live, released on the newest version)."""
        win = self.wins[key]
        merged = driver.merge(now, key) if self.merges else None
        win.open, win.pending = False, 0
        win.arrived.clear()
        held, win.held = win.held, []
        return merged, [driver.release(w, now) for w in held if driver.state.live[w]]
