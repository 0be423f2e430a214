"""Many pipeline runs of one schedule in one compiled program: a grid of learning rates × seeds.

    out = sweep(ptask, "dsp:1,1,1,0", 1000, lrs=[0.0015, 0.005], seeds=[0, 1], eval_every=40)
    out.members                 # [(lr, seed), ...] in grid order
    out.accuracy                # [B, E] held-out accuracy after each evaluation chunk (NaN after divergence)
    out.status                  # [B] "complete" / "diverged"
    t = tune_lr(ptask, "dsp:1,1,1,0", 1000, grid=[...], seeds=(1001, 1002))   # on a validation split

`staleness.pipeline.simulate` compiles one program per run (the optimizer is static there). Here every
(lr, seed) is one member of a `lax.map` over the one-device engine: the tick tables are shared, the
learning rate lives in each member's optimizer state, the seed gives its parameters and minibatch key. A
grid costs one compilation, and a member's numbers are bitwise those of `simulate(ptask, schedule,
num_batches, lr=lr, seed=seed)` on CPU (`_batched_chunk`; `tests/test_pipeline_sweep.py`).

The simulated time axis does not depend on the learning rate: take it from
`simulate_timing(plan, cluster, seed)` per seed (the reproduction does).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from staleness.infra import checks
from staleness.infra import tracking as _tracking
from staleness.engine import core
from staleness.tasks import optim as _optim
from staleness.pipeline import sim
from staleness.pipeline import stage as S
from staleness.pipeline.model import join_params
from staleness.pipeline.plan import IDLE, TickPlan, make_plan
from staleness.pipeline.schedules import PipelineSchedule
from staleness.pipeline.training import eval_chunk, resolve_schedule

__all__ = ["SweepResult", "sweep", "holdout", "tune_lr", "TUNE_SCORE"]

TUNE_SCORE = ("mean held-out accuracy over the evaluation points after the first (the area under the learning "
              "curve), median over the tuning seeds; a learning rate with a diverged seed is out "
              "(the rule of staleness.results.compare.tune_lr)")


@dataclasses.dataclass(frozen=True, eq=False)
class SweepResult:
    """Histories of every member of a sweep.

    members: [B] (lr, seed). update: [E] batches applied at every stage at each
    evaluation (0 first). loss/accuracy: [B, E] held-out metrics (NaN from the
    evaluation after a member diverged). train_loss: [B, N] mean loss of each
    batch. status: [B] "complete" or "diverged". plan: the plan all members ran.
    compile_s, wall_s: seconds compiling and running the ticks (all members).
    """

    members: list
    update: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    train_loss: np.ndarray
    status: list
    plan: TickPlan
    compile_s: float
    wall_s: float

    def index(self, lr: float, seed: int) -> int:
        for i, (a, s) in enumerate(self.members):
            if a == lr and s == seed:
                return i
        raise KeyError(f"(lr={lr!r}, seed={seed!r}) is not a member of this sweep; members: {self.members}")

    def final(self, i: int) -> float:
        """Member i's last held-out accuracy (NaN if it diverged)."""
        return float(self.accuracy[i, -1]) if self.status[i] == "complete" else math.nan


def holdout(ptask, fraction: float = 0.1, seed: int = 0):
    """`ptask` with its task replaced by `Task.holdout`: a validation split of the training set
    as its held-out set (the test set unused) to tune hyper-parameters on."""
    from staleness.pipeline.tasks import PipelineTask

    return PipelineTask(ptask.task.holdout(fraction, seed), ptask.model, ptask.output_loss)


def _check_grid(name, values, kind):
    try:
        vals = list(values)
    except TypeError:
        raise ValueError(f"{name} = {values!r} must be a non-empty sequence") from None
    if not vals:
        raise ValueError(f"{name} is empty; give at least one value")
    for v in vals:
        if kind == "lr" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                             or v <= 0):
            raise ValueError(f"{name} = {vals!r}: every learning rate must be a finite number > 0; got {v!r}")
        if kind == "seed" and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
            raise ValueError(f"{name} = {vals!r}: every seed must be an integer >= 0; got {v!r}")
    return [float(v) for v in vals] if kind == "lr" else [int(v) for v in vals]


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), donate_argnums=(6,))
def _batched_chunk(cfgs, fdel, bdel, opt, ptask, data_keys, carry, xs):
    """Every member's chunk, one member after the other (`lax.map`): each runs the ops of
    its own `simulate`, so its numbers are bitwise that run's (a `vmap` over members let
    XLA round the batched sums differently)."""
    def one(args):
        key, c = args
        return sim.scan_chunk(cfgs, fdel, bdel, opt, S.Context(ptask, key), c, xs)
    return jax.lax.map(one, (data_keys, carry))


