"""`Result`: what a simulated (or real) training run produced, and its files.

A Result holds the evaluation history (update, simulated time, metrics), the
schedule that was replayed, the final parameters and the run's configuration.
`save` writes a directory (`result.json`, `history.csv`, `schedule.json`,
`params.npz`) with a format version; `Result.load` reads it back. Plots live
in `staleness.plots` so that the core never imports matplotlib.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from staleness.schedule import Schedule

__all__ = ["Result", "FORMAT_VERSION", "DivergenceError", "flatten_params", "unflatten_params"]

FORMAT_VERSION = 1


class DivergenceError(FloatingPointError):
    """Training produced a non-finite loss. `.result` keeps the history up to there."""

    def __init__(self, message: str, result: "Result"):
        super().__init__(message)
        self.result = result


def flatten_params(params, prefix: str = "") -> dict[str, np.ndarray]:
    """Nested dicts/lists of arrays -> {'a/b/0': array} (for .npz files)."""
    out: dict[str, np.ndarray] = {}
    if isinstance(params, dict):
        for k in sorted(params):
            out.update(flatten_params(params[k], f"{prefix}{k}/"))
    elif isinstance(params, (list, tuple)):
        for i, v in enumerate(params):
            out.update(flatten_params(v, f"{prefix}#{i}/"))
    else:
        out[prefix[:-1] if prefix else "value"] = np.asarray(params)
    return out


def unflatten_params(flat: dict[str, np.ndarray]):
    """Inverse of `flatten_params` (lists come back as lists)."""
    if list(flat) == ["value"]:
        return flat["value"]
    root: dict = {}
    for key, value in flat.items():
        node = root
        parts = key.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value

    def fix(node):
        if isinstance(node, dict):
            node = {k: fix(v) for k, v in node.items()}
            if node and all(k.startswith("#") for k in node):
                return [node[f"#{i}"] for i in range(len(node))]
        return node

    return fix(root)


@dataclasses.dataclass(eq=False)
class Result:
    """One training run.

    history: pandas DataFrame with one row per evaluation point: `update`
      (version evaluated), `time` (simulated seconds when that version
      existed), `train_loss` (mean loss of the gradients applied since the
      previous row, on the parameters each was computed on) and the task's
      metrics (`loss`, `accuracy`, ...) on held-out data.
    schedule: the `Schedule` that was replayed (a trace for real runs).
    params: final parameters (NumPy pytree).
    config: what produced it (task, policy, cluster, seed, lr, ...).
    train_loss: [U] mean loss of each update's gradients.
    status: 'complete', 'diverged' or 'stopped' (interrupted; resumable).
    """

    history: Any
    schedule: Schedule
    params: Any
    config: dict
    train_loss: np.ndarray
    status: str = "complete"

    @property
    def final(self) -> dict:
        """The last history row as a dict."""
        return self.history.iloc[-1].to_dict() if len(self.history) else {}

    def time_to(self, target: float, metric: str = "accuracy") -> float:
        """First simulated time (s) at which `metric` reached `target` (NaN if never).
        For 'loss'-like metrics the target is reached when the metric is <= target."""
        if metric not in self.history:
            raise ValueError(f"metric = {metric!r} not in history columns {list(self.history.columns)}")
        values = self.history[metric].to_numpy()
        hit = values <= target if "loss" in metric else values >= target
        idx = np.flatnonzero(hit)
        return float(self.history["time"].iloc[idx[0]]) if len(idx) else math.nan

    def summary(self, target: float | None = None, metric: str = "accuracy") -> dict:
        """Schedule statistics plus final metrics (and time to `target`)."""
        out = {"policy": self.config.get("policy", self.schedule.policy)}
        s = self.schedule.summary()
        for k in ("updates", "sim_time_s", "updates_per_s", "staleness_mean", "staleness_max",
                  "wait_fraction_mean", "dropped", "lost"):
            out[k] = s[k]
        for k, v in self.final.items():
            if k not in ("update", "time"):
                out[f"final_{k}"] = float(v)
        if target is not None and metric in self.history:
            out[f"time_to_{metric}_{target:g}"] = self.time_to(target, metric)
        out["status"] = self.status
        return out

    # -- files -----------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the result into directory `path` (created); returns it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.history.to_csv(path / "history.csv", index=False)
        self.schedule.save(path / "schedule.json")
        np.savez(path / "params.npz", **flatten_params(self.params))
        np.save(path / "train_loss.npy", np.asarray(self.train_loss))
        meta = {"format_version": FORMAT_VERSION, "status": self.status, "config": _jsonable(self.config)}
        (path / "result.json").write_text(json.dumps(meta, indent=1))
        return path

    @classmethod
    def load(cls, path) -> "Result":
        import pandas as pd

        path = Path(path)
        meta_file = path / "result.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"{meta_file} not found: not a staleness result directory")
        meta = json.loads(meta_file.read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"result format_version = {meta.get('format_version')!r} is not supported "
                f"(this build reads {FORMAT_VERSION})"
            )
        with np.load(path / "params.npz") as z:
            params = unflatten_params({k: z[k] for k in z.files})
        return cls(
            history=pd.read_csv(path / "history.csv"),
            schedule=Schedule.load(path / "schedule.json"),
            params=params,
            config=meta["config"],
            train_loss=np.load(path / "train_loss.npy"),
            status=meta["status"],
        )


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
