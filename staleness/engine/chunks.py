"""The evaluation-chunk loop (`run`): one compiled call per chunk, then host work, for every driver.

`replay`, `sweep` (through `engine.runner`) and the pipeline's `train` pass what differs
(see `run`); the loop handles prefetching, the progress bar, the wall clock of the compiled
calls and Ctrl-C (status 'stopped', keeping what the completed chunks recorded). `History`
is one configuration's record; a `Divergence` is its first non-finite loss.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from staleness.infra import checks, interrupts
from staleness.engine.result import DivergenceError, Result

__all__ = ["Divergence", "History", "run", "first_nonfinite", "update_losses", "chunk_length"]


class Divergence(NamedTuple):
    """The first non-finite loss of a run."""

    update: int           # the update (pipeline: batch) whose gradient had it
    worker: int           # its worker (pipeline: the stage)
    staleness: int        # its staleness in versions (pipeline: the stage's lag)
    where: str = ""       # more context, e.g. 'iteration 7' or 'tick 31'
    kind: str = "worker"  # what `worker` counts: 'worker', 'stage' or 'actor' (asynchronous RL)

    def message(self, lr=None) -> str:
        extra = f", {self.where}" if self.where else ""
        rate = f"now {lr:g}" if isinstance(lr, (int, float)) else f"now {lr}"
        if self.kind == "actor":   # the learner's objective on a rollout: its rewards come first
            return (f"non-finite objective at learner update {self.update} (a rollout of actor {self.worker}{extra}, "
                    f"staleness {self.staleness}): check the task's reward function first (a NaN or inf reward "
                    f"makes every advantage of its group non-finite), then the policy's logits; if those are "
                    f"finite, try a smaller lr ({rate})")
        head = f"non-finite loss at update {self.update} (gradient of {self.kind} {self.worker}{extra}, " \
               f"staleness {self.staleness})"
        if self.update == 0:   # every gradient of update 0 is at the initial parameters: no lr has acted yet
            return (f"{head}, at the initial parameters: the loss function or the data is not finite there "
                    f"(check the inputs for NaN/inf and the loss for e.g. log(0)); the learning rate ({rate}) "
                    "has not acted yet, except an inner optimizer's within local steps")
        return f"{head}; try a smaller lr ({rate}) or a staleness-aware lr_rule"


def chunk_length(num_updates: int, eval_every: int | None, num_evals: int) -> int:
    """Updates per chunk: `eval_every`, else ceil(num_updates / num_evals)."""
    if eval_every is not None:
        return checks.at_least("eval_every", eval_every, 1, what=" (updates)")
    return max(1, -(-num_updates // checks.at_least("num_evals", num_evals, 1)))


def update_losses(losses: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[K] mean loss of each update's real slots (NaN for padding updates)."""
    count = mask.sum(axis=1)
    total = np.where(mask, losses, 0.0).sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def first_nonfinite(losses: np.ndarray, mask: np.ndarray):
    """(row, slot) of the first non-finite loss among the real slots, or None."""
    bad = mask & ~np.isfinite(losses)
    if not bad.any():
        return None
    flat = np.flatnonzero(bad.reshape(-1))[0]
    return np.unravel_index(flat, bad.shape)