@jax.jit
def _evaluate(task, per_stage):
    return jax.lax.map(lambda p: task.evaluate(join_params(p)), per_stage)


def sweep(ptask, schedule: PipelineSchedule | str, num_batches: int, *, lrs, seeds,
          optimizer="momentum:0.9", eval_every: int | None = None,
          num_evals: int = 10, callbacks=None) -> SweepResult:
    """Train `ptask` along `schedule` for every (lr, seed) of lrs × seeds in one compiled call.

    Args:
      ptask: a `PipelineTask`.
      schedule: a `PipelineSchedule` or spec ('dsp:1,1,1,0', 'gpipe:4', 'ddg', ...).
      num_batches: batches per run.
      lrs: learning rates (> 0); seeds: run seeds (>= 0; initial params and minibatches).
      optimizer: per-stage optimizer spec (its learning rate comes from `lrs`).
      eval_every: batches between held-out evaluations (default num_batches / num_evals).
      callbacks: `staleness.infra.tracking` callbacks (a callable, a spec or a list), called at
        every evaluation of every member still running, in member order, as it is made
        (`Evaluation.time` is NaN: a sweep has no cluster, see the module docstring); a
        failing one raises `CallbackError` (no partial SweepResult).

    Returns:
      A `SweepResult`, members in the order [(lr, seed) for lr in lrs for seed in seeds].
    """
    num_batches = checks.positive_int("num_batches", num_batches)
    lrs = _check_grid("lrs", lrs, "lr")
    seeds = _check_grid("seeds", seeds, "seed")
    callbacks = _tracking.as_callbacks(callbacks)
    k = ptask.num_stages
    plan = make_plan(resolve_schedule(schedule, k), k, num_batches)
    _, chunk = eval_chunk(plan, eval_every, num_evals)
    members = [(lr, s) for lr in lrs for s in seeds]
    opt = _optim.resolve(optimizer, lrs[0], num_batches)   # one transformation: its lr lives in the state
    _optim.refuse_share(opt, "the pipeline")

    carries, keys, cfgs = [], [], None
    for lr, s in members:
        init_key, data_key = core.keys(s)
        params = ptask.init_stage_params(init_key)
        cfgs, c = sim.init(ptask, plan, dataclasses.replace(opt, lr=lr), params, S.Context(ptask, data_key))
        carries.append(c)
        keys.append(data_key)
    carry = jax.tree.map(lambda *xs: jnp.stack(xs), *carries)
    data_keys = jnp.stack(keys)
    del carries
    t0 = time.perf_counter()
    compiled = _batched_chunk.lower(cfgs, plan.forward_delays, plan.backward_delays, opt, ptask, data_keys,
                                    carry, plan.xs(0, chunk)).compile()
    compile_s = time.perf_counter() - t0

    b = len(members)
    tracker = _tracker(callbacks, members, schedule, plan, opt, num_batches)
    first = jax.device_get(_evaluate(ptask.task, sim.stage_params(carry)))
    losses_e, accs_e, updates = [np.asarray(first["loss"], np.float64)], [np.asarray(first["accuracy"], np.float64)], [0]
    tick_loss = np.full((b, plan.num_ticks), np.nan)
    diverged = np.zeros(b, bool)
    wall = 0.0
    try:
        _track(tracker, diverged, 0, first, np.full(b, np.nan), 0.0)
        for start in range(0, plan.num_ticks, chunk):
            t1 = time.perf_counter()
            carry, losses = compiled(ptask, data_keys, carry, plan.xs(start, chunk))
            losses = np.asarray(jax.device_get(losses))   # [B, chunk]
            wall += time.perf_counter() - t1
            end = min(start + chunk, plan.num_ticks)
            tick_loss[:, start:end] = losses[:, : end - start]
            valid = plan.fwd[start:end, -1] != IDLE
            was = diverged.copy()
            diverged |= ~np.all(np.isfinite(tick_loss[:, start:end][:, valid]), axis=1)
            m = jax.device_get(_evaluate(ptask.task, sim.stage_params(carry)))
            losses_e.append(np.asarray(m["loss"], np.float64))
            accs_e.append(np.asarray(m["accuracy"], np.float64))
            updates.append(plan.batches_done(end))
            last = tick_loss[:, start:end][:, valid]
            _track(tracker, was, updates[-1], m, last.mean(axis=1) if last.shape[1] else np.full(b, np.nan), wall)
    except BaseException:
        tracker.finish(["stopped"] * b)   # its own errors would hide this one
        raise
    err = tracker.finish(["diverged" if d else "complete" for d in diverged])
    if err is not None:
        raise err
    acc, loss = np.stack(accs_e, 1), np.stack(losses_e, 1)   # [B, E]
    # as a diverged `simulate` run, a member keeps the evaluation after the chunk in which
    # its loss first went non-finite, and nothing after it (NaN)
    loss_ticks = np.flatnonzero(plan.fwd[:, -1] != IDLE)
    for i in np.flatnonzero(diverged):
        bad = loss_ticks[~np.isfinite(tick_loss[i, loss_ticks])][0]
        acc[i, bad // chunk + 2:] = np.nan
        loss[i, bad // chunk + 2:] = np.nan
    mb = plan.loss_tick
    train_loss = tick_loss[:, mb].reshape(b, plan.num_batches, plan.microbatches).mean(2)
    status = ["diverged" if d else "complete" for d in diverged]
    return SweepResult(members, np.asarray(updates, np.int64), loss, acc, train_loss, status, plan, compile_s, wall)


def _tracker(callbacks, members, schedule, plan: TickPlan, opt, num_batches: int):
    """The `staleness.infra.tracking.Tracker` of a sweep's members (one `Run` each, in member order)."""
    name = schedule if isinstance(schedule, str) else schedule.describe()
    runs = [_tracking.Run(_tracking.label(name, s, lr), name, int(s), float(lr), "", i,
                          {"schedule": name, "batches": num_batches, "lr": float(lr), "seed": int(s),
                           "optimizer": dataclasses.replace(opt, lr=lr).describe(), "lags": list(plan.lags)})
            for i, (lr, s) in enumerate(members)]
    return _tracking.Tracker(callbacks, runs)


def _track(tracker, stopped, step: int, metrics: dict, train_loss, wall: float) -> None:
    """Report one evaluation of every member not `stopped` (diverged before it)."""
    if not tracker:
        return
    for i in np.flatnonzero(~stopped):
        row = {"update": int(step), "train_loss": float(train_loss[i])}
        row.update({k: float(np.asarray(v)[i]) for k, v in metrics.items()})
        tracker.row(int(i), row, math.nan, wall)


def tune_lr(ptask, schedule, num_batches: int, *, grid, seeds, optimizer="momentum:0.9",
            eval_every: int | None = None, extend: int = 0, fraction: float = 0.1) -> dict:
    """Pick `schedule`'s learning rate from `grid` on a validation split of `ptask`'s training set.

    One `sweep` over grid × seeds on `holdout(ptask, fraction)`; the score of a grid
    value is TUNE_SCORE (as `staleness.results.compare.tune_lr`). While the best value is at
    an edge of the grid, the grid is extended by one step on that side, up to
    `extend` times (each extension is one more sweep).

    Returns {"lr", "grid", "edge" (chosen at an end of the final grid), "scores"
    [per grid value, NaN: out], "runs" (training runs spent), "seeds"}.
    Raises ValueError when every value of the grid diverged.
    """
    grid = _check_grid("grid", grid, "lr")
    seeds = _check_grid("seeds", seeds, "seed")
    val = holdout(ptask, fraction)
    runs, scored = 0, {}
    while True:
        todo = [g for g in grid if g not in scored]
        if todo:
            out = sweep(val, schedule, num_batches, lrs=todo, seeds=seeds, optimizer=optimizer,
                        eval_every=eval_every)
            runs += len(out.members)
            for g in todo:
                idx = [out.index(g, s) for s in seeds]
                scored[g] = (math.nan if any(out.status[i] != "complete" for i in idx)
                             else float(np.median([np.mean(out.accuracy[i, 1:]) for i in idx])))
        scores = [scored[g] for g in grid]
        finite = [i for i, sc in enumerate(scores) if math.isfinite(sc)]
        if not finite:
            raise ValueError(f"tune_lr: every learning rate of the grid {grid} diverged on the validation split "
                             f"for {schedule}; give a smaller grid")
        best = max(finite, key=lambda i: (scores[i], -grid[i]))   # ties: the smaller rate
        edge = best in (0, len(grid) - 1) and len(grid) > 1
        if not edge or extend <= 0:
            break
        extend -= 1
        step = grid[1] / grid[0]
        grid = [grid[0] / step] + grid if best == 0 else grid + [grid[-1] * step]
    return {"lr": grid[best], "grid": grid, "edge": edge, "scores": scores, "runs": runs, "seeds": seeds}
