"""Set up a pipeline run and drive it: the part every pipeline driver shares.

    args   = RunArgs("dsp:1,1,0", 500, lr=0.005, seed=0)      # what to run, as given to `train`
    setup  = set_up(ptask, args)                               # checked: schedule, plan, timeline, optimizer, chunk
    engine = Engine(step, get_params, carry, device_names, compile_s)   # one compiled chunk of ticks
    result = drive(ptask, setup, params, engine, Host(engine_name="sim", wall_time=False))

`staleness.pipeline.run` (one device, K devices) and
`staleness.pipeline.multiprocess` (one stage per process) differ only in the
engine they build; `set_up` checks the arguments and resolves everything that
does not depend on it, `drive` runs it chunk by chunk (`staleness.engine.chunks.run`):
evaluate, record the history, call the tracking callbacks (`staleness.infra.tracking`;
one per history row as it is recorded, only the new ones on resume), check for
divergence, checkpoint, assemble the `Result`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from staleness.infra import checkpoint as _checkpoint
from staleness.infra import checks
from staleness import cluster as _cluster
from staleness.infra import tracking as _tracking
from staleness.engine import chunks as _chunks
from staleness.tasks import optim as _optim
from staleness.pipeline.model import join_params
from staleness.pipeline.plan import IDLE, TickPlan, make_plan
from staleness.pipeline.schedules import PipelineSchedule, parse
from staleness.pipeline.settings import DEFAULT_OPTIMIZER, RunArgs, check
from staleness.pipeline.timing import simulate_timing
from staleness.engine.result import DivergenceError, Result

__all__ = ["DEFAULT_OPTIMIZER", "Engine", "Host", "RunArgs", "Setup", "drive", "eval_chunk", "resolve_schedule",
           "set_up"]


# the config entries a checkpoint must match to be resumed
_IDENTITY = ("task", "schedule", "stages", "batches", "microbatches", "batch_size", "lr", "optimizer", "seed",
             "cluster", "engine", "eval_every")


def resolve_schedule(schedule, num_stages: int) -> PipelineSchedule:
    """`schedule` (a `PipelineSchedule` or a spec like 'dsp:1,1,0') resolved for `num_stages` stages."""
    sched = parse(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(sched, PipelineSchedule):
        raise ValueError(f"schedule = {schedule!r} must be a PipelineSchedule or a spec like 'dsp:1,1,0'")
    return sched.resolve(num_stages)


def eval_chunk(plan: TickPlan, eval_every: int | None, num_evals) -> tuple[int, int]:
    """(batches between evaluations, ticks per compiled chunk) of `plan`; eval_every None:
    ceil(batches / num_evals)."""
    if eval_every is None:
        eval_every = max(1, -(-plan.num_batches // checks.positive_int("num_evals", num_evals)))
    eval_every = checks.positive_int("eval_every", eval_every)
    ticks_per_batch = (plan.microbatches + plan.lags[0]) if plan.schedule.flush else 1
    return eval_every, min(eval_every * ticks_per_batch, plan.num_ticks)


class Setup(NamedTuple):
    """What a pipeline run is, before any engine: the resolved schedule, its tick tables,
    the simulated timeline, the optimizer and the evaluation chunk."""

    num_batches: int
    sched: PipelineSchedule   # resolved for the task's K stages
    plan: TickPlan
    cluster: Any              # the speed model (one worker per stage)
    timeline: Any             # `simulate_timing` of the plan on the cluster
    opt: Any                  # the per-stage `Optimizer`
    eval_every: int           # batches between evaluations
    chunk: int                # ticks per compiled chunk
    backward_ratio: float     # the cost model of the timeline
    recompute_cost: float
    seed: int                 # the run's seed (params, minibatches, the cluster's draws)


def set_up(ptask, args: RunArgs) -> Setup:
    """Check `args` and build the `Setup` of running them on `ptask`; every driver
    (one device, K devices, K processes) starts here."""
    args = check(args)
    num_batches, lr = args.num_batches, args.lr
    k = ptask.num_stages
    sched = resolve_schedule(args.schedule, k)
    plan = make_plan(sched, k, num_batches)
    cluster = args.cluster if args.cluster is not None else _cluster.constant(k)
    cluster = _cluster.parse(cluster) if isinstance(cluster, str) else cluster
    timeline = simulate_timing(plan, cluster, args.seed, backward_ratio=args.backward_ratio,
                               recompute_cost=args.recompute_cost)
    opt = _optim.resolve(args.optimizer, lr, num_batches,
                         jax.eval_shape(ptask.init_stage_params, jax.random.key(0)) if lr is not None else None)
    _optim.refuse_share(opt, "the pipeline")
    eval_every, chunk = eval_chunk(plan, args.eval_every, args.num_evals)
    return Setup(num_batches, sched, plan, cluster, timeline, opt, eval_every, chunk, args.backward_ratio,
                 args.recompute_cost, args.seed)


class Engine(NamedTuple):
    """A compiled engine as `drive` runs it."""

    step: Callable            # step(carry, xs) -> (carry, loss per tick of the last stage [chunk])
    get_params: Callable      # get_params(carry) -> host per-stage params; called once after every
    #                           chunk, in every process (it may be a collective)
    carry: Any                # the initial carry (donated to the first step)
    device_names: list        # config['devices']
    compile_s: float          # seconds compiling `step`


@dataclasses.dataclass(frozen=True)
class Host:
    """What `drive` does on the host around the compiled chunks."""

    engine_name: str                  # config['engine']
    wall_time: bool                   # history 'time' is wall-clock seconds (else simulated seconds)
    config: dict | None = None        # extra config entries
    progress: bool = False            # a progress bar
    checkpoint: Any = None            # a directory to checkpoint into after every chunk (None: none)
    resume: bool = False              # continue from the checkpoint found there
    stop_after: int | None = None     # stop after the chunk that reaches this many batches
    lead: bool = True                 # this process evaluates, records and returns the `Result`
    #                                   (the others return None and raise `DivergenceError` without one)
    log: Callable | None = None       # a callable taking one line after every chunk (None: quiet)
    callbacks: tuple = ()             # `staleness.infra.tracking` callbacks, called at every history row
    #                                   (where `lead`)


def drive(ptask, setup: Setup, params, engine: Engine, host: Host) -> Result | None:
    """Run `engine` chunk by chunk (`staleness.engine.chunks.run`): evaluate, record, check, checkpoint.

    params: the initial per-stage params (evaluated for the first row). Returns the
    `Result` as `staleness.pipeline.train` (None where not `host.lead`); raises
    `DivergenceError` on a non-finite loss.
    """
    from tqdm.auto import tqdm

    plan, chunk = setup.plan, setup.chunk
    run = _Run(ptask, setup, params, engine, host)
    try:
        carry, start = run.resume(engine.carry)
        if start == 0:   # a resumed run reported its initial row before
            run.track(run.hist.rows[0])
        bar = tqdm(total=plan.num_ticks, initial=min(start * chunk, plan.num_ticks), unit="tick",
                   disable=not host.progress, desc=setup.sched.describe(), leave=False)
        _, status, _ = _chunks.run(engine.step, carry, num_chunks=-(-plan.num_ticks // chunk),
                                   inputs=lambda c: plan.xs(c * chunk, chunk), record=run.record, start=start,
                                   save=run.save, histories=[run.hist], bar=bar,
                                   bar_step=lambda c: min((c + 1) * chunk, plan.num_ticks) - c * chunk)
    except BaseException as e:
        if isinstance(e, _tracking.CallbackError):   # keep what was recorded, as Ctrl-C does
            run.hist.stop()
            e.results = [run.result("stopped")]
        run.tracker.finish([run.hist.status])   # its own errors would hide this one
        raise
    result = run.result(status)
    err = run.tracker.finish([run.hist.status])
    if err is not None:
        err.results = [result]
        raise err
    return result


def _config(ptask, setup: Setup, engine: Engine, host: Host) -> dict:
    """The `Result` config of a run (before its timings)."""
    sched, plan, opt, k = setup.sched, setup.plan, setup.opt, ptask.num_stages
    cfg = dict(host.config or {})
    cfg.update(task=ptask.name, schedule=sched.describe(), stages=k, batches=setup.num_batches,
               microbatches=plan.microbatches, batch_size=ptask.batch_size, lags=list(plan.lags),
               forward_delays=list(plan.forward_delays), backward_delays=list(plan.backward_delays),
               backward=sched.backward, lr=opt.lr, optimizer=opt.describe(), seed=setup.seed,
               cluster=setup.cluster.describe(), engine=host.engine_name, devices=engine.device_names,
               ticks=plan.num_ticks, eval_every=setup.eval_every, backward_ratio=setup.backward_ratio,
               recompute_cost=setup.recompute_cost, sim_throughput=setup.timeline.throughput,
               policy=sched.describe(), workers=k,
               **{k: v for k, v in ptask.task.config().items() if k not in ("task", "batch_size")})
    return cfg


def _losses_per_batch(plan: TickPlan, tick_loss: np.ndarray) -> np.ndarray:
    """[N] mean loss of each batch's micro-batches (computed at the last stage's forward)."""
    return tick_loss[plan.loss_tick].reshape(plan.num_batches, plan.microbatches).mean(1)


class _Run:
    """The host side of one `drive`: config, history, wall clock; `record` and `save` are
    the chunk loop's callbacks."""

    def __init__(self, ptask, setup: Setup, params, engine: Engine, host: Host):
        self.ptask, self.setup, self.engine, self.host = ptask, setup, engine, host
        self.tick_end_time = setup.timeline.tick_end()
        self.jit_evaluate = jax.jit(lambda task, p: task.evaluate(p))
        self.cfg = _config(ptask, setup, engine, host)
        self.hist = _chunks.History(setup.plan.num_ticks, self.row(0, 0.0, math.nan, self.evaluate(params)))
        self.hist.params = params
        self.wall = 0.0
        self.ckpt = Path(host.checkpoint) if host.checkpoint is not None else None
        self.identity = {k: self.cfg[k] for k in _IDENTITY}
        name = setup.sched.describe()
        info = _tracking.Run(_tracking.label(name, setup.seed, setup.opt.lr, "", host.config), name, int(setup.seed),
                             setup.opt.lr, "", 0, self.cfg)
        self.tracker = _tracking.Tracker(host.callbacks if host.lead else (), [info])

    def track(self, row: dict) -> None:
        """Report history row `row` to the callbacks (simulated time, measured wall time)."""
        self.tracker.row(0, row, row["sim_time"], row["wall_time"])

    def evaluate(self, per_stage) -> dict:
        if not self.host.lead:
            return {}
        return jax.device_get(self.jit_evaluate(self.ptask.task, join_params(per_stage)))

    def row(self, tick_end: int, wall: float, train_loss: float, metrics: dict) -> dict:
        sim_t = float(self.tick_end_time[tick_end - 1]) if tick_end > 0 else 0.0
        r = {"update": self.setup.plan.batches_done(tick_end), "tick": tick_end,
             "time": wall if self.host.wall_time else sim_t, "sim_time": sim_t, "wall_time": wall,
             "train_loss": train_loss}
        r.update({name: float(v) for name, v in metrics.items()})
        return r

    def resume(self, carry) -> tuple[Any, int]:
        """(carry, first chunk to run): from the checkpoint when resuming, else (carry, 0)."""
        if self.ckpt is None or not self.host.resume:
            return carry, 0
        meta, carry = _checkpoint.load(self.ckpt, carry, match=self.identity, name="pipeline")
        self.hist.restore(meta)
        self.hist.params = self.engine.get_params(carry)
        self.wall = float(meta["wall"])
        return carry, int(meta["next_chunk"])

    def record(self, c, carry, losses, dt) -> bool:
        plan, chunk = self.setup.plan, self.setup.chunk
        self.wall += dt
        lo = c * chunk
        end = min(lo + chunk, plan.num_ticks)
        self.hist.losses(lo, losses[: end - lo])
        valid = plan.fwd[lo:end, -1] != IDLE
        chunk_losses = self.hist.train_loss[lo:end][valid]
        cur = self.engine.get_params(carry)
        metrics = self.evaluate(cur)
        if self.host.log is not None:
            self.host.log(f"ticks {end}/{plan.num_ticks}")
        if len(chunk_losses) and not np.all(np.isfinite(chunk_losses)):
            self.diverged(lo, end, valid, chunk_losses, metrics)
        self.hist.add(self.row(end, self.wall, float(np.mean(chunk_losses)) if len(chunk_losses) else math.nan,
                               metrics), cur)
        self.track(self.hist.rows[-1])
        stop_after = self.host.stop_after
        return not (stop_after is not None and plan.batches_done(end) >= stop_after)

    def diverged(self, lo: int, end: int, valid, chunk_losses, metrics):
        """Record the chunk [lo, end) whose losses went non-finite and raise `DivergenceError`."""
        plan, sched = self.setup.plan, self.setup.sched
        stage = plan.num_stages - 1   # the loss is computed at the last stage's forward
        bad = lo + int(np.flatnonzero(valid)[np.flatnonzero(~np.isfinite(chunk_losses))[0]])
        mb = int(plan.fwd[bad, -1])
        self.hist.rows.append(self.row(end, self.wall, math.nan, metrics))
        d = _chunks.Divergence(mb // plan.microbatches, stage, int(plan.lags[stage]),
                               f"tick {bad}, micro-batch {mb % plan.microbatches} of {sched.describe()}, "
                               f"stage lags {list(plan.lags)}", kind="stage")
        self.hist.diverge(d, self.cfg["lr"])
        raise DivergenceError(self.hist.message, self.result("diverged"))

    def save(self, c, carry) -> None:
        if self.ckpt is not None:
            _checkpoint.save(self.ckpt, carry, {"next_chunk": c + 1, "wall": self.wall, **self.hist.state()},
                             match=self.identity, name="pipeline")

    def result(self, status) -> Result | None:
        if not self.host.lead:
            return None
        plan, chunk, wall = self.setup.plan, self.setup.chunk, self.wall
        ticks_run = -(-plan.num_ticks // chunk) * chunk  # the last chunk is padded with idle ticks
        out_cfg = dict(self.cfg, wall_s=wall, compile_s=self.engine.compile_s,
                       ticks_per_s=ticks_run / wall if wall > 0 else math.nan)
        events = self.setup.timeline.to_schedule()
        events.meta.update(engine=self.cfg["engine"], wall_s=wall, ticks_per_s=out_cfg["ticks_per_s"],
                           time_axis="simulated (cluster model); history 'wall_time' is measured")
        self.hist.status = status
        return self.hist.result(events, out_cfg, params=jax.device_get(join_params(self.hist.params)),
                                train_loss=_losses_per_batch(plan, self.hist.train_loss))
