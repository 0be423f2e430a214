"""`TickPlan`: the tick tables of one pipeline run, computed on the host.

A plan says, for every tick t and stage k, which micro-batch stage k
forwards, which one it backpropagates, and whether it applies an update
after that backward. It is data (NumPy arrays), the contract between the
schedule and both numeric engines (one device, K devices) and the timing
model; the engines never decide anything themselves.

Micro-batch ids: batch n's micro-batch j has id n·M + j (M = 1 except GPipe).
Batch n enters stage 0 at tick n (no flush) or n·R (flush, R = M + m_0 ticks
per batch: fill, then drain until stage 0 has applied the update).
Stage k forwards it F_k ticks later and backpropagates it m_k ticks after
that: F_k = Σ_{i<k} forward_delays[i], m_k = Σ_{i≥k} (forward + backward delays).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from staleness.pipeline.schedules import PipelineSchedule

__all__ = ["IDLE", "TickPlan", "make_plan"]

IDLE = -1
"""Entry of `TickPlan.fwd` / `TickPlan.bwd` where a stage has nothing to do."""


@dataclasses.dataclass(frozen=True, eq=False)
class TickPlan:
    """Tick tables of one run (see the module docstring).

    schedule: the resolved `PipelineSchedule`.
    num_batches: batches trained (each stage applies every batch's gradient once).
    """

    schedule: PipelineSchedule
    num_batches: int
    fwd: np.ndarray     # [T, K] int32 micro-batch id stage k forwards at tick t, or IDLE
    bwd: np.ndarray     # [T, K] int32 micro-batch id stage k backpropagates at tick t, or IDLE
    update: np.ndarray  # [T, K] bool: stage k applies an update after its backward at tick t

    # -- sizes ---------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.fwd.shape[1]

    @property
    def num_ticks(self) -> int:
        return self.fwd.shape[0]

    @property
    def microbatches(self) -> int:
        return self.schedule.microbatches

    @property
    def lags(self) -> tuple[int, ...]:
        return self.schedule.lags

    @property
    def offsets(self) -> tuple[int, ...]:
        return self.schedule.offsets

    @property
    def forward_delays(self) -> tuple[int, ...]:
        return self.schedule.forward_delays

    @property
    def backward_delays(self) -> tuple[int, ...]:
        return self.schedule.backward_delays

    # -- device phases ---------------------------------------------------------
    @property
    def forward_phases(self) -> tuple[int, ...]:
        """Sub-step of the tick in which stage k forwards on K devices: links of
        delay 0 chain stages within a tick (DDG, backprop), one message hop per sub-step."""
        f, out = self.forward_delays, [0]
        for k in range(1, self.num_stages):
            out.append(out[-1] + 1 if f[k - 1] == 0 else 0)
        return tuple(out)

    @property
    def backward_phases(self) -> tuple[int, ...]:
        """Sub-step of the tick's backward half in which stage k backpropagates."""
        b, out = self.backward_delays, [0]
        for k in range(self.num_stages - 2, -1, -1):
            out.append(out[-1] + 1 if b[k] == 0 else 0)
        return tuple(reversed(out))

    # -- derived tables ----------------------------------------------------------
    @cached_property
    def done_tick(self) -> np.ndarray:
        """[N] tick at whose end batch n's gradient has been applied at every stage."""
        m = self.microbatches
        last = np.full(self.num_batches, -1, np.int64)
        t, k = np.nonzero(self.update)
        np.maximum.at(last, self.bwd[t, k] // m, t)
        return last

    def batches_done(self, tick_end: int) -> int:
        """Batches fully applied (every stage) after the first `tick_end` ticks."""
        return int(np.count_nonzero(self.done_tick < tick_end))

    @cached_property
    def loss_tick(self) -> np.ndarray:
        """[N·M] tick at which the last stage computes micro-batch i's loss."""
        t, = np.nonzero(self.fwd[:, -1] != IDLE)
        out = np.empty(self.num_batches * self.microbatches, np.int64)
        out[self.fwd[t, -1]] = t
        return out

    def gaps(self) -> np.ndarray:
        """[K] forward/backward gap of each stage, in micro-batches: the id it
        forwards minus the id it backpropagates, at ticks that do both (-1 if
        none). Equals m_k for schedules without flush."""
        both = (self.fwd != IDLE) & (self.bwd != IDLE)
        out = np.full(self.num_stages, -1, np.int64)
        for k in range(self.num_stages):
            g = np.unique(self.fwd[both[:, k], k] - self.bwd[both[:, k], k])
            if len(g) == 1:
                out[k] = g[0]
            elif len(g) > 1:
                raise AssertionError(f"stage {k}: forward/backward gap not constant: {g}")
        return out

    def in_flight(self) -> np.ndarray:
        """[T, K] micro-batches stage k has forwarded but not yet backpropagated
        at the end of tick t (what its input queue holds)."""
        return np.cumsum(self.fwd != IDLE, axis=0) - np.cumsum(self.bwd != IDLE, axis=0)

    def xs(self, start: int, length: int) -> dict[str, np.ndarray]:
        """Scan inputs for ticks [start, start + length), padded with idle ticks."""
        end = min(start + length, self.num_ticks)
        pad = length - (end - start)
        k = self.num_stages

        def part(a, fill):
            a = a[start:end]
            return np.concatenate([a, np.full((pad, k), fill, a.dtype)]) if pad else a

        return {"tick": np.arange(start, start + length, dtype=np.int32),
                "fwd": part(self.fwd, IDLE), "bwd": part(self.bwd, IDLE), "update": part(self.update, False)}

    def describe(self) -> str:
        return (f"{self.schedule.describe()} on {self.num_stages} stages: lags m = {list(self.lags)}, "
                f"{self.num_batches} batches in {self.num_ticks} ticks")


def make_plan(schedule: PipelineSchedule, num_stages: int, num_batches: int) -> TickPlan:
    """The tick tables of `schedule` on `num_stages` stages for `num_batches` batches."""
    if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or num_batches < 1:
        raise ValueError(f"num_batches = {num_batches!r} must be an integer >= 1")
    sched = schedule.resolve(num_stages)
    k, n, m = num_stages, int(num_batches), sched.microbatches
    lags, offs = np.array(sched.lags), np.array(sched.offsets)
    if sched.flush:
        period = m + int(lags[0])
        inject = (np.arange(n)[:, None] * period + np.arange(m)[None, :]).reshape(-1)
        ticks = n * period
    else:
        inject = np.arange(n)
        ticks = n + int(lags[0])
    ids = np.arange(n * m)
    fwd = np.full((ticks, k), IDLE, np.int32)
    bwd = np.full((ticks, k), IDLE, np.int32)
    update = np.zeros((ticks, k), bool)
    for s in range(k):
        fwd[inject + offs[s], s] = ids
        tb = inject + offs[s] + lags[s]
        bwd[tb, s] = ids
        update[tb, s] = (ids % m == m - 1)
    return TickPlan(sched, n, fwd, bwd, update)
