"""Drivers: train a pipeline task along a schedule, simulated or on K devices, into a `Result`.

    result = simulate(ptask, dsp((1, 1, 0)), num_batches=500, cluster=cluster.heterogeneous([1, 2, 1]))
    result = run_devices(ptask, gpipe(4), num_batches=500)

Both build the same plan, numerics and simulated timeline; they differ only in the engine built here
(all K stages on one device, or stage k on device k), which `staleness.pipeline.training.drive` runs.
"""

from __future__ import annotations

import time

import jax

from staleness.infra import tracking as _tracking
from staleness.engine import core
from staleness.pipeline import sim
from staleness.pipeline import stage as S
from staleness.pipeline.schedules import PipelineSchedule
from staleness.infra.settings import merge
from staleness.pipeline.training import Engine, Host, RunArgs, Setup, drive, set_up
from staleness.engine.result import Result

__all__ = ["run_devices", "simulate", "train"]


def train(ptask, schedule: PipelineSchedule | str, num_batches: int, *, devices=False,
          settings: RunArgs | None = None, progress: bool = False, config: dict | None = None, checkpoint=None,
          resume: bool = False, stop_after: int | None = None, callbacks=None, **overrides) -> Result:
    """Train `ptask` for `num_batches` batches along `schedule`.

    Args:
      ptask: a `staleness.pipeline.tasks.PipelineTask` (its model has K stages).
      schedule: a `PipelineSchedule` or spec ('gpipe:4', 'dsp:1,1,0', 'ddg', 'backprop').
      num_batches: batches to train; every stage applies each batch's gradient exactly once.
      devices: False: all stages on one device (the simulated path); True: stage k
        on jax.devices()[k]; or a list of K devices.
      settings: a `staleness.pipeline.settings.RunArgs` (default: its defaults), taken whole;
        its fields below (cluster ... recompute_cost) may also be given by keyword, overriding it.
      cluster: speed model with one worker per stage (default: K workers at 1 s per
        batch); gives the simulated time axis and throughput.
      seed: initial params and minibatches (`staleness.engine.keys(seed)`) and the cluster's draws.
      lr: base learning rate; optimizer: per-stage optimizer spec (default momentum SGD, 0.9).
      eval_every: batches between evaluations (default num_batches / num_evals).
      backward_ratio, recompute_cost: cost model of `simulate_timing`.
      checkpoint: directory to checkpoint into after every evaluation chunk
        (`staleness.infra.checkpoint`); with resume=True, continue from the one found there
        (bitwise the uninterrupted run).
      stop_after: stop (status 'stopped') after the chunk that reaches this many batches.
      callbacks: `staleness.infra.tracking` callbacks (a callable, a spec or a list), called at every
        history row: step = batches applied, time = simulated seconds, wall_time = the row's
        wall_time; run.label is config['label'] if given, else 'SCHEDULE seed=S lr=LR'.

    Returns:
      A `Result`: history rows (update = batches applied at every stage, tick, time,
      sim_time, wall_time, train_loss, loss, accuracy), `schedule` = the run's
      per-stage events on the simulated timeline (`Timeline.to_schedule`),
      per-stage params joined into the full model's params, config, and
      train_loss [N] per batch. `time` is simulated seconds for the one-device
      path and wall-clock seconds (excluding compilation) on devices.
      Raises `DivergenceError` (with `.result`) on a non-finite loss, naming the
      batch, the stage that computed the loss, its lag and the tick, and
      `staleness.infra.tracking.CallbackError` (with `.results`) when a callback raises.
    """
    callbacks = _tracking.as_callbacks(callbacks)
    setup = set_up(ptask, merge(RunArgs, settings, overrides, "train",
                                given={"schedule": schedule, "num_batches": num_batches}))
    init_key, data_key = core.keys(setup.seed)
    params = ptask.init_stage_params(init_key)
    ctx = S.Context(ptask, data_key)
    on_devices = devices is not False and devices is not None
    engine = _engine(ptask, setup, params, ctx, devices)
    return drive(ptask, setup, params, engine,
                 Host(engine_name="devices" if on_devices else "sim", wall_time=on_devices, config=config,
                      progress=progress, checkpoint=checkpoint, resume=resume, stop_after=stop_after,
                      callbacks=callbacks))


def _engine(ptask, setup: Setup, params, ctx: S.Context, devices) -> Engine:
    """The one- or K-device `Engine` of `setup`.

    Its step(carry, xs) -> (carry, loss per tick) is compiled ahead of time for chunks
    of `setup.chunk` ticks; get_params(carry) returns host copies of the per-stage params
    (the carry is donated to the next step)."""
    plan, opt, chunk = setup.plan, setup.opt, setup.chunk
    t0 = time.perf_counter()
    if devices is not False and devices is not None:
        from staleness.pipeline.devices import DeviceEngine

        engine = DeviceEngine(ptask, plan, opt, params, ctx, None if devices is True else devices)
        carry = engine.init_carry()
        t0 = time.perf_counter()
        step = engine.compile_chunk(carry, plan.xs(0, chunk))
        return Engine(step, engine.stage_params, carry, [str(d) for d in engine.devices], time.perf_counter() - t0)
    cfgs, carry = sim.init(ptask, plan, opt, params, ctx)
    step = sim.compile_chunk(cfgs, plan, opt, ctx, carry, plan.xs(0, chunk))

    def get_params(carry):
        return jax.device_get(sim.stage_params(carry))
    return Engine(step, get_params, carry, [str(jax.devices()[0])], time.perf_counter() - t0)


def simulate(ptask, schedule, num_batches: int, **kwargs) -> Result:
    """`train` with all stages on one device; time is simulated from the cluster model."""
    return train(ptask, schedule, num_batches, devices=False, **kwargs)


def run_devices(ptask, schedule, num_batches: int, *, devices=True, **kwargs) -> Result:
    """`train` with stage k on device k (`shard_map` + `ppermute`); time is wall-clock."""
    return train(ptask, schedule, num_batches, devices=devices, **kwargs)
