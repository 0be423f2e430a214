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

from staleness.infra import files
from staleness import policies as _policies

__all__ = ["Schedule", "NOT_APPLIED", "FORMAT_VERSION", "FileFormatError"]


class FileFormatError(ValueError):
    """A staleness file (or in-memory schedule) that is not valid: names the file and the field."""

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
    "pull_bytes": np.int64,     # bytes of the parameters pulled (pull_time -> start); 0: none or not measured
    "push_bytes": np.int64,     # bytes pushed (end -> push_time); a lost gradient: what had left before the loss
}
# Optional on load and construction (zeros when absent): schedules and traces
# written before the network model had no byte columns.
_OPTIONAL = ("pull_bytes", "push_bytes")


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """Event log of one run. Arrays are indexed by gradient (row)."""

    columns: dict[str, np.ndarray]       # see _COLUMNS
    update_time: np.ndarray              # [U] seconds at which update u (version u -> u+1) was applied
    num_workers: int
    policy: Any                          # the staleness.policies.Policy that made it (a spec string is parsed)
    cluster: str = ""                    # cluster description
    seed: int | None = None
    rstar: tuple[tuple[float, int, int], ...] = ()   # DSSP (time, worker, r*) of each controller call
    end_time: float = math.nan           # seconds simulated / recorded
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.policy, _policies.Policy):   # its spec: the policy it names, as a value
            object.__setattr__(self, "policy", _policies.recorded(self.policy))
        missing = [c for c in _COLUMNS if c not in self.columns and c not in _OPTIONAL]
        if missing:
            raise ValueError(f"Schedule: columns missing {missing}")
        n = {len(v) for v in self.columns.values()}
        if len(n) > 1:
            raise ValueError(f"Schedule: columns have different lengths {sorted(n)}")
        absent = [c for c in _OPTIONAL if c not in self.columns]
        if absent:   # a new dict: the caller's stays as it was
            g = len(self.columns["worker"])
            object.__setattr__(self, "columns", {**self.columns, **{c: np.zeros(g, np.int64) for c in absent}})

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
                 "pull_time", "start", "end", "push_time", "wait", "dropped", "lost", "pull_bytes", "push_bytes"]
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

    def comm_fraction(self) -> float:
        """The mean over workers of the fraction of the run each spent on transfers: a pull
        (its release to its parameters' arrival, `start − pull_time`) and a push (its compute's
        end to its arrival, `push_time − end`; none for a lost gradient)."""
        c = self.columns
        if not self.num_gradients or not (math.isfinite(self.end_time) and self.end_time > 0):
            return 0.0 if not self.num_gradients else math.nan
        pull = np.clip(c["start"] - c["pull_time"], 0.0, None)
        push = np.where(np.isfinite(c["push_time"]), np.clip(c["push_time"] - c["end"], 0.0, None), 0.0)
        per_worker = np.bincount(c["worker"], weights=pull + push, minlength=self.num_workers)
        return float(np.mean(per_worker) / self.end_time)

    def goodput(self) -> float:
        """Useful compute over the compute allocated: the compute seconds (end − start) of the
        applied gradients (or deltas, or rollouts) over λ × end_time. Time blocked at a gate or
        a synchronization window, on transfers, down after a failure, or computing what was
        then lost or dropped is not useful; nor, for elastic learners (`Cluster.elastic`), the
        share of their slices that were out or reconfiguring (the simulator's
        meta['useful_seconds']: the applied rows' full-rate compute). NaN for a run of no time."""
        c = self.columns
        if not (math.isfinite(self.end_time) and self.end_time > 0):
            return math.nan
        ok = self.applied
        useful = self.meta.get("useful_seconds")
        done = float(useful) if useful is not None else float(np.sum(c["end"][ok] - c["start"][ok]))
        return done / (self.num_workers * self.end_time)

    def staleness_histogram(self) -> np.ndarray:
        """counts[τ] of applied gradients with staleness τ."""
        s = self.staleness[self.applied]
        return np.bincount(s) if len(s) else np.zeros(1, np.int64)

    def bytes_totals(self) -> dict:
        """Bytes moved (plain ints): `bytes_sent` = `bytes_received` + `bytes_lost`.

        bytes_received: pull and push bytes of every gradient that was not lost
        (each of its transfers arrived). bytes_lost: the bytes moved for lost
        gradients (their pull, and their push if it had begun when the worker
        failed); they were sent but never delivered a gradient."""
        c = self.columns
        total = c["pull_bytes"] + c["push_bytes"]
        lost = int(total[c["lost"]].sum())
        received = int(total[~c["lost"]].sum())
        return {"bytes_sent": received + lost, "bytes_received": received, "bytes_lost": lost,
                "bytes_pulled": int(c["pull_bytes"].sum()), "bytes_pushed": int(c["push_bytes"].sum())}

    def transfer_intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every transfer with bytes, as (begin [T] s, end [T] s, bytes [T]).

        Pulls are pull_time -> start, pushes end -> push_time. A lost gradient's
        push has no arrival (push_time is NaN) and is left out."""
        c = self.columns
        begin = np.concatenate([c["pull_time"], c["end"]])
        end = np.concatenate([c["start"], c["push_time"]])
        nbytes = np.concatenate([c["pull_bytes"], c["push_bytes"]])
        keep = (nbytes > 0) & np.isfinite(begin) & np.isfinite(end)
        return begin[keep], end[keep], nbytes[keep]

    def peak_bandwidth(self) -> float:
        """Peak bytes per second in flight: the maximum over time of the sum, over
        the transfers in flight then, of each transfer's bytes / its duration
        (intervals of `transfer_intervals`, half-open; transfers of zero
        duration, instantaneous in the model, are left out). 0.0 without bytes."""
        begin, end, nbytes = self.transfer_intervals()
        dur = end - begin
        ok = dur > 0
        if not ok.any():
            return 0.0
        with np.errstate(over="ignore"):
            rate = nbytes[ok] / dur[ok]
        if not np.isfinite(rate).all():
            return math.inf   # bytes in a duration too short to divide by (a subnormal latency)
        times = np.concatenate([begin[ok], end[ok]])
        delta = np.concatenate([rate, -rate])
        # ends before starts at equal times: back-to-back transfers do not overlap
        order = np.lexsort((delta, times))
        with np.errstate(over="ignore", invalid="ignore"):
            level = np.cumsum(delta[order])
        if not np.isfinite(level).all():
            return math.inf   # finite rates whose sum overflows
        return float(max(0.0, level.max()))

    def peak_update_bytes(self) -> int:
        """The most bytes pushed for one update: max over updates of the push bytes of
        the gradients (or deltas) it applied. The burst a synchronization moves:
        Streaming DiLoCo's is 1/P of DiLoCo's (one fragment, fewer bits). 0 without bytes."""
        c = self.columns
        ok = self.applied
        if not ok.any():
            return 0
        per = np.bincount(c["apply_version"][ok], weights=c["push_bytes"][ok].astype(np.float64))
        return int(per.max())

    def summary(self) -> dict:
        """Headline statistics (plain Python values, JSON-friendly)."""
        s = self.staleness[self.applied]
        wf = self.wait_fraction()
        per_update = np.bincount(self.columns["apply_version"][self.applied], minlength=self.num_updates)
        out = {
            "policy": self.policy.describe(),
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
            "comm_fraction_mean": self.comm_fraction(),
            "goodput": self.goodput(),
        }
        out.update(self.bytes_totals())
        out["peak_bytes_per_s"] = self.peak_bandwidth()
        out["peak_update_bytes"] = self.peak_update_bytes()
        out["mean_bytes_per_s"] = (float(out["bytes_sent"] / self.end_time)
                                   if math.isfinite(self.end_time) and self.end_time > 0 else math.nan)
        if self.rstar:
            r = np.array([x[2] for x in self.rstar])
            out.update(rstar_calls=len(r), rstar_mean=float(r.mean()), rstar_max=int(r.max()))
        return out

    # -- persistence ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "num_workers": self.num_workers,
            "policy": self.policy.describe(),
            "cluster": self.cluster,
            "seed": self.seed,
            "end_time": self.end_time,
            "meta": self.meta,
            "rstar": [list(x) for x in self.rstar],
            "update_time": self.update_time.tolist(),
            "columns": {k: np.asarray(v).tolist() for k, v in self.columns.items()},
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "schedule") -> "Schedule":
        """Inverse of `to_dict`; raises FileFormatError naming `where` and the field."""
        def bad(field, why):
            return FileFormatError(f"{where}: field {field!r} {why}")

        if not isinstance(data, dict):
            raise FileFormatError(f"{where}: not a schedule (a JSON object with 'columns' and 'update_time')")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise bad("format_version", f"= {version!r} is not supported (this build reads {FORMAT_VERSION})")
        columns = data.get("columns")
        if not isinstance(columns, dict):
            raise bad("columns", "is missing or not an object")
        cols = {}
        for name, dtype in _COLUMNS.items():
            if name not in columns:
                if name in _OPTIONAL:
                    continue   # a file from before the byte columns: zeros (see __post_init__)
                raise bad(f"columns.{name}", "is missing")
            values = columns[name]
            if not isinstance(values, list):
                raise bad(f"columns.{name}", "is not a list")
            try:
                values = [math.nan if v is None else v for v in values]
                cols[name] = np.asarray(values, dtype=dtype)
            except (TypeError, ValueError, OverflowError):
                raise bad(f"columns.{name}", f"holds values that are not {np.dtype(dtype).name}") from None
            if cols[name].ndim != 1:
                raise bad(f"columns.{name}", "is not a flat list")
        try:
            update_time = np.asarray(data["update_time"], np.float64)
            num_workers = data["num_workers"]
            if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
                raise bad("num_workers", f"= {num_workers!r} must be an integer >= 1")
            policy = data["policy"]
            if not isinstance(policy, str):
                raise bad("policy", f"= {policy!r} must be a string")
            rstar = tuple((float(t), int(w), int(r)) for t, w, r in data.get("rstar", []))
            end_time = float(math.nan if data.get("end_time") is None else data["end_time"])
            meta = data.get("meta", {})
        except KeyError as e:
            raise bad(e.args[0], "is missing") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, FileFormatError):
                raise
            raise FileFormatError(f"{where}: malformed field ({str(e).splitlines()[0]})") from None
        if update_time.ndim != 1:
            raise bad("update_time", "is not a flat list")
        try:
            sched = cls(columns=cols, update_time=update_time, num_workers=num_workers, policy=policy,
                        cluster=str(data.get("cluster", "")), seed=data.get("seed"), rstar=rstar,
                        end_time=end_time, meta=meta if isinstance(meta, dict) else {})
        except ValueError as e:
            raise FileFormatError(f"{where}: {e}") from None
        sched.validate(where)
        return sched

    def validate(self, where: str = "schedule") -> "Schedule":
        """Check the schedule's consistency; returns it. Raises FileFormatError naming
        `where` and the first bad field: workers in 0..num_workers-1, iterations and
        versions >= 0, every applied gradient applied at or after the version it was
        computed on and before num_updates, every update applying at least one
        gradient, dropped/lost gradients not applied, update times non-decreasing,
        byte counts >= 0."""
        c, u = self.columns, self.num_updates

        def bad(field, row, why):
            raise FileFormatError(f"{where}: field {field!r} (row {row}) {why}")

        def first(mask):
            return int(np.flatnonzero(mask)[0])

        w = c["worker"]
        if len(w) and ((w < 0) | (w >= self.num_workers)).any():
            i = first((w < 0) | (w >= self.num_workers))
            bad("worker", i, f"= {int(w[i])} is not a worker of this {self.num_workers}-worker schedule "
                f"(valid: 0..{self.num_workers - 1})")
        for name in ("iteration", "pull_version", "pull_bytes", "push_bytes"):
            if len(c[name]) and (c[name] < 0).any():
                i = first(c[name] < 0)
                bad(name, i, f"= {int(c[name][i])} must be >= 0")
        av, pv = c["apply_version"], c["pull_version"]
        applied = av != NOT_APPLIED
        wrong = applied & ((av < pv) | (av >= u) | (av < 0))
        if wrong.any():
            i = first(wrong)
            bad("apply_version", i, f"= {int(av[i])} must lie in pull_version ({int(pv[i])})..num_updates-1 "
                f"({u - 1}), or be {NOT_APPLIED} (not applied)")
        if (pv > u).any():
            i = first(pv > u)
            bad("pull_version", i, f"= {int(pv[i])} exceeds num_updates ({u})")
        both = applied & (c["dropped"] | c["lost"])
        if both.any():
            bad("apply_version", first(both), "is set for a dropped or lost gradient")
        if u:
            counts = np.bincount(av[applied], minlength=u)[:u]
            if (counts == 0).any():
                raise FileFormatError(f"{where}: update {int(np.flatnonzero(counts == 0)[0])} applies no gradient "
                                      f"(field 'apply_version')")
            t = self.update_time
            if not np.isfinite(t).all() or (np.diff(t) < 0).any():
                raise FileFormatError(f"{where}: field 'update_time' must be finite and non-decreasing")
        return self

    def save(self, path) -> None:
        """Write as JSON (NaN written as null), atomically."""
        data = self.to_dict()
        data["columns"] = {k: [None if isinstance(x, float) and math.isnan(x) else x for x in v]
                           for k, v in data["columns"].items()}
        if isinstance(data["end_time"], float) and math.isnan(data["end_time"]):
            data["end_time"] = None
        files.write_text(path, json.dumps(data))

    @classmethod
    def load(cls, path) -> "Schedule":
        """Read a schedule JSON file; raises FileFormatError naming the file and the field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except UnicodeDecodeError:
            raise FileFormatError(f"{path}: not a schedule JSON file (not text)") from None
        except json.JSONDecodeError as e:
            raise FileFormatError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        return cls.from_dict(data, where=str(path))

    def equals(self, other: "Schedule") -> bool:
        """Exact equality of every column and update time (NaN == NaN)."""
        if self.num_gradients != other.num_gradients or self.num_updates != other.num_updates:
            return False
        for k in _COLUMNS:
            if not np.array_equal(self.columns[k], other.columns[k], equal_nan=self.columns[k].dtype.kind == "f"):
                return False
        return np.array_equal(self.update_time, other.update_time) and self.rstar == other.rstar


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
