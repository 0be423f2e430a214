"""`Schedule`: the event log of one run, simulated or recorded from real hardware.

It is the contract between the control plane (policy + timing) and the data
plane (numerics): for each gradient its worker, iteration, the version it was
computed on, when it was computed and pushed, the update that applied it, its
staleness and the time its worker waited at the gate before it. A trace of a
real run is the same type.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Schedule", "NOT_APPLIED", "FORMAT_VERSION"]

NOT_APPLIED = -1  # apply_version of a dropped or lost gradient
FORMAT_VERSION = 1

# column name -> dtype; one entry per gradient, in push order (lost ones at failure time)
_COLUMNS: dict[str, Any] = {
    "worker": np.int32,
    "iteration": np.int64,      # the worker's clock when it started this gradient
    "pull_version": np.int64,   # server version of the params it computed on
    "apply_version": np.int64,  # version when applied (NOT_APPLIED if dropped/lost)
    "pull_time": np.float64,    # seconds: released by the gate, params requested
    "start": np.float64,        # seconds: compute start (params arrived)
    "end": np.float64,          # seconds: compute end
    "push_time": np.float64,    # seconds: gradient arrived at the server (NaN if lost)
    "wait": np.float64,         # seconds blocked at the gate before this iteration
    "dropped": np.bool_,        # rejected by the policy (e.g. late backup gradient)
    "lost": np.bool_,           # its worker failed before the push arrived
}


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Event log of one run. Arrays are indexed by gradient (row)."""

    columns: dict[str, np.ndarray]       # see _COLUMNS
    update_time: np.ndarray              # [U] seconds at which update u (version u -> u+1) was applied
    num_workers: int
    policy: str                          # policy spec, e.g. "ssp:3"
    cluster: str = ""                    # cluster description
    seed: int | None = None
    rstar: tuple[tuple[float, int, int], ...] = ()   # DSSP (time, worker, r*) of each controller call
    end_time: float = math.nan           # seconds simulated / recorded
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        missing = [c for c in _COLUMNS if c not in self.columns]
        if missing:
            raise ValueError(f"Schedule: columns missing {missing}")
        n = {len(v) for v in self.columns.values()}
        if len(n) > 1:
            raise ValueError(f"Schedule: columns have different lengths {sorted(n)}")

    # -- sizes -------------------------------------------------------------
    @property
    def num_gradients(self) -> int:
        return len(self.columns["worker"])

    @property
    def num_updates(self) -> int:
        return len(self.update_time)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    @property
    def staleness(self) -> np.ndarray:
        """[G] apply_version − pull_version; −1 for gradients never applied."""
        a, p = self.columns["apply_version"], self.columns["pull_version"]
        return np.where(a == NOT_APPLIED, -1, a - p)

    @property
    def applied(self) -> np.ndarray:
        return self.columns["apply_version"] != NOT_APPLIED

    # -- views ---------------------------------------------------------------
    def to_frame(self):
        """pandas DataFrame, one row per gradient; `apply_version` and
        `staleness` are nullable integers (<NA> when not applied)."""
        import pandas as pd

        cols = dict(self.columns)
        missing = ~self.applied
        frame = pd.DataFrame(cols)
        frame["apply_version"] = pd.arrays.IntegerArray(cols["apply_version"].copy(), missing)
        frame["staleness"] = pd.arrays.IntegerArray(
            cols["apply_version"] - cols["pull_version"], missing.copy()
        )
        order = ["worker", "iteration", "pull_version", "apply_version", "staleness",
                 "pull_time", "start", "end", "push_time", "wait", "dropped", "lost"]
        return frame[order]

    def update_members(self, max_slots: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Gradients of each update, padded: (index [U, C] int, mask [U, C] bool).

        Rows are in push order within an update; C is the largest update size
        (or `max_slots`, which must be at least that)."""
        applied = np.flatnonzero(self.applied)
        av = self.columns["apply_version"][applied]
        order = np.argsort(av, kind="stable")
        applied, av = applied[order], av[order]
        counts = np.bincount(av, minlength=self.num_updates)[: self.num_updates]
        width = int(counts.max()) if len(counts) else 1
        if max_slots is not None:
            if max_slots < width:
                raise ValueError(f"max_slots = {max_slots} < largest update size {width}")
            width = max_slots
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(counts) else np.zeros(0, int)
        slot = np.arange(len(av)) - starts[av]
        index = np.zeros((self.num_updates, max(width, 1)), np.int64)
        mask = np.zeros_like(index, dtype=bool)
        index[av, slot] = applied
        mask[av, slot] = True
        return index, mask

    # -- summaries -----------------------------------------------------------
    def wait_fraction(self) -> np.ndarray:
        """[λ] fraction of each worker's elapsed time spent blocked at the gate."""
        w = self.columns["worker"]
        total = np.bincount(w, weights=self.columns["wait"], minlength=self.num_workers)
        horizon = self.end_time if math.isfinite(self.end_time) and self.end_time > 0 else (
            float(np.nanmax(self.columns["push_time"])) if self.num_gradients else 0.0)
        return total / horizon if horizon > 0 else np.zeros(self.num_workers)

    def staleness_histogram(self) -> np.ndarray:
        """counts[τ] of applied gradients with staleness τ."""
        s = self.staleness[self.applied]
        return np.bincount(s) if len(s) else np.zeros(1, np.int64)

    def summary(self) -> dict:
        """Headline statistics (plain Python values, JSON-friendly)."""
        s = self.staleness[self.applied]
        wf = self.wait_fraction()
        per_update = np.bincount(self.columns["apply_version"][self.applied], minlength=self.num_updates)
        out = {
            "policy": self.policy,
            "cluster": self.cluster,
            "workers": self.num_workers,
            "updates": self.num_updates,
            "gradients": self.num_gradients,
            "applied": int(self.applied.sum()),
            "dropped": int(self.columns["dropped"].sum()),
            "lost": int(self.columns["lost"].sum()),
            "sim_time_s": float(self.end_time),
            "updates_per_s": float(self.num_updates / self.end_time) if self.end_time > 0 else math.nan,
            "gradients_per_update": float(per_update.mean()) if self.num_updates else math.nan,
            "staleness_mean": float(s.mean()) if len(s) else math.nan,
            "staleness_max": int(s.max()) if len(s) else 0,
            "staleness_p99": float(np.percentile(s, 99)) if len(s) else math.nan,
            "wait_fraction_mean": float(wf.mean()),
            "wait_fraction_max": float(wf.max()),
        }
        if self.rstar:
            r = np.array([x[2] for x in self.rstar])
            out.update(rstar_calls=len(r), rstar_mean=float(r.mean()), rstar_max=int(r.max()))
        return out

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "num_workers": self.num_workers,
            "policy": self.policy,
            "cluster": self.cluster,
            "seed": self.seed,
            "end_time": self.end_time,
            "meta": self.meta,
            "rstar": [list(x) for x in self.rstar],
            "update_time": self.update_time.tolist(),
            "columns": {k: np.asarray(v).tolist() for k, v in self.columns.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"schedule format_version = {version!r} is not supported (this build reads {FORMAT_VERSION})"
            )
        cols = {}
        for name, dtype in _COLUMNS.items():
            if name not in data["columns"]:
                raise ValueError(f"schedule: column {name!r} missing")
            values = [math.nan if v is None else v for v in data["columns"][name]]
            cols[name] = np.asarray(values, dtype=dtype)
        return cls(
            columns=cols,
            update_time=np.asarray(data["update_time"], np.float64),
            num_workers=int(data["num_workers"]),
            policy=data["policy"],
            cluster=data.get("cluster", ""),
            seed=data.get("seed"),
            rstar=tuple((float(t), int(w), int(r)) for t, w, r in data.get("rstar", [])),
            end_time=float(data.get("end_time", math.nan)),
            meta=data.get("meta", {}),
        )

    def save(self, path) -> None:
        """Write as JSON (NaN written as null)."""
        data = self.to_dict()
        data["columns"] = {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v]
                           for k, v in data["columns"].items()}
        if isinstance(data["end_time"], float) and math.isnan(data["end_time"]):
            data["end_time"] = None
        Path(path).write_text(json.dumps(data))

    @classmethod
    def load(cls, path) -> "Schedule":
        data = json.loads(Path(path).read_text())
        if data.get("end_time") is None:
            data["end_time"] = math.nan
        return cls.from_dict(data)

    def equals(self, other: "Schedule") -> bool:
        """Exact equality of every column and update time (NaN == NaN)."""
        if self.num_gradients != other.num_gradients or self.num_updates != other.num_updates:
            return False
        for k in _COLUMNS:
            if not np.array_equal(self.columns[k], other.columns[k], equal_nan=self.columns[k].dtype.kind == "f"):
                return False
        return np.array_equal(self.update_time, other.update_time) and self.rstar == other.rstar
