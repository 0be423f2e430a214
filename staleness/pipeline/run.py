"""Drivers: train a pipeline task along a schedule, simulated or on K devices, into a `Result`.

    result = simulate(ptask, dsp((1, 1, 0)), num_batches=500, cluster=cluster.heterogeneous([1, 2, 1]))
    result = run_devices(ptask, gpipe(4), num_batches=500)

Both build the same `Plan`, the same per-stage numerics and the same
simulated timeline (`staleness.pipeline.timing`); they differ in where the
stages run: `simulate` runs all K stages in one program on one device,
`run_devices` puts stage k on device k. The host calls one compiled function
per evaluation chunk of ticks and evaluates the whole model in between.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from staleness import checkpoint as _checkpoint
from staleness import cluster as _cluster
from staleness.engine import chunks as _chunks
from staleness.engine import core
from staleness.engine import optim as _optim
from staleness.engine.run import _check_lr
from staleness.pipeline import sim
from staleness.pipeline import stage as S
from staleness.pipeline.model import join_params
from staleness.pipeline.plan import IDLE, Plan, make_plan
from staleness.pipeline.schedules import PipelineSchedule, parse
from staleness.pipeline.timing import simulate_timing
from staleness.results import DivergenceError, Result

__all__ = ["run_devices", "simulate", "train"]

DEFAULT_OPTIMIZER = "momentum:0.9"


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1")
    return int(value)


def _losses_per_batch(plan: Plan, tick_loss: np.ndarray) -> np.ndarray:
    """[N] mean loss of each batch's micro-batches (computed at the last stage's forward)."""
    t = plan.loss_tick
    per_mb = tick_loss[t]
    return per_mb.reshape(plan.num_batches, plan.microbatches).mean(1)


def train(ptask, schedule: PipelineSchedule | str, num_batches: int, *, devices=False, cluster=None,
          seed: int = 0, lr: float | None = None, optimizer=DEFAULT_OPTIMIZER, eval_every: int | None = None,
          num_evals: int = 10, backward_ratio: float = 2.0, recompute_cost: float = 1.0,
          progress: bool = False, config: dict | None = None, checkpoint=None, resume: bool = False,
          stop_after: int | None = None) -> Result:
    """Train `ptask` for `num_batches` batches along `schedule`.

    Args:
      ptask: a `staleness.pipeline.tasks.PipelineTask` (its model has K stages).
      schedule: a `PipelineSchedule` or spec ('gpipe:4', 'dsp:1,1,0', 'ddg', 'backprop').
      num_batches: batches to train; every stage applies each batch's gradient exactly once.
      devices: False: all stages on one device (the simulated path); True: stage k
        on jax.devices()[k]; or a list of K devices.
      cluster: speed model with one worker per stage (default: K workers at 1 s per
        batch); gives the simulated time axis and throughput.
      seed: initial params and minibatches (`staleness.engine.keys(seed)`) and the cluster's draws.
      lr: base learning rate; optimizer: per-stage optimizer spec (default momentum SGD, 0.9).
      eval_every: batches between evaluations (default num_batches / num_evals).
      backward_ratio, recompute_cost: cost model of `simulate_timing`.
      checkpoint: directory to checkpoint into after every evaluation chunk
        (`staleness.checkpoint`); with resume=True, continue from the one found there
        (bitwise the uninterrupted run).
      stop_after: stop (status 'stopped') after the chunk that reaches this many batches.

    Returns:
      A `Result`: history rows (update = batches applied at every stage, tick, time,
      sim_time, wall_time, train_loss, loss, accuracy), `schedule` = the run's
      per-stage events on the simulated timeline (`Timeline.to_schedule`),
      per-stage params joined into the full model's params, config, and
      train_loss [N] per batch. `time` is simulated seconds for the one-device
      path and wall-clock seconds (excluding compilation) on devices.
      Raises `DivergenceError` (with `.result`) on a non-finite loss, naming the
      batch, the stage that computed the loss, its lag and the tick.
    """
    setup = _setup(ptask, schedule, num_batches, cluster=cluster, seed=seed, lr=lr, optimizer=optimizer,
                   eval_every=eval_every, num_evals=num_evals, backward_ratio=backward_ratio,
                   recompute_cost=recompute_cost)
    init_key, data_key = core.keys(seed)
    params = ptask.init_stage_params(init_key)
    ctx = S.Context(ptask, data_key)
    on_devices = devices is not False and devices is not None
    engine = _engine(ptask, setup.plan, setup.opt, params, ctx, devices, setup.chunk)
    return _drive(ptask, setup, params, engine, engine_name="devices" if on_devices else "sim",
                  wall_time=on_devices, seed=seed, config=config, progress=progress, checkpoint=checkpoint,
                  resume=resume, stop_after=stop_after)


class Setup(NamedTuple):
    """What a pipeline run is, before any engine: the resolved schedule, its tick tables,
    the simulated timeline, the optimizer and the evaluation chunk."""

    num_batches: int
    sched: PipelineSchedule   # resolved for the task's K stages
    plan: Plan
    cluster: Any              # the speed model (one worker per stage)
    timeline: Any             # `simulate_timing` of the plan on the cluster
    opt: Any                  # the per-stage `Optimizer`
    eval_every: int           # batches between evaluations
    chunk: int                # ticks per compiled chunk
    backward_ratio: float     # the cost model of the timeline
    recompute_cost: float


def _setup(ptask, schedule, num_batches, *, cluster, seed, lr, optimizer, eval_every, num_evals, backward_ratio,
           recompute_cost) -> Setup:
    """Check `train`'s arguments and build its `Setup` (arguments as `train`); every driver
    (one device, K devices, K processes) starts here."""
    num_batches = _check_positive_int("num_batches", num_batches)
    lr = _check_lr(lr, allow_none=True)
    sched = parse(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(sched, PipelineSchedule):
        raise ValueError(f"schedule = {schedule!r} must be a PipelineSchedule or a spec like 'dsp:1,1,0'")
    k = ptask.num_stages
    sched = sched.resolve(k)
    plan = make_plan(sched, k, num_batches)
    if cluster is None:
        cluster = _cluster.constant(k)
    elif isinstance(cluster, str):
        cluster = _cluster.parse(cluster)
    timeline = simulate_timing(plan, cluster, seed, backward_ratio=backward_ratio, recompute_cost=recompute_cost)
    opt = _optim.resolve(optimizer, lr, num_batches, jax.eval_shape(ptask.init_stage_params, jax.random.key(0))
                         if lr is not None else None)
    if eval_every is None:
        eval_every = max(1, -(-num_batches // _check_positive_int("num_evals", num_evals)))
    eval_every = _check_positive_int("eval_every", eval_every)
    ticks_per_batch = (plan.microbatches + plan.lags[0]) if sched.flush else 1
    chunk = min(eval_every * ticks_per_batch, plan.num_ticks)
    return Setup(num_batches, sched, plan, cluster, timeline, opt, eval_every, chunk, backward_ratio, recompute_cost)


def _drive(ptask, setup: Setup, params, engine, *, engine_name: str, wall_time: bool, seed: int,
           config: dict | None = None, progress: bool = False, checkpoint=None, resume: bool = False,
           stop_after: int | None = None, lead: bool = True, log=None) -> Result | None:
    """Run `engine` chunk by chunk (`staleness.engine.chunks.run`): evaluate, record, check, checkpoint.

    Args:
      params: the initial per-stage params (evaluated for the first row).
      engine: (step, get_params, carry, device names, compile seconds), as `_engine`;
        get_params(carry) is called once after every chunk, in every process (it may be
        a collective).
      engine_name: config['engine']; wall_time: history 'time' is wall-clock seconds
        (else simulated seconds).
      lead: this process evaluates, records and returns the `Result` (the others
        return None and raise `DivergenceError` without one).
      log: a callable taking one line after every chunk (None: quiet).
    Other arguments as `train`.
    """
    from tqdm.auto import tqdm

    sched, plan, timeline, opt, chunk = setup.sched, setup.plan, setup.timeline, setup.opt, setup.chunk
    k = ptask.num_stages
    step, get_params, carry, device_names, compile_s = engine
    tick_end_time = timeline.tick_end()
    jit_evaluate = jax.jit(lambda task, p: task.evaluate(p))

    def evaluate(per_stage) -> dict:
        return jax.device_get(jit_evaluate(ptask.task, join_params(per_stage))) if lead else {}

    cfg = dict(config or {})
    cfg.update(task=ptask.name, schedule=sched.describe(), stages=k, batches=setup.num_batches,
               microbatches=plan.microbatches, batch_size=ptask.batch_size, lags=list(plan.lags),
               forward_delays=list(plan.forward_delays), backward_delays=list(plan.backward_delays),
               backward=sched.backward, lr=opt.lr, optimizer=opt.describe(), seed=seed,
               cluster=setup.cluster.describe(), engine=engine_name, devices=device_names, ticks=plan.num_ticks,
               eval_every=setup.eval_every, backward_ratio=setup.backward_ratio, recompute_cost=setup.recompute_cost,
               sim_throughput=timeline.throughput, policy=sched.describe(), workers=k,
               **{k: v for k, v in ptask.task.config().items() if k not in ("task", "batch_size")})

    def row(tick_end: int, wall: float, train_loss: float, metrics: dict) -> dict:
        sim_t = float(tick_end_time[tick_end - 1]) if tick_end > 0 else 0.0
        r = {"update": plan.batches_done(tick_end), "tick": tick_end,
             "time": wall if wall_time else sim_t, "sim_time": sim_t, "wall_time": wall,
             "train_loss": train_loss}
        r.update({name: float(v) for name, v in metrics.items()})
        return r

    hist = _chunks.History(plan.num_ticks, row(0, 0.0, math.nan, evaluate(params)))
    hist.params = params
    clock = {"wall": 0.0}
    start = 0
    ckpt = Path(checkpoint) if checkpoint is not None else None
    identity = {k: cfg[k] for k in ("task", "schedule", "stages", "batches", "microbatches", "batch_size", "lr",
                                    "optimizer", "seed", "cluster", "engine", "eval_every")}
    if ckpt is not None and resume:
        meta, carry = _checkpoint.load(ckpt, carry, match=identity, name="pipeline")
        hist.restore(meta)
        hist.params = get_params(carry)
        clock["wall"] = float(meta["wall"])
        start = int(meta["next_chunk"])
    num_chunks = -(-plan.num_ticks // chunk)
    stage = k - 1   # the loss is computed at the last stage's forward

    def record(c, carry, losses, dt):
        clock["wall"] += dt
        lo = c * chunk
        end = min(lo + chunk, plan.num_ticks)
        hist.losses(lo, losses[: end - lo])
        valid = plan.fwd[lo:end, -1] != IDLE
        chunk_losses = hist.train_loss[lo:end][valid]
        cur = get_params(carry)
        metrics = evaluate(cur)
        if log is not None:
            log(f"ticks {end}/{plan.num_ticks}")
        if len(chunk_losses) and not np.all(np.isfinite(chunk_losses)):
            bad = lo + int(np.flatnonzero(valid)[np.flatnonzero(~np.isfinite(chunk_losses))[0]])
            mb = int(plan.fwd[bad, -1])
            hist.rows.append(row(end, clock["wall"], math.nan, metrics))
            d = _chunks.Divergence(mb // plan.microbatches, stage, int(plan.lags[stage]),
                                   f"tick {bad}, micro-batch {mb % plan.microbatches} of {sched.describe()}, "
                                   f"stage lags {list(plan.lags)}", kind="stage")
            hist.diverge(d, cfg["lr"])
            raise DivergenceError(hist.message, _result(hist, "diverged"))
        hist.add(row(end, clock["wall"], float(np.mean(chunk_losses)) if len(chunk_losses) else math.nan, metrics),
                 cur)
        return not (stop_after is not None and plan.batches_done(end) >= stop_after)

    def save(c, carry):
        if ckpt is not None:
            _checkpoint.save(ckpt, carry, {"next_chunk": c + 1, "wall": clock["wall"], **hist.state()},
                             match=identity, name="pipeline")

    def _result(hist, status):
        if not lead:
            return None
        ticks_run = -(-plan.num_ticks // chunk) * chunk  # the last chunk is padded with idle ticks
        wall = clock["wall"]
        out_cfg = dict(cfg, wall_s=wall, compile_s=compile_s, ticks_per_s=ticks_run / wall if wall > 0 else math.nan)
        events = timeline.to_schedule()
        events.meta.update(engine=cfg["engine"], wall_s=wall, ticks_per_s=out_cfg["ticks_per_s"],
                           time_axis="simulated (cluster model); history 'wall_time' is measured")
        hist.status = status
        return hist.result(events, out_cfg, params=jax.device_get(join_params(hist.params)),
                           train_loss=_losses_per_batch(plan, hist.train_loss))

    bar = tqdm(total=plan.num_ticks, initial=min(start * chunk, plan.num_ticks), unit="tick", disable=not progress,
               desc=sched.describe(), leave=False)
    _, status, _ = _chunks.run(step, carry, num_chunks=num_chunks, inputs=lambda c: plan.xs(c * chunk, chunk),
                               record=record, start=start, save=save, histories=[hist], bar=bar,
                               bar_step=lambda c: min((c + 1) * chunk, plan.num_ticks) - c * chunk)
    return _result(hist, status)


def _engine(ptask, plan: Plan, opt, params, ctx: S.Context, devices, chunk: int):
    """(step, get_params, carry, device names, compile seconds) of the one- or K-device engine.

    step(carry, xs) -> (carry, loss per tick) is compiled ahead of time for chunks
    of `chunk` ticks; get_params(carry) returns host copies of the per-stage params
    (the carry is donated to the next step)."""
    t0 = time.perf_counter()
    if devices is not False and devices is not None:
        from staleness.pipeline.devices import DeviceEngine

        engine = DeviceEngine(ptask, plan, opt, params, ctx, None if devices is True else devices)
        carry = engine.init_carry()
        t0 = time.perf_counter()
        step = engine.compile_chunk(carry, plan.xs(0, chunk))
        return step, engine.stage_params, carry, [str(d) for d in engine.devices], time.perf_counter() - t0
    cfgs, carry = sim.init(ptask, plan, opt, params, ctx)
    step = sim.compile_chunk(cfgs, plan, opt, ctx, carry, plan.xs(0, chunk))

    def get_params(carry):
        return jax.device_get(sim.stage_params(carry))
    return step, get_params, carry, [str(jax.devices()[0])], time.perf_counter() - t0


def simulate(ptask, schedule, num_batches: int, **kwargs) -> Result:
    """`train` with all stages on one device; time is simulated from the cluster model."""
    return train(ptask, schedule, num_batches, devices=False, **kwargs)


def run_devices(ptask, schedule, num_batches: int, *, devices=True, **kwargs) -> Result:
    """`train` with stage k on device k (`shard_map` + `ppermute`); time is wall-clock."""
    return train(ptask, schedule, num_batches, devices=devices, **kwargs)
