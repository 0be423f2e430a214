"""The trace of a real run: the simulator's columns, filled as events happen.

One row per gradient in push order (a lost gradient at the time its loss was
detected), exactly `staleness.schedule`'s columns, plus the update times and
the loss of every gradient as a Python float. Losses are never kept as device
arrays: an array pulled from another process may fail to materialize long
after the pull returned (its peer died mid-transfer), and the Result must not
depend on a peer that may be gone. The transports hand the server a float
(converted in the worker or receiving thread, off the server's hot path). `to_schedule` turns it into a `Schedule`, leaving
out gradients that were pushed but not yet aggregated when the run ended, as
the simulator does.
"""

from __future__ import annotations

import math

import numpy as np

from staleness.schedule import NOT_APPLIED, Schedule

__all__ = ["Recorder", "InFlight"]

_COLS = ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start", "end",
         "push_time", "wait", "dropped", "lost")


class InFlight:
    """What the server knows of a released worker's current iteration."""

    __slots__ = ("iteration", "pull_version", "pull_time", "wait", "epoch")

    def __init__(self, iteration: int, pull_version: int, pull_time: float, wait: float, epoch: int):
        self.iteration = iteration
        self.pull_version = pull_version
        self.pull_time = pull_time
        self.wait = wait
        self.epoch = epoch


class Recorder:
    """Columns of the trace (Python lists; times in seconds since the run's start)."""

    def __init__(self):
        self.cols: dict[str, list] = {c: [] for c in _COLS}
        self.update_time: list[float] = []
        self.losses: list[float] = []   # [G] loss of each row (NaN: lost, or no loss)

    @property
    def num_updates(self) -> int:
        return len(self.update_time)

    @property
    def num_rows(self) -> int:
        return len(self.cols["worker"])

    def add(self, worker: int, f: InFlight, start: float, end: float, push_time: float,
            dropped: bool, lost: bool, loss: float | None) -> int:
        """Append one gradient's row; returns its index.

        loss: the gradient's loss as a Python float (None: NaN). Anything else is
        converted with `float()` here, which blocks on a device scalar: transports
        convert it before the server sees it (see the module docstring).
        """
        c = self.cols
        c["worker"].append(worker)
        c["iteration"].append(f.iteration)
        c["pull_version"].append(f.pull_version)
        c["apply_version"].append(NOT_APPLIED)
        c["pull_time"].append(f.pull_time)
        c["start"].append(start)
        c["end"].append(end)
        c["push_time"].append(push_time)
        c["wait"].append(f.wait)
        c["dropped"].append(dropped)
        c["lost"].append(lost)
        self.losses.append(math.nan if loss is None else (loss if type(loss) is float else float(loss)))
        return len(c["worker"]) - 1

    def applied(self, rows: list[int], now: float) -> None:
        """Rows `rows` were applied by the next update, at time `now`."""
        v = len(self.update_time)
        for r in rows:
            self.cols["apply_version"][r] = v
        self.update_time.append(now)

    def fetch_losses(self, lo: int = 0) -> np.ndarray:
        """[G - lo] the losses of rows lo.. (floats already: nothing is fetched)."""
        return np.asarray(self.losses[lo:], np.float64)

    def update_losses(self) -> np.ndarray:
        """[U] mean loss of each update's gradients."""
        losses = self.fetch_losses()
        av = np.asarray(self.cols["apply_version"], np.int64)
        ok = av != NOT_APPLIED
        u = self.num_updates
        total = np.bincount(av[ok], weights=losses[ok], minlength=u)[:u]
        count = np.bincount(av[ok], minlength=u)[:u]
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)

    def to_schedule(self, *, num_workers: int, policy: str, cluster: str, seed: int, rstar,
                    end_time: float, pending: list[int], meta: dict) -> Schedule:
        """The trace as a Schedule, without the `pending` (pushed, not applied) rows."""
        keep = np.ones(self.num_rows, bool)
        if pending:
            keep[pending] = False
        dtypes = {"worker": np.int32, "iteration": np.int64, "pull_version": np.int64,
                  "apply_version": np.int64, "dropped": np.bool_, "lost": np.bool_}
        columns = {k: np.asarray(v, dtypes.get(k, np.float64))[keep] for k, v in self.cols.items()}
        return Schedule(columns=columns, update_time=np.asarray(self.update_time, np.float64),
                        num_workers=num_workers, policy=policy, cluster=cluster, seed=seed,
                        rstar=tuple(rstar), end_time=float(end_time),
                        meta=dict(meta, pending_unapplied=len(pending)))

    # -- checkpoints ----------------------------------------------------------------
    def state(self) -> dict:
        """Plain-Python copy for a checkpoint."""
        return {"cols": {k: list(v) for k, v in self.cols.items()},
                "update_time": list(self.update_time), "losses": list(self.losses)}

    @classmethod
    def from_state(cls, state: dict) -> "Recorder":
        r = cls()
        r.cols = {k: list(state["cols"][k]) for k in _COLS}
        r.update_time = list(state["update_time"])
        r.losses = [float(x) for x in state["losses"]]
        return r
