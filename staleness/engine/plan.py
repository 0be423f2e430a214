"""Host-side preparation of a replay: a `Schedule` -> fixed-shape update arrays.

Everything here is NumPy; the compiled replay (`core`) reads only these arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from staleness.schedule import NOT_APPLIED, Schedule

__all__ = ["Plan", "make_plan", "PlanStream", "ring_size", "chunk_inputs", "fingerprint", "segment_count",
           "segment_lists", "positions", "NO_SEGMENT"]

LOOKAHEAD = 256
"""Updates a streamed plan simulates before it sizes its ring (`PlanStream`); a first chunk
longer than this runs in parts of this many updates (`engine.run.simulate`)."""

NO_SEGMENT = np.iinfo(np.int32).max
"""The start of a padding segment (in-flight rollouts): past every position."""


def segment_lists(schedule: Schedule) -> dict[int, list] | None:
    """row -> [(decoded token, version), ...] of the schedule's in-flight switches (after
    the pulled version), or None for a schedule without in-flight segments."""
    raw = schedule.meta.get("segments")
    if raw is None:
        return None
    cols = schedule.columns
    pull, apply, applied = cols["pull_version"], cols["apply_version"], schedule.applied
    out: dict[int, list] = {}
    for entry in raw:
        try:
            row, k, v = (int(x) for x in entry)
        except (TypeError, ValueError):
            raise ValueError(f"schedule meta['segments']: {entry!r} must be [row, decoded token, version]") from None
        if not 0 <= row < len(pull) or k < 0 or v <= pull[row] or (applied[row] and v > apply[row]):
            raise ValueError(f"schedule meta['segments']: {entry!r} is not a switch of a row: rows are 0.."
                             f"{len(pull) - 1}, tokens >= 0, and a version after the row's pull_version and "
                             "at most its apply_version")
        out.setdefault(row, []).append((k, v))
    return out


def positions(starts, prefill: float) -> np.ndarray:
    """The first completion position of segments starting at decoded tokens `starts`
    (counting the prompt's `prefill`): ceil(start − prefill), at least 0; NO_SEGMENT stays."""
    starts = np.asarray(starts)
    pos = np.clip(np.ceil(starts - float(prefill)), 0, NO_SEGMENT - 1).astype(np.int64)
    return np.where(starts == NO_SEGMENT, NO_SEGMENT, pos)


def segment_count(schedule: Schedule) -> int | None:
    """S, the segments per rollout a replay of `schedule` needs (1 + the most switches of
    an applied row, rounded up to a power of two), or None without in-flight segments."""
    lists = segment_lists(schedule)
    return None if lists is None else _count(lists, schedule.applied)


def _count(lists: dict, applied: np.ndarray) -> int:
    most = max((len(v) for r, v in lists.items() if applied[r]), default=0)
    return 1 << most.bit_length() if most else 1


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """Per-update gradient slots of one schedule, padded to a chunk grid.

    Shapes: U_pad = number of updates rounded up to a multiple of `chunk`;
    C = gradient slots per update (the largest update); R = ring size.
    """

    worker: np.ndarray       # [U_pad, C] int32
    iteration: np.ndarray    # [U_pad, C] int32 (the worker's clock: picks its minibatch)
    pull_version: np.ndarray  # [U_pad, C] int32
    staleness: np.ndarray    # [U_pad, C] int32
    mask: np.ndarray         # [U_pad, C] bool: real gradient slots (all False on padding updates)
    num_updates: int         # real updates U
    chunk: int               # updates per compiled call (evaluation interval)
    ring: int                # R: parameter versions kept, >= max staleness + 1 (a power of two)
    update_time: np.ndarray  # [U] seconds
    segments: np.ndarray | None = None   # [U_pad, C, 2, S] int32 in-flight segments (None: none), see below

    # segments[u, c, 0]: the first decoded token of each segment (counting the prefill, in
    # the simulator's size units; padding NO_SEGMENT), segments[u, c, 1]: its version.

    @property
    def slots(self) -> int:
        return self.worker.shape[1]

    @property
    def num_chunks(self) -> int:
        return self.worker.shape[0] // self.chunk

    @property
    def padded(self) -> bool:
        """Whether some update row has no real gradient slot (the padding up to the chunk
        grid); a replay of a plan without one skips the per-update padding select."""
        return not bool(self.mask.any(axis=1).all())

    @property
    def padded_updates(self) -> bool:
        """Whether one of the `num_updates` real updates has no real gradient slot (a replay
        that runs only those, `core.run_chunk`, needs the padding select only then)."""
        return not bool(self.mask[:self.num_updates].any(axis=1).all())

    def xs(self, k: int, span: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Scan inputs of chunk k (or of the updates `span` = (lo, hi)): (update [K] int32,
        packed [K, 5, C] int32) with rows worker, iteration, pull_version, staleness, mask
        (see engine.core)."""
        lo, hi = span if span is not None else (k * self.chunk, (k + 1) * self.chunk)
        packed = np.stack([self.worker[lo:hi], self.iteration[lo:hi], self.pull_version[lo:hi],
                           self.staleness[lo:hi], self.mask[lo:hi].astype(np.int32)], axis=1)
        return np.arange(lo, hi, dtype=np.int32), packed

    def chunk_view(self, k: int) -> dict[str, np.ndarray]:
        """Host-side views of chunk k ([K, C] each) for diagnostics."""
        lo, hi = k * self.chunk, (k + 1) * self.chunk
        return {"worker": self.worker[lo:hi], "iteration": self.iteration[lo:hi],
                "staleness": self.staleness[lo:hi], "mask": self.mask[lo:hi]}


def make_plan(schedule: Schedule, chunk: int, *, slots: int | None = None, ring: int | None = None,
              num_updates: int | None = None, segments: int | None = None) -> Plan:
    """Build the padded update arrays of `schedule`.

    Args:
      chunk: updates per compiled call (>= 1).
      slots, ring, num_updates, segments: pad to at least these sizes (used to give every
        schedule of a sweep the same shapes; segments: of in-flight rollouts).
    """
    if schedule.num_updates < 1:
        raise ValueError("schedule has no update to replay (num_updates = 0)")
    if not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk = {chunk!r} must be an integer >= 1")
    index, mask = schedule.update_members(slots)
    u = schedule.num_updates
    total = max(u, num_updates or 0)
    u_pad = -(-total // chunk) * chunk
    pad = u_pad - u
    cols = schedule.columns
    stal = schedule.staleness

    def take(a):
        out = np.where(mask, a[index], 0).astype(np.int32)
        return np.pad(out, ((0, pad), (0, 0)))

    r = ring_size(int(stal[schedule.applied].max()) if schedule.applied.any() else 0)
    if ring is not None:
        r = max(r, ring)
    seg = _segments(schedule, segments)
    if seg is not None:
        seg = np.pad(np.where(mask[:, :, None, None], seg[index], 0).astype(np.int32),
                     ((0, pad), (0, 0), (0, 0), (0, 0)))
    return Plan(
        worker=take(cols["worker"]),
        iteration=take(cols["iteration"]),
        pull_version=take(cols["pull_version"]),
        staleness=take(stal),
        mask=np.pad(mask, ((0, pad), (0, 0))),
        num_updates=u,
        chunk=int(chunk),
        ring=r,
        update_time=np.asarray(schedule.update_time),
        segments=seg,
    )


def ring_size(max_staleness: int) -> int:
    """Versions a ring keeps for gradients up to `max_staleness` versions stale, rounded up
    to a power of two: runs whose largest staleness differs a little share one compiled
    replay (the ring size is a static shape)."""
    return 1 << int(max_staleness).bit_length()


class PlanStream:
    """The `Plan` of a schedule while it is simulated (`sim.ScheduleStream`), filled as
    the replay goes: `fill(k)` (or `fill_to(u)`) simulates until chunk k's updates (the
    first u) exist and writes their rows into `plan` (whose arrays are allocated for the
    whole run), so the compiled replay of the rows before runs meanwhile
    (`engine.run.simulate`). Every update of the policy holds exactly `slots` gradients
    (`Policy.streamable`; checked), so the rows are those of `make_plan` on the finished
    schedule.

    The ring size cannot wait for the whole schedule: `ring` starts at 1.5x the largest
    staleness of the first `lookahead` updates (default `LOOKAHEAD`; `ring_size`), and rows
    that need more raise it before they run (`grew`: the replay then re-lays its ring,
    `core.grow_ring`, and compiles once more). Rows need the versions of their own
    gradients and of every gradient still to be applied after them (pushed since, or
    still computing: the driver's in-flight pulls), so no version is overwritten before
    the gradient computed on it is applied. The ring's size changes no number: the
    results are bitwise those of a replay of the finished schedule."""

    def __init__(self, stream, chunk: int, slots: int, lookahead: int | None = None):
        self.stream, self.slots = stream, int(slots)
        u = stream.num_updates
        u_pad = -(-u // chunk) * chunk
        shape = (u_pad, self.slots)
        self.plan = Plan(worker=np.zeros(shape, np.int32), iteration=np.zeros(shape, np.int32),
                         pull_version=np.zeros(shape, np.int32), staleness=np.zeros(shape, np.int32),
                         mask=np.zeros(shape, bool), num_updates=u, chunk=int(chunk), ring=1,
                         update_time=np.zeros(u, np.float64))
        self._cursor = 0    # records before it are applied in filled rows, dropped or lost
        self.filled = 0     # updates whose rows are written
        stream.advance(min(u, LOOKAHEAD if lookahead is None else lookahead))
        rec = stream.driver.rec
        av = np.asarray(rec.apply_version, np.int64)
        pv = np.asarray(rec.column("pull_version"), np.int64)
        most = int((av - pv)[av != NOT_APPLIED].max(initial=0))
        self.ring = ring_size(most + 1 + most // 2)
        self.grew = False

    def fill(self, k: int) -> None:
        """Simulate and write the rows of chunks up to k (each once, in order)."""
        self.fill_to((k + 1) * self.plan.chunk)

    def fill_to(self, updates: int) -> None:
        """Simulate and write the rows of the first `updates` updates (at most all)."""
        plan = self.plan
        while self.filled < min(updates, plan.num_updates):   # chunk by chunk, as the ring check needs
            hi = min(updates, plan.num_updates, (self.filled // plan.chunk + 1) * plan.chunk)
            self._fill(self.filled, hi)
            self.filled = hi

    def _fill(self, lo: int, hi: int) -> None:
        plan, stream = self.plan, self.stream
        if stream.advance(hi) < hi:
            raise ValueError(f"PlanStream: the simulation ended after {stream.driver.state.completed} of "
                             f"{plan.num_updates} updates (a streamed replay needs a run that reaches its budget)")
        rec = stream.driver.rec
        c = self._cursor
        rows = np.asarray(rec.rows[c:], np.float64).reshape(-1, 12)   # Recorder._ROW order
        av = np.asarray(rec.apply_version[c:], np.int64)
        take = np.flatnonzero((av >= lo) & (av < hi))
        order = take[np.argsort(av[take], kind="stable")]
        u = av[order] - lo
        counts = np.bincount(u, minlength=hi - lo)
        if (counts != self.slots).any():
            bad = int(np.flatnonzero(counts != self.slots)[0])
            raise ValueError(f"PlanStream: update {lo + bad} holds {int(counts[bad])} gradients, but the policy "
                             f"{stream.driver.policy.describe()!r} declares {self.slots} for every update "
                             "(its aggregation's fixed_size)")
        slot = np.arange(len(order)) % self.slots
        pull = rows[order, 2].astype(np.int64)
        stal = av[order] - pull
        for name, values in (("worker", rows[order, 0]), ("iteration", rows[order, 1]), ("pull_version", pull),
                             ("staleness", stal)):
            getattr(plan, name)[lo + u, slot] = values
        plan.mask[lo + u, slot] = True
        plan.update_time[lo:hi] = rec.update_time[lo:hi]
        # rows applied up to here, dropped or lost are done with
        done = ((av != NOT_APPLIED) & (av < hi)) | (rows[:, 8] != 0) | (rows[:, 9] != 0)
        self._cursor = c + (int(np.argmin(done)) if not done.all() else len(done))
        # The ring must hold, through update hi - 1, the version each gradient of the chunk
        # was computed on (R > its staleness) and every version a gradient not applied by
        # then was computed on: pushed later, or still computing (R >= hi - its version).
        later = [int(rows[~done, 2].min())] if not done.all() else []
        later += [f[1] for f in stream.driver.inflight if f is not None]   # InFlight.pull_version
        need = max([int(stal.max()) + 1 if len(stal) else 1] + [hi - v for v in later])
        if need > self.ring:
            self.ring, self.grew = ring_size(need + need // 2), True


def _segments(schedule: Schedule, at_least: int | None) -> np.ndarray | None:
    """[G, 2, S] int32 segments of every row (row 0: first decoded token, row 1: version),
    the pulled version first, padded with NO_SEGMENT at the last version; None for a
    schedule without in-flight segments unless `at_least` asks for them (a sweep that
    mixes it with in-flight ones: each row is then one segment)."""
    lists = segment_lists(schedule)
    if lists is None and at_least is None:
        return None
    lists = lists or {}
    s = max(_count(lists, schedule.applied), at_least or 1)
    pull = schedule.columns["pull_version"]
    out = np.empty((len(pull), 2, s), np.int64)
    out[:, 0, :] = NO_SEGMENT
    out[:, 0, 0] = 0
    out[:, 1, :] = pull[:, None]
    for row, switches in lists.items():
        if not schedule.applied[row]:
            continue   # never replayed
        for j, (k, v) in enumerate(switches, start=1):
            out[row, 0, j] = k
            out[row, 1, j:] = v
    return out

def chunk_inputs(task, plan: Plan, k: int, data_key, span: tuple[int, int] | None = None):
    """Scan inputs of chunk k (or of the updates `span` = (lo, hi)): (update [K], packed
    [K, 5, C], index [K, C, μ] or None).
    In-flight rollouts (a plan with `segments`): index is [K, C, 2, S], each segment's first
    completion position (its first decoded token less the task's `prefill`) and version.
    For `indexed` tasks the minibatch indices of every slot are computed here, on the
    host (`task.host_indices`), so the compiled replay only gathers, as a plain
    training loop over a precomputed table does."""
    update, packed = plan.xs(k, span)
    lo, hi = span if span is not None else (k * plan.chunk, (k + 1) * plan.chunk)
    if plan.segments is not None:   # in-flight rollouts: [K, C, 2, S], the starts as completion positions
        seg = plan.segments[lo:hi].copy()
        seg[:, :, 0] = positions(seg[:, :, 0], task.prefill)
        return update, packed, seg
    if not task.indexed:
        return update, packed, None
    return update, packed, task.host_indices(data_key, plan.worker[lo:hi], plan.iteration[lo:hi])


def fingerprint(schedule: Schedule) -> str:
    """A short hash of a schedule's numeric content (guards checkpoint resumes)."""
    h = hashlib.sha256()
    for k in ("worker", "iteration", "pull_version", "apply_version"):
        h.update(np.ascontiguousarray(schedule.columns[k]).tobytes())
    h.update(np.ascontiguousarray(schedule.update_time).tobytes())
    if "segments" in schedule.meta:
        h.update(np.asarray(schedule.meta["segments"], np.int64).tobytes())
    return h.hexdigest()[:16]