class History:
    """One configuration's record: history rows (`row0`: of the initial evaluation), the
    train loss of each of `num_steps` steps (updates; pipeline: ticks), status."""

    def __init__(self, num_steps: int, row0: dict):
        self.rows: list[dict] = [row0]
        self.train_loss = np.full(num_steps, np.nan)
        self.status = "complete"
        self.divergence: Divergence | None = None
        self.message: str | None = None
        self.params = None    # host params of the last recorded (finite) chunk
        self.steps_done = 0   # train-loss steps covered by the rows
        self._pending = 0
        self.diag: dict[str, np.ndarray] = {}   # per-step diagnostics (an RL learner's), NaN where not run

    @property
    def done(self) -> int:
        """The last row's update."""
        return int(self.rows[-1]["update"])

    @property
    def active(self) -> bool:
        return self.status == "complete"

    def losses(self, lo: int, values) -> None:
        """Record the train loss of steps lo .. lo + len(values)."""
        values = np.asarray(values, np.float64)
        self.train_loss[lo:lo + len(values)] = values
        self._pending = lo + len(values)

    def diagnostics(self, lo: int, values: dict) -> None:
        """Record the per-step diagnostics {name: [n]} of steps lo .. lo + n."""
        for name, v in values.items():
            if name not in self.diag:
                self.diag[name] = np.full(len(self.train_loss), np.nan)
            v = np.asarray(v, np.float64)
            self.diag[name][lo:lo + len(v)] = v

    def add(self, row: dict, params=None) -> None:
        """Append an evaluation row (and the host params it was evaluated on)."""
        self.rows.append(row)
        self.steps_done = max(self.steps_done, self._pending)
        if params is not None:
            self.params = params

    def diverge(self, d: Divergence, lr=None, cut: int | None = None) -> str:
        """Mark the run diverged at `d`; `cut`: keep the train loss of steps < cut only."""
        self.status = "diverged"
        self.divergence = d
        self.message = d.message(lr)
        if cut is not None:
            self.train_loss = self.train_loss[:cut]
            self.diag = {k: v[:cut] for k, v in self.diag.items()}
        return self.message

    def stop(self) -> None:
        """Ctrl-C or stop_after: status 'stopped', train loss kept up to the last row."""
        self.status = "stopped"
        self.train_loss[self.steps_done:] = np.nan
        for v in self.diag.values():
            v[self.steps_done:] = np.nan

    def state(self) -> dict:
        """JSON-able rows and train loss (for `staleness.infra.checkpoint`)."""
        return {"rows": self.rows, "train_loss": [float(x) for x in self.train_loss],
                "steps_done": self.steps_done, "diag": {k: [float(x) for x in v] for k, v in self.diag.items()}}

    def restore(self, state: dict) -> None:
        self.rows = [dict(r) for r in state["rows"]]
        self.train_loss = np.asarray(state["train_loss"], np.float64)
        self.steps_done = self._pending = int(state["steps_done"])
        self.diag = {k: np.asarray(v, np.float64) for k, v in (state.get("diag") or {}).items()}

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)

    def result(self, schedule, config: dict, params=None, train_loss=None) -> Result:
        """The Result: history rows, `schedule`, final params (default: the last recorded),
        `config` (with the divergence message when diverged), train loss, status."""
        cfg = dict(config)
        if self.message is not None:
            cfg["divergence"] = self.message
        return Result(self.frame(), schedule, self.params if params is None else params, cfg,
                      self.train_loss if train_loss is None else train_loss, self.status,
                      self.diagnostics_frame(schedule))

    def diagnostics_frame(self, schedule):
        """The per-step diagnostics as a DataFrame (one row per update: `update`, then each
        name, with the rollouts each update's interval dropped, `dropped`), or None."""
        if not self.diag:
            return None
        import pandas as pd

        n = len(self.train_loss)
        frame = pd.DataFrame({"update": np.arange(1, n + 1), **{k: v[:n] for k, v in self.diag.items()}})
        times = np.asarray(schedule.update_time, np.float64)[:n]
        cols = schedule.columns
        if len(times) == n and n:   # rollouts dropped after the update before and by this one
            t = cols["push_time"][cols["dropped"]]
            frame["dropped"] = np.bincount(np.searchsorted(times, t, side="left"), minlength=n + 1)[:n]
        return frame


def run(step: Callable, carry: Any, *, num_chunks: int, inputs: Callable[[int], Any],
        record: Callable[[int, Any, Any, float], bool], start: int = 0, save: Callable | None = None,
        histories: list[History] = (), bar=None, bar_step: Callable[[int], int] | None = None,
        capture: Callable | None = None):
    """Run chunks `start` .. `num_chunks - 1` of a compiled replay.

    Args:
      step: (carry, xs) -> (carry, out): the compiled chunk (donates its carry).
      inputs: k -> xs of chunk k; called for chunk k + 1 while chunk k runs.
      record: (k, carry, out as NumPy, wall seconds of the call) -> continue?; the
        caller's host work (it may raise, e.g. `DivergenceError`).
      save: (k, carry) after `record`, e.g. a checkpoint.
      histories: marked 'stopped' on Ctrl-C, and by a False from `record`.
      bar: a tqdm bar (closed at the end); bar_step(k): its increment for chunk k.
      capture: carry -> what `record` gets instead of the carry, taken as soon as chunk k
        ended (e.g. its evaluation dispatched, its parameters fetched); chunk k + 1 is then
        dispatched before chunk k is recorded, so the device does not wait for the host's
        record. Not with `save`, which needs the carry itself.
    Returns (carry, status, wall seconds): status 'complete' or 'stopped'.
    """
    import jax

    if capture is not None and save is not None:
        raise ValueError("chunks.run: capture= dispatches the next chunk before `save` could see the carry")
    ahead = capture is not None
    status = "complete"
    wall = 0.0
    nxt = inputs(start) if start < num_chunks else None
    out = None
    try:
        for k in range(start, num_chunks):
            interrupts.check()   # a Ctrl-C that a callback swallowed stops here
            if out is None:      # (else dispatched ahead, at t0)
                t0 = time.perf_counter()
                carry, out = step(carry, nxt)
            if k + 1 < num_chunks:   # host work for the next chunk while this one runs
                nxt = inputs(k + 1)
            host = jax.tree.map(np.asarray, jax.device_get(out))   # waits for the chunk
            t1 = time.perf_counter()
            dt, out = t1 - t0, None
            wall += dt
            seen = capture(carry) if ahead else carry
            if ahead and k + 1 < num_chunks:
                t0 = t1
                carry, out = step(carry, nxt)
            go = record(k, seen, host, dt)
            if save is not None:
                save(k, carry)
            if bar is not None:
                bar.update(bar_step(k) if bar_step is not None else 1)
            if go is False and k + 1 < num_chunks:
                status = "stopped"
                break
    except KeyboardInterrupt:
        # Ctrl-C: keep everything recorded up to the last completed chunk.
        status = "stopped"
    finally:
        if bar is not None:
            bar.close()
    if status == "stopped":
        for h in histories:
            if h.active:
                h.stop()
    return carry, status, wall


def raise_divergence(history: History, d: Divergence, schedule, config: dict, lr=None, cut=None):
    """Mark `history` diverged and raise `DivergenceError` carrying its Result."""
    msg = history.diverge(d, lr, cut)
    raise DivergenceError(msg, history.result(schedule, config))
