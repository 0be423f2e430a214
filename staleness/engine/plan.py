"""Host-side preparation of a replay: a `Schedule` -> fixed-shape update arrays.

Everything here is NumPy; the compiled replay (`core`) reads only these arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from staleness.schedule import Schedule

__all__ = ["Plan", "make_plan", "chunk_inputs", "fingerprint", "segment_count", "segment_lists", "positions", "NO_SEGMENT"]

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

    def xs(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scan inputs of chunk k: (update [K] int32, packed [K, 5, C] int32) with
        rows worker, iteration, pull_version, staleness, mask (see engine.core)."""
        lo, hi = k * self.chunk, (k + 1) * self.chunk
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

    r = int(stal[schedule.applied].max()) + 1 if schedule.applied.any() else 1
    # Round up to a power of two: runs whose largest staleness differs a little
    # share one compiled replay (the ring size is a static shape).
    r = 1 << (r - 1).bit_length()
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

def chunk_inputs(task, plan: Plan, k: int, data_key):
    """Scan inputs of chunk k: (update [K], packed [K, 5, C], index [K, C, μ] or None).
    In-flight rollouts (a plan with `segments`): index is [K, C, 2, S], each segment's first
    completion position (its first decoded token less the task's `prefill`) and version.
    For `indexed` tasks the minibatch indices of every slot are computed here, on the
    host (`task.host_indices`), so the compiled replay only gathers, as a plain
    training loop over a precomputed table does."""
    update, packed = plan.xs(k)
    if plan.segments is not None:   # in-flight rollouts: [K, C, 2, S], the starts as completion positions
        seg = plan.segments[k * plan.chunk:(k + 1) * plan.chunk].copy()
        seg[:, :, 0] = positions(seg[:, :, 0], task.prefill)
        return update, packed, seg
    if not task.indexed:
        return update, packed, None
    lo, hi = k * plan.chunk, (k + 1) * plan.chunk
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
