"""`Result`: what a simulated (or real) training run produced, and its files.

A Result holds the evaluation history (update, simulated time, metrics), the
schedule that was replayed, the final parameters and the run's configuration.
`save` writes a directory (`result.json`, `history.csv`, `schedule.json`,
`params.npz`, and an RL run's per-update `diagnostics.csv`) with a format version; `Result.load` reads it back. Plots live
in `staleness.results.plots` so that the core never imports matplotlib.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from staleness.infra import files, interrupts
from staleness.tasks import metrics as _metrics
from staleness.tasks.metrics import Metric
from staleness.schedule import FileFormatError, Schedule

__all__ = ["Result", "FORMAT_VERSION", "DivergenceError", "FileFormatError", "STATUSES", "flatten_params",
           "unflatten_params"]

STATUSES = ("complete", "diverged", "stopped", "failed")

ORBAX_DIR = "orbax"
"""The Result directory's orbax-checkpoint of the final parameters (a plain nested dict of
arrays, the same pytree as `params.npz`): load it with
`orbax.checkpoint.StandardCheckpointer().restore(Path(result_dir, "orbax").absolute())`, then
`model.apply({"params": params}, x)` for a linen model or
`staleness.tasks.load_into(module, params)` for an nnx module."""


def _save_orbax(path: Path, params) -> bool:
    """Write `params` as an orbax checkpoint at `path` (a new directory); False where it is
    not written: several JAX processes (an orbax save would wait for all of them, while
    only process 0 writes a Result) or no orbax-checkpoint installed."""
    import jax

    if jax.process_count() > 1:
        return False
    try:
        import orbax.checkpoint as ocp
    except ImportError:   # pragma: no cover - flax depends on it
        return False
    # its commit runs on a thread: a Ctrl-C waits for it (else the interrupted caller's cleanup
    # removes the directory under the commit, which then fails with a traceback)
    with interrupts.deferred(), ocp.StandardCheckpointer() as ckpt:
        ckpt.save(Path(path).absolute(), jax.tree.map(np.asarray, params))
        ckpt.wait_until_finished()
    return True

FORMAT_VERSION = 1


class DivergenceError(FloatingPointError):
    """Training produced a non-finite loss. `.result` keeps the history up to there."""

    def __init__(self, message: str, result: "Result"):
        super().__init__(message)
        self.result = result


def flatten_params(params, prefix: str = "") -> dict[str, np.ndarray]:
    """Params pytree -> {'a/b/0': array} (for .npz files).

    Nodes: mappings (dicts, FrozenDicts, flax nnx `State`s; keys written with
    str()), lists and tuples ('#i' entries); leaves: arrays and numbers of a
    numeric or bool dtype, and flax nnx `Variable`s (their value). Anything else
    (objects, None, PRNG key arrays) is a TypeError naming its path: saving it
    would write junk that does not load back as the weights."""
    out: dict[str, np.ndarray] = {}
    where = prefix[:-1] if prefix else "value"
    if isinstance(params, Mapping):
        keys = {str(k): k for k in params}
        if len(keys) != len(params):
            raise TypeError(f"params at {where!r}: keys {list(params)} collide when written as strings")
        for name in sorted(keys):
            if "/" in name or name.startswith("#") or not name:
                raise TypeError(f"params at {where!r}: key {name!r} cannot be saved (empty, contains '/' or "
                                "starts with '#')")
            out.update(flatten_params(params[keys[name]], f"{prefix}{name}/"))
        return out
    if isinstance(params, (list, tuple)):
        for i, v in enumerate(params):
            out.update(flatten_params(v, f"{prefix}#{i}/"))
        return out
    value = _leaf_value(params)
    if value is None:
        raise TypeError(f"params at {where!r}: a {type(params).__name__} is not an array; Result.save writes "
                        "params that are nested dicts/lists of numeric arrays (convert the model's state to "
                        "arrays first, e.g. flax.nnx.to_pure_dict)")
    out[where] = value
    return out


def _leaf_value(leaf) -> np.ndarray | None:
    """`leaf` as a NumPy array of a numeric/bool dtype, or None if it is not one."""
    variable = _nnx_variable_type()
    if variable is not None and isinstance(leaf, variable):
        leaf = leaf.get_value()
    if leaf is None or isinstance(leaf, (str, bytes)):
        return None
    try:
        import jax

        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return None
    except ImportError:  # pragma: no cover
        pass
    try:
        value = np.asarray(leaf)
    except Exception:  # noqa: BLE001 - anything numpy cannot convert is not an array
        return None
    if value.dtype.kind not in "biufc" and value.dtype.type.__module__ != "ml_dtypes":   # bfloat16, float8
        return None
    return value


def _nnx_variable_type():
    """flax.nnx.Variable if flax is already imported (params from nnx models), else None."""
    import sys

    if "flax.nnx" not in sys.modules and "flax" not in sys.modules:
        return None
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return None
    return nnx.Variable


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
    status: 'complete', 'diverged', 'stopped' (interrupted; resumable) or 'failed' (every
      worker was lost before the budget: `config['ended']` says when).
    diagnostics: asynchronous RL: a DataFrame with one row per update (`update`, what the
      learner logged, `staleness.engine.rollout.DIAGNOSTICS`, then staleness_mean and dropped);
      the history rows hold their means over each evaluation interval. None otherwise.
    """

    history: Any
    schedule: Schedule
    params: Any
    config: dict
    train_loss: np.ndarray
    status: str = "complete"
    diagnostics: Any = None

    @property
    def final(self) -> dict:
        """The last history row as a dict."""
        return self.history.iloc[-1].to_dict() if len(self.history) else {}

    def metric(self, name: str) -> Metric:
        """The `staleness.tasks.metrics.Metric` `name` (direction and range) as the run's task
        declared it (config['metrics']), else as known by name."""
        info = self.config.get("metrics") or {}
        if name in info:
            return Metric.from_json(name, info[name])
        if name == "train_loss":   # the history's mean minibatch loss of each chunk: lower is better
            return Metric("train_loss", "lower")
        return _metrics.get(name)

    def time_to(self, target: float, metric: str = "accuracy") -> float:
        """First time (s; simulated, or wall for real runs) at which `metric` reached
        `target` in the metric's direction (>= for accuracy, <= for a loss); NaN if never."""
        if metric not in self.history:
            raise ValueError(f"metric = {metric!r} is not in the history; valid: "
                             f"{', '.join(c for c in self.history.columns if c not in ('update', 'time'))}")
        hit = self.metric(metric).reached(self.history[metric].to_numpy(), target)
        idx = np.flatnonzero(hit)
        return float(self.history["time"].iloc[idx[0]]) if len(idx) else math.nan

    def summary(self, target: float | None = None, metric: str = "accuracy") -> dict:
        """Schedule statistics plus final metrics (and time to `target`, in seconds). The
        column names are those of `staleness.results.compare`'s table; a real run's duration is
        `wall_time_s` (a simulated one's `sim_time_s`)."""
        out = {"policy": self.config.get("policy", self.schedule.policy.describe())}
        s = self.schedule.summary()
        real = self.schedule.meta.get("recorded") == "runtime"   # a real run's times are wall seconds
        for k in ("updates", "sim_time_s", "updates_per_s", "staleness_mean", "staleness_max",
                  "wait_fraction_mean", "comm_fraction_mean", "goodput", "bytes_sent", "dropped", "lost"):
            out["wall_time_s" if real and k == "sim_time_s" else k] = s[k]
        diag = set(self.diagnostics.columns) if self.diagnostics is not None else set()
        for k, v in self.final.items():
            if k not in ("update", "time") and k not in diag:
                out[f"final_{k}"] = float(v)
        for k in sorted(diag - {"update"}):   # an RL learner's: the mean over its updates (the largest weight)
            col = self.diagnostics[k]
            out[k] = float(col.max() if k == "is_weight_max" else col.mean())
        if target is not None:   # time_to names the valid metrics when `metric` is not in the history
            out[f"time_to_{metric}_{target:g}_s"] = self.time_to(target, metric)
        out["status"] = self.status
        return out

    # -- files -----------------------------------------------------------------
    def save(self, path, *, overwrite: bool = False, extra=None) -> Path:
        """Write the result into directory `path`, atomically (built beside it, then
        renamed into place); returns it. An existing Result there is replaced only
        with overwrite=True, and then none of its old files stays behind.
        extra: optional callable(directory) writing more files (plots) into the
        directory before it is renamed into place."""
        def write(d: Path) -> None:
            self._write(d)
            if extra is not None:
                extra(d)

        return files.write_dir(path, write, overwrite=overwrite)

    def _write(self, path: Path) -> None:
        self.history.to_csv(path / "history.csv", index=False)
        self.schedule.save(path / "schedule.json")
        np.savez(path / "params.npz", **flatten_params(self.params))
        orbax = _save_orbax(path / ORBAX_DIR, self.params)
        np.save(path / "train_loss.npy", np.asarray(self.train_loss))
        if self.diagnostics is not None:
            self.diagnostics.to_csv(path / "diagnostics.csv", index=False)
        meta = {"format_version": FORMAT_VERSION, "status": self.status, "config": _jsonable(self.config)}
        if orbax:
            meta["orbax"] = ORBAX_DIR
        (path / "result.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, path) -> "Result":
        """Read a Result directory written by `save`, checking every file.

        Raises FileNotFoundError (no result.json: not a Result directory) or
        FileFormatError (a ValueError) naming the file and the field that is
        truncated, corrupted or inconsistent with the rest.
        """
        import pandas as pd

        path = Path(path)
        meta_file = path / "result.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{meta_file} not found: not a staleness result directory")
        try:
            meta = json.loads(meta_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FileFormatError(f"{meta_file}: not valid JSON ({getattr(e, 'msg', e)})") from None
        if not isinstance(meta, dict):
            raise FileFormatError(f"{meta_file}: not a JSON object")
        if meta.get("format_version") != FORMAT_VERSION:
            raise FileFormatError(
                f"{meta_file}: field 'format_version' = {meta.get('format_version')!r} is not supported "
                f"(this build reads {FORMAT_VERSION})")
        if meta.get("status") not in STATUSES:
            raise FileFormatError(f"{meta_file}: field 'status' = {meta.get('status')!r} must be one of {STATUSES}")
        if not isinstance(meta.get("config"), dict):
            raise FileFormatError(f"{meta_file}: field 'config' is missing or not an object")
        for name in ("schedule.json", "params.npz", "train_loss.npy", "history.csv"):
            if not (path / name).is_file():
                raise FileFormatError(f"{path / name}: missing (the Result directory is incomplete)")
        schedule = Schedule.load(path / "schedule.json")
        params = _read(path / "params.npz", _load_params, "truncated or corrupted: ")
        train_loss = _read(path / "train_loss.npy", lambda p: np.load(p, allow_pickle=False),
                           "truncated or corrupted: ", line=False)
        if train_loss.ndim != 1 or len(train_loss) > schedule.num_updates:
            raise FileFormatError(f"{path / 'train_loss.npy'}: holds {train_loss.shape} values for a schedule "
                                  f"of {schedule.num_updates} updates")
        history = _read(path / "history.csv", pd.read_csv)
        for col in ("update", "time"):
            if col not in history or not pd.api.types.is_numeric_dtype(history[col]):
                raise FileFormatError(f"{path / 'history.csv'}: column {col!r} is missing or not numeric")
        if len(history) and (history["update"].max() > schedule.num_updates or history["update"].min() < 0):
            raise FileFormatError(f"{path / 'history.csv'}: column 'update' goes beyond the schedule's "
                                  f"{schedule.num_updates} updates")
        diagnostics = None
        if (path / "diagnostics.csv").is_file():
            diagnostics = _read(path / "diagnostics.csv", pd.read_csv, line=False)
            if "update" not in diagnostics or len(diagnostics) > schedule.num_updates:
                raise FileFormatError(f"{path / 'diagnostics.csv'}: needs an 'update' column and at most one row "
                                      f"per update of the schedule ({schedule.num_updates})")
        return cls(history=history, schedule=schedule, params=params, config=meta["config"],
                   train_loss=train_loss, status=meta["status"], diagnostics=diagnostics)


def _read(path: Path, read, what: str = "", line: bool = True):
    """`read(path)`, or a FileFormatError naming the file and the error (its type; with
    `line`, its message's first line)."""
    try:
        return read(path)
    except Exception as e:  # noqa: BLE001 - zipfile, numpy and pandas raise many types for a damaged file
        first = f": {str(e).splitlines()[0] if str(e) else ''}" if line else ""
        raise FileFormatError(f"{path}: cannot be read ({what}{type(e).__name__}{first})") from None


def _load_params(path: Path):
    with np.load(path, allow_pickle=False) as z:
        return unflatten_params({k: z[k] for k in z.files})


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


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
