"""Host-side preparation of a replay: a `Schedule` -> fixed-shape update arrays.

Everything here is NumPy; the compiled replay (`core`) reads only these arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq

import numpy as np

from staleness.schedule import NOT_APPLIED, Schedule

__all__ = ["Plan", "make_plan", "PlanStream", "ring_size", "stream_ring", "chunk_inputs", "fingerprint",
           "segment_count", "segment_lists", "positions", "NO_SEGMENT"]

LOOKAHEAD = 256
"""A streamed first chunk longer than this runs in parts of this many updates, each
simulated while the one before runs (`engine.run.simulate`)."""

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
    The replay keeps parameter versions in a ring of R slots: at update u it writes version
    u into slot `write[u]`, then each gradient reads its version from slot `slot[u, c]`.
    `make_plan` lays version v in slot v % R (R > the largest staleness); a `PlanStream`
    gives each version a free slot and frees it after its last read (R > the versions live
    at once, about the number of workers).
    """

    worker: np.ndarray       # [U_pad, C] int32
    iteration: np.ndarray    # [U_pad, C] int32 (the worker's clock: picks its minibatch)
    pull_version: np.ndarray  # [U_pad, C] int32
    staleness: np.ndarray    # [U_pad, C] int32
    mask: np.ndarray         # [U_pad, C] bool: real gradient slots (all False on padding updates)
    num_updates: int         # real updates U
    chunk: int               # updates per compiled call (evaluation interval)
    ring: int                # R: ring slots (see above)
    update_time: np.ndarray  # [U] seconds
    slot: np.ndarray         # [U_pad, C] int32: the ring slot of each gradient's version
    write: np.ndarray        # [U_pad] int32: the ring slot version u is written into
    segments: np.ndarray | None = None   # [U_pad, C, 2, S] int32 in-flight segments (None: none): [u, c, 0]
    #   the first decoded token of each (counting the prefill, in the simulator's size units; padding
    #   NO_SEGMENT), [u, c, 1] its version

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
        packed [K, 6, C] int32) with rows worker, iteration, ring slot, staleness, mask and
        the write slot (the same in every column; see engine.core)."""
        lo, hi = span if span is not None else (k * self.chunk, (k + 1) * self.chunk)
        write = np.broadcast_to(self.write[lo:hi, None], self.slot[lo:hi].shape)
        packed = np.stack([self.worker[lo:hi], self.iteration[lo:hi], self.slot[lo:hi],
                           self.staleness[lo:hi], self.mask[lo:hi].astype(np.int32), write], axis=1)
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
      ring: lay version v in slot v % `ring` of a ring of exactly that many slots (>= the
        largest staleness + 1; default `ring_size` of the largest staleness; a sweep gives
        every plan the same).
      slots, num_updates, segments: pad to at least these sizes (used to give every
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

    most = int(stal[schedule.applied].max()) if schedule.applied.any() else 0
    r = ring_size(most) if ring is None else int(ring)
    if r <= most:
        raise ValueError(f"ring = {ring} is too small for this schedule: its largest staleness is {most}, so it "
                         f"needs {most + 1} slots or more")
    seg = _segments(schedule, segments)
    if seg is not None:
        seg = np.pad(np.where(mask[:, :, None, None], seg[index], 0).astype(np.int32),
                     ((0, pad), (0, 0), (0, 0), (0, 0)))
    pull = take(cols["pull_version"])
    return Plan(
        worker=take(cols["worker"]),
        iteration=take(cols["iteration"]),
        pull_version=pull,
        staleness=take(stal),
        mask=np.pad(mask, ((0, pad), (0, 0))),
        num_updates=u,
        chunk=int(chunk),
        ring=r,
        update_time=np.asarray(schedule.update_time),
        slot=pull % r,
        write=(np.arange(u_pad) % r).astype(np.int32),
        segments=seg,
    )


def ring_size(max_staleness: int) -> int:
    """Versions a ring keeps for gradients up to `max_staleness` versions stale, rounded up
    to a power of two: runs whose largest staleness differs a little share one compiled
    replay (the ring size is a static shape)."""
    return 1 << int(max_staleness).bit_length()


def stream_ring(num_workers: int, slots: int) -> int:
    """The ring a `PlanStream` starts with: the versions live at once when every worker
    computes on its own (`num_workers`), each update reads `slots` more and writes one, and
    as many wait in a buffer (a policy that needs more grows it)."""
    return int(num_workers) + 2 * int(slots) + 1


class PlanStream:
    """The `Plan` of a schedule while it is simulated (`sim.ScheduleStream`): `fill(k)` (or
    `fill_to(u)`) simulates until chunk k's updates (the first u) exist and writes their
    rows into `plan` (allocated for the whole run), so the compiled replay of the rows
    before runs meanwhile (`engine.run.simulate`). Every update holds exactly `slots`
    gradients (`Policy.streamable`; checked), so the rows are those of `make_plan` on the
    finished schedule.

    Its ring holds the versions still to be read, not the last R: version u gets a free slot
    when it is written and gives it back after the last gradient computed on it is applied
    or dropped (the simulation runs ahead of the replay, so the pushed and in-flight reads
    are known when the rows are written). The ring starts at `ring` slots (default
    `stream_ring`: ASP on 16 workers gets 19, where the last R versions need R > the largest
    staleness, 64); rows that find no free slot add slots (`ring` counts them, `plan.ring`
    those it started with; `grew` is set: the replay pads its ring, `core.grow_ring`, and
    compiles once more). Where a version lives changes no number."""

    def __init__(self, stream, chunk: int, slots: int, ring: int | None = None):
        self.stream, self.slots = stream, int(slots)
        u = stream.num_updates
        u_pad = -(-u // chunk) * chunk
        shape = (u_pad, self.slots)
        self.ring = stream_ring(stream.num_workers, self.slots) if ring is None else int(ring)
        self.plan = Plan(worker=np.zeros(shape, np.int32), iteration=np.zeros(shape, np.int32),
                         pull_version=np.zeros(shape, np.int32), staleness=np.zeros(shape, np.int32),
                         mask=np.zeros(shape, bool), num_updates=u, chunk=int(chunk), ring=self.ring,
                         update_time=np.zeros(u, np.float64), slot=np.zeros(shape, np.int32),
                         write=np.zeros(u_pad, np.int32))
        self._cursor = 0    # records before it are applied in filled rows, dropped or lost
        self.filled = 0     # updates whose rows are written
        self.grew = False
        self._free = list(range(self.ring))    # heap of free slots
        self._release: list = []               # heap of (update from which a slot is free, slot)
        self._held: dict[int, int] = {}        # version -> slot, of versions read after the filled rows
        self._where = np.zeros(u + 1, np.int32)   # version -> its slot (while it is live)

    def fill(self, k: int) -> None:
        """Simulate and write the rows of chunks up to k (each once, in order)."""
        self.fill_to((k + 1) * self.plan.chunk)

    def fill_to(self, updates: int) -> None:
        """Simulate and write the rows of the first `updates` updates (at most all)."""
        plan = self.plan
        while self.filled < min(updates, plan.num_updates):   # chunk by chunk
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
        col = np.arange(len(order)) % self.slots
        pull = rows[order, 2].astype(np.int64)
        stal = av[order] - pull
        for name, values in (("worker", rows[order, 0]), ("iteration", rows[order, 1]), ("pull_version", pull),
                             ("staleness", stal)):
            getattr(plan, name)[lo + u, col] = values
        plan.mask[lo + u, col] = True
        plan.update_time[lo:hi] = rec.update_time[lo:hi]
        # rows applied up to here, dropped or lost are done with
        done = ((av != NOT_APPLIED) & (av < hi)) | (rows[:, 8] != 0) | (rows[:, 9] != 0)
        self._cursor = c + (int(np.argmin(done)) if not done.all() else len(done))
        # versions read after update hi - 1: of gradients pushed but not applied by then, or still computing
        after = set(rows[~done, 2].astype(np.int64).tolist())
        after.update(f[1] for f in stream.driver.inflight if f is not None)   # InFlight.pull_version
        self._place(lo, hi, lo + u, pull, after)
        plan.slot[lo + u, col] = self._where[pull]

    def _place(self, lo: int, hi: int, read_at: np.ndarray, pull: np.ndarray, after: set) -> None:
        """Give versions lo .. hi - 1 their slots (`plan.write`): version v is read by the
        gradients of `pull` at updates `read_at` (ascending), and after hi - 1 if in `after`."""
        last = {}   # version -> its last read among these rows
        if len(pull):
            versions, first = np.unique(pull[::-1], return_index=True)
            last = dict(zip(versions.tolist(), read_at[::-1][first].tolist()))
        for v in [v for v in self._held if v not in after]:   # read for the last time in these rows (or dropped)
            heapq.heappush(self._release, (last.get(v, lo - 1) + 1, self._held.pop(v)))
        free, release, write = self._free, self._release, self.plan.write
        for v in range(lo, hi):
            while release and release[0][0] <= v:
                heapq.heappush(free, heapq.heappop(release)[1])
            if not free:   # more versions live than slots: add half as many again
                self._grow(max(1, self.ring // 2))
            s = heapq.heappop(free)
            write[v] = self._where[v] = s
            if v in after:
                self._held[v] = s
            else:
                heapq.heappush(release, (last.get(v, v) + 1, s))

    def _grow(self, more: int) -> None:
        """Add `more` free slots after the others (the replay pads its ring before the next call)."""
        for s in range(self.ring, self.ring + more):
            heapq.heappush(self._free, s)
        self.ring, self.grew = self.ring + more, True


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
    [K, 6, C], index [K, C, μ] or None).
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
