"""Experiment tracking: a callback at every evaluation, and writers for TensorBoard and W&B.

    import staleness as st
    seen = []
    result = st.simulate("digits-mlp", "ssp:2", "1*4", num_updates=200, callbacks=seen.append)
    result = st.simulate("digits-mlp", "ssp:2", "1*4", num_updates=200,
                         callbacks=[st.tracking.TensorBoard("runs"), st.tracking.WandB("staleness")])

A callback is any callable of one `Evaluation` (which entry points take `callbacks=`: README, "Experiment
tracking"); the chunk runners call it through a `Tracker` once per history row, as the row is recorded (on
resume, only for the new rows). A callback may also have `finish(run, status)`, called once per run when it
ends; the writers close that run's files there. A callback that raises stops the run (`CallbackError`).

The writers' third-party packages are imported when a writer is made (not with this
module): `tensorboardX` (a core dependency) and `wandb` (the extra `staleness[wandb]`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Run", "Evaluation", "CallbackError", "Tracker", "TensorBoard", "WandB", "parse", "as_callbacks",
           "label", "callback_name", "report"]

SPECS = "'tensorboard:DIR' (TensorBoard event files under DIR) or 'wandb:PROJECT' (Weights & Biases)"


class Run(NamedTuple):
    """Which run an evaluation belongs to."""

    label: str              # unique among the runs of one call: 'ssp:2 seed=0 lr=0.1' (or config['label'])
    policy: str             # the policy's spec (pipeline: the schedule's)
    seed: int
    lr: float | None        # the learning rate the run starts from
    lr_rule: str            # the staleness lr rule's spec ('' for a pipeline)
    index: int              # its position among the configurations of the call (a sweep's order)
    config: dict            # the config its Result will carry (read it, do not change it)


class Evaluation(NamedTuple):
    """One evaluation of one run: what a callback receives."""

    step: int               # updates applied (pipeline: batches applied at every stage)
    time: float             # simulated seconds at that update
    wall_time: float        # wall-clock seconds this process spent in the run's compiled chunks so far
    metrics: dict           # {name: float}: train_loss (NaN at step 0) and the task's metrics (loss, accuracy, ...)
    run: Run


class CallbackError(RuntimeError):
    """A callback raised: the run stopped there. `callback` is its name, `__cause__` the
    original exception, `results` the Results recorded up to and including that
    evaluation (status 'stopped'; set by the runner)."""

    def __init__(self, message: str, callback: str):
        super().__init__(message)
        self.callback = callback
        self.results: list = []

    @property
    def result(self):
        """The first (for one run: the only) Result, or None."""
        return self.results[0] if self.results else None


def callback_name(callback) -> str:
    """A callback's name for messages: 'module.function', or the writer's repr."""
    qual = getattr(callback, "__qualname__", None)
    if qual is not None:
        module = getattr(callback, "__module__", None)
        return f"{module}.{qual}" if module else qual
    return repr(callback)


def as_callbacks(callbacks, what: str = "callbacks") -> tuple:
    """`callbacks` (None, a callable, a spec string for `parse`, or a list/tuple of them)
    as a tuple of callables; TypeError naming `what` for anything else."""
    if callbacks is None:
        return ()
    items = [callbacks] if isinstance(callbacks, str) or callable(callbacks) else callbacks
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{what} = {callbacks!r} must be a callable of one staleness.infra.tracking.Evaluation, a spec "
                        f"({SPECS}), or a list of them")
    out = []
    for c in items:
        if isinstance(c, str):
            c = parse(c, what=what)
        if not callable(c):
            raise TypeError(f"{what}: {c!r} is not callable; give a function of one staleness.infra.tracking.Evaluation, "
                            f"a writer such as staleness.infra.tracking.TensorBoard(logdir), or a spec ({SPECS})")
        out.append(c)
    return tuple(out)


def label(policy: str, seed: int, lr=None, lr_rule: str = "", config: dict | None = None) -> str:
    """A run's label: config['label'] when given, else 'POLICY seed=S[ lr=LR][ lr_rule=RULE]'
    (the lr rule when not 'constant')."""
    if config and isinstance(config.get("label"), str) and config["label"]:
        return config["label"]
    parts = [str(policy), f"seed={seed}"]
    if lr is not None:
        parts.append(f"lr={lr:g}" if isinstance(lr, (int, float)) else f"lr={lr}")
    if lr_rule and lr_rule != "constant":
        parts.append(f"lr_rule={lr_rule}")
    return " ".join(parts)


def _unique(runs: list) -> list:
    """`runs` with repeated labels made unique by their index ('... #3')."""
    labels = [r.label for r in runs]
    return [r._replace(label=f"{r.label} #{r.index}") if labels.count(r.label) > 1 else r for r in runs]


class Tracker:
    """Calls `callbacks` for the evaluations of `runs` (one `Run` per configuration of a call).

    The drivers' host loops own one: `evaluation` after each history row is recorded,
    `finish` once when the call ends."""

    # columns of a history row that are not metrics (the step, the time axes, the pipeline's tick)
    AXES = frozenset({"update", "time", "tick", "sim_time", "wall_time"})

    def __init__(self, callbacks: tuple, runs: list):
        self.callbacks = tuple(callbacks)
        self.runs = _unique(list(runs))
        self._started = [False] * len(self.runs)

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def row(self, index: int, row: dict, time: float, wall_time: float) -> None:
        """Report history row `row` of run `index` (simulated `time`, `wall_time` seconds)."""
        if not self.callbacks:
            return
        metrics = {k: float(v) for k, v in row.items() if k not in self.AXES}
        self.evaluation(Evaluation(int(row["update"]), float(time), float(wall_time), metrics, self.runs[index]))

    def evaluation(self, ev: Evaluation) -> None:
        """Call every callback with `ev`; the first that raises stops it as a `CallbackError`."""
        self._started[ev.run.index] = True
        for cb in self.callbacks:
            try:
                cb(ev)
            except Exception as e:   # KeyboardInterrupt passes: the loop stops the run on it
                name = callback_name(cb)
                raise CallbackError(f"callback {name} raised {type(e).__name__} at update {ev.step} of run "
                                    f"{ev.run.label!r}: {e}", name) from e

    def finish(self, statuses: list) -> CallbackError | None:
        """Call each callback's `finish(run, status)` for every run (with its status); the
        first error, as a `CallbackError`, is returned (not raised) after all were called."""
        first = None
        for run, status in zip(self.runs, statuses):
            for cb in self.callbacks:
                done = getattr(cb, "finish", None)
                if done is None:
                    continue
                try:
                    done(run, status)
                except Exception as e:
                    if first is None:
                        name = callback_name(cb)
                        first = CallbackError(f"callback {name} raised {type(e).__name__} finishing run "
                                              f"{run.label!r}: {e}", name)
                        first.__cause__ = e
        return first


def report(callbacks, result) -> None:
    """Call `callbacks` with every history row of a finished `result` (wall seconds as both
    times: a real run's history time is wall time), then finish its run; a callback error is
    raised as a `CallbackError` carrying the result. For a real run, whose snapshots are
    evaluated after serving (an evaluation would stall the server), not while it trains."""
    callbacks = as_callbacks(callbacks)
    if not callbacks:
        return
    cfg = result.config
    policy, rule = str(cfg.get("policy", result.schedule.policy.describe())), str(cfg.get("lr_rule", ""))
    tracker = Tracker(callbacks, [Run(label(policy, cfg.get("seed", 0), cfg.get("lr"), rule, cfg), policy,
                                      int(cfg.get("seed", 0)), cfg.get("lr"), rule, 0, cfg)])
    try:
        for row in result.history.to_dict("records"):
            tracker.row(0, row, row["time"], row["time"])
    except CallbackError as e:
        tracker.finish([result.status])
        e.results = [result]
        raise
    err = tracker.finish([result.status])
    if err is not None:
        err.results = [result]
        raise err


def _finite(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not math.isnan(v)}


def _dirname(text: str) -> str:
    """`text` as one portable directory name ('ssp:2 seed=0' -> 'ssp-2_seed=0')."""
    return re.sub(r"[^A-Za-z0-9._=+,#-]+", "_", text.replace(":", "-")).strip("_") or "run"


def _jsonable(config: dict) -> dict:
    return json.loads(json.dumps(config, default=str))


class TensorBoard:
    """Write every evaluation as TensorBoard scalars (with `tensorboardX`).

    Each run gets its own subdirectory of `logdir`, named after its label
    ('ssp:2 seed=0 lr=0.1' -> 'ssp-2_seed=0_lr=0.1'), so TensorBoard shows the runs
    of a sweep or a comparison as separate curves of the same tags. Every metric is
    a tag (train_loss, loss, accuracy, ...; NaN values are skipped), plus
    'sim_time' (simulated seconds) and 'wall_time' (wall seconds).

    Time axes: the event's step is the update index and its wall_time is the
    *simulated* time in seconds, so TensorBoard's 'Relative' x-axis shows simulated
    seconds (its 'Wall' axis then shows dates near 1970). The measured wall time
    is the 'wall_time' tag. A run's files are flushed and closed when it ends.

    Args:
      logdir: the directory (created if missing).
      flush_secs: seconds between background flushes while a run goes on.
    """

    def __init__(self, logdir, flush_secs: int = 10):
        if not isinstance(logdir, (str, Path)) or not str(logdir):
            raise TypeError(f"logdir = {logdir!r} must be a directory path (str or pathlib.Path)")
        try:
            import tensorboardX  # noqa: F401
        except ImportError:
            raise ImportError("staleness.infra.tracking.TensorBoard needs tensorboardX: pip install 'tensorboardX>=2.6'") \
                from None
        self.logdir = Path(logdir)
        self.flush_secs = int(flush_secs)
        self._writers: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"TensorBoard({str(self.logdir)!r})"

    def directory(self, run: Run) -> Path:
        """The directory of `run`'s event files."""
        return self.logdir / _dirname(run.label)

    def __call__(self, ev: Evaluation) -> None:
        from tensorboardX import SummaryWriter

        w = self._writers.get(ev.run.label)
        if w is None:
            w = self._writers[ev.run.label] = SummaryWriter(str(self.directory(ev.run)), flush_secs=self.flush_secs)
        scalars = {**_finite(ev.metrics), "sim_time": ev.time, "wall_time": ev.wall_time}
        for tag, value in scalars.items():
            w.add_scalar(tag, value, global_step=ev.step, walltime=ev.time)

    def finish(self, run: Run, status: str) -> None:
        """Flush and close `run`'s event file."""
        w = self._writers.pop(run.label, None)
        if w is not None:
            w.close()

    def close(self) -> None:
        """Close every run still open (a run normally closes when it ends)."""
        for key in list(self._writers):
            self._writers.pop(key).close()


class WandB:
    """Log every evaluation to Weights & Biases: one W&B run per run (named by its label,
    its Result's config as the W&B config, grouped by `group`).

    Each evaluation is one `log` call at step = the update index, with every metric
    (NaN values skipped), 'sim_time' (simulated seconds, the default x-axis of the
    charts: `define_metric('*', step_metric='sim_time')`) and 'wall_time'. Console
    capture is off (a sweep's runs are concurrent). A run is finished when it ends
    (exit code 1 when it diverged, else 0; its status in the summary's 'status').

    Args:
      project: the W&B project.
      mode: 'online', 'offline' (files under `dir`, upload later with `wandb sync`)
        or 'disabled'; None: W&B's default (the WANDB_MODE environment variable).
      dir: where W&B writes its files (None: WANDB_DIR, else the working directory).
      entity, group: W&B's entity (team) and run group.
    Needs the `wandb` package: `pip install 'staleness[wandb]'`.
    """

    MODES = ("online", "offline", "disabled")

    def __init__(self, project: str, *, mode: str | None = None, dir=None, entity: str | None = None,
                 group: str | None = None):
        if not isinstance(project, str) or not project:
            raise TypeError(f"project = {project!r} must be a non-empty string (the W&B project)")
        if mode is not None and mode not in self.MODES:
            raise ValueError(f"mode = {mode!r} must be one of {self.MODES} or None (WANDB_MODE)")
        _wandb()
        self.project, self.mode, self.dir, self.entity, self.group = project, mode, dir, entity, group
        self._runs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"WandB({self.project!r})"

    def __call__(self, ev: Evaluation) -> None:
        r = self._runs.get(ev.run.label)
        if r is None:
            r = self._runs[ev.run.label] = self._init(ev.run)
        r.log({**_finite(ev.metrics), "sim_time": ev.time, "wall_time": ev.wall_time}, step=ev.step)

    def _init(self, run: Run):
        wandb = _wandb()
        if self.dir is not None:
            Path(self.dir).mkdir(parents=True, exist_ok=True)
        r = wandb.init(project=self.project, entity=self.entity, group=self.group, name=run.label,
                       config=_jsonable(run.config), dir=None if self.dir is None else str(self.dir), mode=self.mode,
                       reinit="create_new", settings=wandb.Settings(console="off"))
        r.define_metric("sim_time")
        r.define_metric("*", step_metric="sim_time")
        return r

    def finish(self, run: Run, status: str) -> None:
        """Finish `run`'s W&B run (its files are complete afterwards)."""
        r = self._runs.pop(run.label, None)
        if r is not None:
            r.summary["status"] = status
            r.finish(exit_code=1 if status == "diverged" else 0)

    def close(self) -> None:
        """Finish every run still open (a run normally finishes when it ends)."""
        for key in list(self._runs):
            self._runs.pop(key).finish()


def _wandb():
    try:
        import wandb
    except ImportError:
        raise ImportError("staleness.infra.tracking.WandB needs the wandb package: pip install 'staleness[wandb]'") \
            from None
    return wandb


def parse(spec: str, what: str = "spec") -> Callable:
    """The writer of a spec: 'tensorboard:DIR' -> `TensorBoard(DIR)`, 'wandb:PROJECT' ->
    `WandB(PROJECT)` (mode from WANDB_MODE). `what` names the argument in errors
    (e.g. '--log'); ValueError for any other spec, TypeError for a non-string."""
    if not isinstance(spec, str):
        raise TypeError(f"{what} = {spec!r} must be a string: {SPECS}")
    kind, sep, rest = spec.partition(":")
    if sep and rest:
        if kind == "tensorboard":
            return TensorBoard(rest)
        if kind == "wandb":
            return WandB(rest)
    raise ValueError(f"{what} = {spec!r} must be {SPECS}")
