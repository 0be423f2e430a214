"""Drivers of the compiled replay: `replay`, `simulate` and `sweep`.

The entry points: they check and resolve a run's settings (task, optimizers,
lr rules, local-update configuration), prepare the plans on the host and hand
them to the one chunk runner (`staleness.engine.runner`), which evaluates,
records history, checks divergence, checkpoints and reports progress. `replay`
is its one-configuration case (`runner.single`); `sweep` prepares a `Grid`
(`prepare`) and replays it batched (`staleness.engine.grid.replay_grid`). All
numerics are in `staleness.engine.core`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from staleness.infra import checks
from staleness.infra.settings import merge
from staleness import lr as _lr
from staleness import policies as _policies
from staleness.infra import tracking as _tracking
from staleness.engine import chunks as _chunks
from staleness.engine import core
from staleness.engine import grid as _grid
from staleness.engine import local as _local_mod
from staleness.tasks import optim as _optim
from staleness.engine import runner as _runner
from staleness.engine import settings as _settings
from staleness.engine.plan import LOOKAHEAD, PlanStream, chunk_inputs, make_plan, segment_count
from staleness.engine.result import Result
from staleness.schedule import Schedule
from staleness.sim.scheduler import ScheduleStream, stream_schedule
from staleness.sim.pool import simulate_schedules

__all__ = ["replay", "simulate", "sweep", "prepare", "resolve_task", "chunk_inputs"]

def resolve_task(task, num_workers: int, batch_size: int | None = None, data_dir=None, partition: str | None = None):
    """A Task object, or a task name (built-in, registered or 'package.module:factory')
    made for `num_workers` workers: `staleness.tasks.registry.resolve`."""
    from staleness.tasks import registry

    return registry.resolve(task, num_workers, batch_size, data_dir, partition)


def work_sizes(task, policy, seed: int):
    """The simulator's `sizes` of `policy` on `task` with data seed `seed`: an RL task's
    rollout sizes in tokens for a policy with a learner (asynchronous RL), else None.
    A learner policy needs an RL task and an RL task a learner policy (ValueError)."""
    from staleness.tasks import rl

    learner, rl_task = policy.learner, rl.is_task(task)
    if learner and not rl_task:
        raise ValueError(f"policy {policy.describe()!r} trains on rollouts; task {task.name!r} has none: use an RL "
                         "task (rl-bandit, rl-digits, or staleness.tasks.rl.from_functions)")
    if rl_task and not learner:
        raise ValueError(f"task {task.name!r} is an RL task: its policy must generate rollouts (rl_sync, "
                         f"rl_one_step_off, rl_async[:ETA], rl_inflight[:ETA], rl_partial[:ETA]); got {policy.describe()!r}")
    return task.rollout_sizes(core.keys(int(seed))[1]) if rl_task else None


def resolve_optimizer(optimizer, lr, horizon: int, task) -> _optim.Optimizer:
    """`optim.resolve` of `optimizer` (None: the task's own, else 'sgd'), with the task's
    parameter shapes (to check that lr= can be set). The task's own optax object is
    described as `optim.TASK_OPTAX`, so a replay that rebuilds the task gets it back."""
    own = optimizer is None and task.optimizer is not None
    if optimizer is None:   # the task's own; a rate given to the run replaces an lr= it names
        optimizer = policy_default(task.optimizer, lr) if task.optimizer is not None else "sgd"
    shapes = jax.eval_shape(task.init_fn, jax.random.key(0)) if lr is not None else None
    opt = _optim.resolve(optimizer, lr, horizon, shapes)
    return dataclasses.replace(opt, name=_optim.TASK_OPTAX) if own and opt.name == "optax" else opt


def policy_default(optimizer, lr):
    """A policy's own (outer) optimizer as a run's default: a spec naming lr= (DiLoCo's
    'nesterov:0.9,lr=0.7') takes a learning rate given to the run instead (a rate to set
    or tune), so only an optimizer the user names pins its lr."""
    if lr is None or not isinstance(optimizer, str):
        return optimizer
    spec = _optim.get(optimizer)
    return dataclasses.replace(spec, lr=None) if spec.lr is not None else optimizer


def local_setup(schedules, task, inner_optimizer):
    """(Local config or None, inner Optimizer or None, steps [B, λ] int32 or None) of
    schedules that all are (or all are not) of a local-update method."""
    steps = [s.meta.get("local_steps") for s in schedules]
    if all(x is None for x in steps):
        works = {s.policy.work for s in schedules}
        step = [_local_mod.configure(w) for w in works]   # None: a gradient; else e.g. RL's learner
        if any(x is not None for x in step):
            # learners of other settings (in-flight segments, minibatches) share a sweep: each
            # configuration replays with its own (`configure`, a `core.Variant` of the sweep)
            if None in step or len({type(x) for x in step}) > 1:
                raise ValueError(f"sweep: {', '.join(sorted(str(s.policy) for s in schedules))} need separate "
                                 "sweeps: their workers compute different things")
            if inner_optimizer is not None:
                raise ValueError("inner_optimizer is for local-update methods; the policy "
                                 f"{schedules[0].policy.describe()!r} has no inner steps")
            return step[0], None, None
        if inner_optimizer is not None:
            raise ValueError("inner_optimizer is for local-update methods (local_sgd, diloco, async_diloco, "
                             f"streaming_diloco); the policy {schedules[0].policy.describe()!r} computes gradients")
        return None, None, None
    if any(x is None for x in steps):
        raise ValueError("sweep: local-update methods and gradient policies need separate sweeps")
    arr = np.asarray(steps, np.int32)
    rounds = max(int(s.columns["iteration"].max()) + 1 if s.num_gradients else 1 for s in schedules)
    works = [s.policy.work for s in schedules]
    local, inner_opt = local_config(works, arr, rounds, task, inner_optimizer)
    return local, inner_opt, arr


def local_config(works, steps: np.ndarray, rounds: int, task, inner_optimizer):
    """(engine.local.Local, inner Optimizer) of local-update work values `works` whose
    workers take `steps` [B, λ] inner steps per iteration, for `rounds` iterations.
    Each work gives its own configuration (`engine.local.configure`); works whose settings
    compiled into the replay differ (`Work.replay_settings`) need one sweep each."""
    h_max = int(steps.max())
    inner = inner_optimizer if inner_optimizer is not None else (task.optimizer or "sgd")
    inner_opt = resolve_optimizer(inner, None, rounds * h_max, task)
    if len({(type(w), w.replay_settings()) for w in works}) > 1:
        names = ', '.join(sorted({w.describe() for w in works}))
        what = (f"their {works[0].compiled_what} are compiled into the replay" if len({type(w) for w in works}) == 1
                else "their workers compute different things")
        raise ValueError(f"sweep: {names} need one sweep each: {what}")
    shapes = jax.eval_shape(task.init_fn, jax.random.key(0))
    return _local_mod.configure(works[0], inner_opt.tx, h_max, bool((steps != h_max).any()), shapes), inner_opt


def configure(schedule, task, *, optimizer, inner_optimizer, lr, rule, slot_mode: str = "vmap",
              padded: bool = True) -> core.Setup:
    """One configuration's replay settings (`core.Setup`): its server (outer) optimizer
    (`optimizer`, None: the policy's own, else the task's, else 'sgd'; scheduled over the
    schedule's updates), inner optimizer and steps, and the static settings its chunks
    compile with (padded: `Plan.padded_updates`). `replay` and every configuration of a
    sweep call this, so a configuration compiles the same program wherever it runs."""
    if optimizer is None:   # the policy's own outer optimizer (DiLoCo's), else the task's
        optimizer = policy_default(schedule.policy.optimizer, lr)
    opt = resolve_optimizer(optimizer, lr, schedule.num_updates, task)
    local, inner_opt, steps = local_setup([schedule], task, inner_optimizer)
    check_outer(opt, local, schedule.policy)
    opt = streaming_outer(opt, local)
    return core.Setup(opt, inner_opt, None if steps is None else steps[0],
                      core.Static(opt.tx, (rule,), slot_mode, local, padded))


def check_outer(opt: _optim.Optimizer, local, policy) -> None:
    """A clocked outer step reads each merge's share of a round, which only local-update
    merges give (`engine.update.round_share`): refuse it elsewhere before computing."""
    if local is None or getattr(local, "learner", False):
        _optim.refuse_share(opt, f"policy {policy.describe()!r}")


def streaming_outer(opt: _optim.Optimizer, local) -> _optim.Optimizer:
    """Streaming DiLoCo's outer optimizer: `opt` per fragment (engine.local.fragmented)."""
    if local is None or not local.streaming:
        return opt
    return dataclasses.replace(opt, tx=_fragmented(opt.tx, local.fragment_keys))


@functools.lru_cache(maxsize=64)
def _fragmented(tx, keys):
    return _local_mod.fragmented(tx, keys)   # cached: equal settings share one compiled replay


def replay(schedule: Schedule, task, *, settings: _settings.Settings | None = None, **overrides) -> Result:
    """Train `task` (a `staleness.tasks.Task` or a task name) along `schedule` (simulated or
    recorded) in compiled chunks.

    settings: an `engine.settings.Settings` (default: its defaults), taken whole; its fields
    may also be given by keyword, overriding it (num_updates and max_time bound a
    simulation, not a replay):
      lr: sets a spec optimizer's rate (default `optim.DEFAULT_LR`) or the `learning_rate`
        in an optax optimizer's state (`optax.inject_hyperparams`); None keeps the optimizer's own.
      lr_rule: a `staleness.lr` rule or spec ('constant', 'per_gradient', 'per_update',
        'delay_adaptive:N'): weights each gradient by its staleness.
      optimizer: the server optimizer, an optax transformation or a spec string ('sgd',
        'momentum:0.9', 'adamw:lr=1e-3,wd=0.1,clip=1+cosine'; `staleness.tasks.optim`).
        None: the policy's (a local-update method's outer optimizer), else the task's, else 'sgd'.
      inner_optimizer: local-update methods: the workers' inner optimizer (default the
        task's, else 'sgd'); each worker keeps its state across rounds.
      seed: seeds the initial parameters and every minibatch (default: the schedule's seed).
      eval_every: updates between evaluations (= per compiled call); default
        ceil(updates / num_evals).
      checkpoint: directory to checkpoint into after every chunk; resume=True continues from it.
      stop_after: stop (status 'stopped') after the chunk that reaches this many updates.
      slot_mode: 'vmap' (fast) or 'map': an update's gradients computed one by one with
        `engine.core.gradient`, as the real runtime's workers do (bitwise trace replays on CPU).
      config: extra entries of the Result's config; a 'label' entry names the run for the
        callbacks (default 'POLICY seed=S lr=LR').
      callbacks: a callable, a spec string ('tensorboard:DIR', 'wandb:PROJECT') or a list of
        them, called with a `staleness.infra.tracking.Evaluation` at every history row as it
        is recorded (on resume only the new ones).
    Returns: a `Result`. Raises `DivergenceError` (with `.result`) on a non-finite loss,
    naming the update, worker and staleness, and `staleness.infra.tracking.CallbackError`
    (with `.results`) when a callback raises.
    """
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule = {schedule!r} must be a staleness.Schedule")
    schedule.validate()
    s = merge(_settings.Settings, settings, overrides, "replay", exclude=("num_updates", "max_time"))
    return _replay(schedule, task, _settings.check(s))


def _replay(source, task, s: _settings.Settings) -> Result:
    """`replay` of `source` with checked settings `s` (`settings.check`): a `Schedule`, or a
    `sim.ScheduleStream` replayed while it is simulated (`simulate`: the plan is filled
    chunk by chunk, `plan.PlanStream`)."""
    streamed = isinstance(source, ScheduleStream)
    callbacks = _tracking.as_callbacks(s.callbacks)
    rule = _lr.get(s.lr_rule) if isinstance(s.lr_rule, str) else s.lr_rule
    seed = int(source.seed if s.seed is None and source.seed is not None else (s.seed or 0))
    task = resolve_task(task, source.num_workers, s.batch_size)
    chunk = _chunks.chunk_length(source.num_updates, s.eval_every, s.num_evals)
    feed = PlanStream(source, chunk, source.driver.policy.streamable(source.num_workers)) if streamed else None
    plan = feed.plan if streamed else make_plan(source, chunk)
    # a plan whose real updates all have a slot replays without the padding select (a
    # streamed plan: every update holds its policy's fixed number of gradients)
    opt, inner_opt, steps, static = configure(source, task, optimizer=s.optimizer, inner_optimizer=s.inner_optimizer,
                                              lr=s.lr, rule=rule, slot_mode=s.slot_mode,
                                              padded=False if streamed else plan.padded_updates)
    local = static.local
    consts = {"data_key": core.keys(seed)[1], "rule": jnp.int32(0)}
    if steps is not None:
        consts["steps"] = jnp.asarray(steps)
    carry = core.init_carry(task, seed, opt, plan.ring, inner_opt, source.num_workers,
                            None if local is None or local.learner else local.layout)
    if local is not None and local.learner:   # the probe set of the learner's kl_version, at version 0
        consts["probe"] = task.probe(carry.params)
    member = _runner.Member(source, plan, seed, rule, _runner.learning_rate(opt, carry.opt_state), steps, s.config)
    options = _runner.Options(chunk, task.config(), opt.describe(), None if inner_opt is None else inner_opt.describe(),
                              stop_after=s.stop_after, checkpoint=None if s.checkpoint is None else Path(s.checkpoint),
                              resume=s.resume, progress=s.progress, desc=source.policy.describe(),
                              callbacks=callbacks)
    program = _runner.single(task, plan, consts, static)
    if not streamed:
        return _runner.run(program, carry, [member], options)[0]
    return _streamed(program, feed, carry, member, options)


def _streamed(program, feed: PlanStream, carry, member, options) -> Result:
    """Run `program` on a plan filled as it is simulated: chunk k's rows are simulated while
    chunk k - 1 runs, and a ring that became too small grows before the next chunk
    (`core.grow_ring`). The first chunk runs in parts of `plan.LOOKAHEAD` updates, each
    simulated while the one before runs; the `Schedule` is finished while the last chunk but
    one runs. The Results (also a `DivergenceError`'s or a `CallbackError`'s) get it."""
    plan = feed.plan
    first = min(plan.chunk, plan.num_updates)
    parts = [(lo, min(lo + LOOKAHEAD, first)) for lo in range(0, first, LOOKAHEAD)]
    finished = []

    def schedule():
        if not finished:
            finished.append(feed.stream.finish())
        return finished[0]

    def call(carry, xs):
        if feed.grew:
            carry = core.grow_ring(carry, feed.ring)
            feed.grew = False
        return program.step(carry, xs)

    def inputs(k):
        if k == 0 and len(parts) > 1:
            return None   # `step` runs it in parts
        feed.fill(k)
        xs = program.inputs(k)
        if k == plan.num_chunks - 1 and k > 0:
            schedule()    # while chunk k - 1 runs
        return xs

    def step(carry, xs):
        if xs is not None:
            return call(carry, xs)
        outs = []
        for lo, hi in parts:   # part j + 1 is simulated while part j runs
            feed.fill_to(hi)
            carry, out = call(carry, program.span(lo, hi))
            outs.append((hi - lo, out))
        if plan.num_chunks == 1:
            schedule()
        return carry, outs

    def losses(out):   # a chunk run in parts: their outputs in one [chunk, ...] each (NaN past the run)
        if isinstance(out, list):
            def whole(*parts):
                rows = np.concatenate([o[:n] for (n, _), o in zip(out, parts)])
                return np.concatenate([rows, np.full((plan.chunk - len(rows),) + rows.shape[1:], np.nan, rows.dtype)])
            out = jax.tree.map(whole, *[o for _, o in out])
        return program.losses(out)

    try:
        result = _runner.run(program._replace(step=step, inputs=inputs, losses=losses), carry, [member], options)[0]
    except (_chunks.DivergenceError, _tracking.CallbackError) as e:
        for r in [getattr(e, "result", None), *(getattr(e, "results", None) or [])]:
            if r is not None:
                r.schedule = schedule()
        raise
    result.schedule = schedule()
    return result


def simulate(task, policy, cluster, *, settings: _settings.Settings | None = None, **overrides) -> Result:
    """Simulate `policy` on `cluster` and train `task` along the schedule.

    `settings` (an `engine.settings.Settings`, taken whole) and keyword overrides of its
    fields: `num_updates` / `max_time` (simulated seconds) bound the run (both: it stops at
    whichever comes first), `seed` (default 0) seeds the cluster's draws, the parameters and
    the minibatches, and the others are `replay`'s (lr, lr_rule, optimizer, eval_every,
    callbacks, ...). A run whose workers were all lost before the
    budget has status 'failed' (`config['ended']` says when).
    Transfers carry the bytes of the task's parameter pytree (and of the method's
    compressed deltas: `staleness.engine.payload`), timed by the cluster's network.
    """
    from staleness import cluster as _cluster
    from staleness.engine import payload as _payload

    s = _settings.check(merge(_settings.Settings, settings, overrides, "simulate"))
    s = dataclasses.replace(s, seed=0) if s.seed is None else s
    num_updates, max_time, seed = s.num_updates, s.max_time, s.seed
    policy, cluster = _policies.resolve(policy), _cluster.resolve(cluster)
    task = resolve_task(task, cluster.num_workers, s.batch_size)
    pull_bytes, push_bytes = _payload.payload_bytes(task, policy)
    stream = stream_schedule(policy, cluster, num_updates=num_updates, max_time=max_time, seed=seed,
                             payload_bytes=pull_bytes, push_bytes=push_bytes, sizes=work_sizes(task, policy, seed))
    if (stream.bounded and stream.steady and policy.streamable(cluster.num_workers) is not None
            and s.checkpoint is None):
        # the replay of chunk k overlaps the simulation of chunk k + 1 (bitwise the same Result)
        result = _replay(stream, task, s)
        sched = result.schedule
    else:
        sched = stream.finish()
        sched.validate()
        if sched.num_updates == 0:   # nothing to train: say why, in the policy's words
            who, what = ("actor", "learner update") if policy.learner else ("worker", "update")
            raise ValueError(f"simulate: every {who} was lost before the first {what}: nothing to train; "
                             "check the cluster's failures (a worker that rejoins trains again)")
        result = _replay(sched, task, s)
    if ((num_updates is None or sched.num_updates < num_updates) and (max_time is None or sched.end_time < max_time)
            and result.status == "complete"):   # the events ran out before the budget: every worker was lost
        result.status = "failed"
        budget = " and ".join(([f"{num_updates} updates"] if num_updates is not None else [])
                              + ([f"{max_time:g} s"] if max_time is not None else []))
        result.config["ended"] = (f"every worker was lost: the run ended at {sched.end_time:.6g} simulated s after "
                                  f"{sched.num_updates} updates (budget {budget})")
    return result


def sweep(task, policies, cluster, *, settings: _settings.SweepSettings | None = None, progress: bool = False,
          devices=None, block: int | None = None, callbacks=None, **overrides) -> list[Result]:
    """Replay many configurations in one compiled call per chunk.

    Configurations are the product policies × seeds × lr_rules × lrs (in that order); each
    runs the ops of its own replay (`engine.core.chunk_batched`), so each Result is bitwise
    the corresponding `simulate` on CPU, whatever else is in the grid. A diverging
    configuration gets status 'diverged', its history stops at the last finite chunk and
    `config['divergence']` names the update, worker and staleness.

    Args:
      settings: an `engine.settings.SweepSettings` (default: its defaults), taken whole; its
        fields may also be given by keyword (overriding it): seeds, lr_rules, lrs (the grid's
        axes), the others as `simulate`'s, and ring and slots: the padding, pinned (neither
        changes a number) to compile once for several grids whose configurations compile
        alike (the same optimizer, lr rules and gradients per update).
      devices: shard the configuration axis over local devices (`grid.resolve_devices`);
        block: configurations per device per compiled call (default min(8, ⌈grid size /
        lanes⌉), lanes the devices, or on one CPU device its cores, so every core runs a call);
        the Results do not depend on either, nor on the processes (an RL task's sharded
        learner gradient rounds otherwise: README, 'Command line').
      callbacks: as `replay`'s, one call per configuration and evaluation in grid order
        (`runner.Options`); a diverged configuration gets no more calls.
        `Evaluation.run.index` is the position in grid order, `run.label` names the policy,
        seed, lr and lr rule.
    Each Result's config holds ring, slots, devices, compile_s (seconds spent
    compiling during the sweep) and sweep_s (the sweep's wall time).
    """
    callbacks = _tracking.as_callbacks(callbacks)
    grid = prepare(task, policies, cluster, settings=settings, **overrides)
    return _grid.replay_grid(grid, devices=devices, progress=progress, block=block, callbacks=callbacks)


def prepare(task, policies, cluster, *, settings: _settings.SweepSettings | None = None, **overrides) -> _grid.Grid:
    """Simulate every schedule of a sweep and pad every plan to one shape: the `Grid`
    that `engine.grid.replay_grid` replays (in blocks, over devices or processes).

    settings, overrides: `sweep`'s (an `engine.settings.SweepSettings` and keyword overrides of
    its fields, checked here)."""
    from staleness import cluster as _cluster
    from staleness.engine import payload as _payload

    s = _settings.check_sweep(merge(_settings.SweepSettings, settings, overrides, "sweep"))
    if isinstance(policies, (str, _policies.Policy)) or not hasattr(policies, "__iter__"):
        raise TypeError(f"sweep: policies = {policies!r} must be a list of policies (values or spec strings)")
    pols = [_policies.resolve(p) for p in policies]
    rules = [_lr.get(r) if isinstance(r, str) else r for r in s.lr_rules]
    lrs = [checks.learning_rate(v, allow_none=True) for v in s.lrs]
    seeds = [int(x) for x in s.seeds]
    if not pols or not seeds or not rules or not lrs:
        raise ValueError("sweep: policies, seeds, lr_rules and lrs must each be non-empty")
    for name, values in (("policies", [p.describe() for p in pols]), ("seeds", seeds),
                         ("lr_rules", [r.describe() for r in rules]), ("lrs", lrs)):
        checks.distinct("sweep", name, values)
    optimizer, lrs = _policy_rates(pols, s.optimizer, lrs)
    cluster = _cluster.resolve(cluster)
    task = resolve_task(task, cluster.num_workers, s.batch_size)
    # as `simulate` does: transfers carry the bytes of the task's pytree (the method's payload)
    payload = {p: _payload.payload_bytes(task, p) for p in pols}
    keys = [(p, x) for p in pols for x in seeds]   # simulated on every core when that pays (`sim_pool`)
    jobs = [dict(policy=p, cluster=cluster, num_updates=s.num_updates, max_time=s.max_time, seed=x,
                 payload_bytes=payload[p][0], push_bytes=payload[p][1], sizes=work_sizes(task, p, x)) for p, x in keys]
    schedules = dict(zip(keys, simulate_schedules(jobs)))
    configs = list(itertools.product(pols, seeds, rules, lrs))
    u_max = max(x.num_updates for x in schedules.values())
    chunk = _chunks.chunk_length(u_max, s.eval_every, s.num_evals)
    ring, slots = _grid.padding(list(schedules.values()), chunk, s.ring, s.slots)
    counts = [segment_count(x) for x in schedules.values()]   # in-flight rollouts: every plan gets segments
    segments = None if all(c is None for c in counts) else max(c or 1 for c in counts)
    plans = [_grid.pad_plan(schedules[(p, x)], chunk, ring=ring, slots=slots, num_updates=u_max, segments=segments)
             for p, x, _, _ in configs]
    _check_optimizer(optimizer, pols, lrs, u_max, task)
    local_setup([schedules[(p, x)] for p, x, _, _ in configs], task, s.inner_optimizer)   # checks: one kind of work
    # each configuration replays as its own `replay` would (its optimizer's horizon, its lr
    # rule, inner steps, slots and segments); the batch runs each on its own variant
    setups, variants = [], []
    for (p, x, r, v), plan in zip(configs, plans):
        sched = schedules[(p, x)]
        setup = configure(sched, task, optimizer=optimizer, inner_optimizer=s.inner_optimizer, lr=v, rule=r,
                          padded=plan.padded_updates)
        own = segment_count(sched)
        setups.append(setup)
        variants.append(core.Variant(setup.static, _grid.needs(sched)[1], own,
                                     own is not None or bool(getattr(task, "indexed", False))))
    distinct = tuple(dict.fromkeys(variants))
    return _grid.Grid(task, configs, schedules, plans, chunk, ring, slots, setups, distinct,
                      [distinct.index(v) for v in variants], cluster.num_workers)


def _policy_rates(pols, optimizer, lrs):
    """(optimizer, lrs) of a sweep: with no optimizer given and the policies' own spec
    naming lr= (DiLoCo's 'nesterov:0.9,lr=0.7'), swept rates replace its lr, and a None
    rate (the optimizer's own) is that lr."""
    own = {p.optimizer for p in pols}
    if optimizer is None and len(own) == 1 and any(v is not None for v in lrs):
        default = own.pop()
        spec = _optim.get(default) if isinstance(default, str) else None
        if spec is not None and spec.lr is not None:
            return dataclasses.replace(spec, lr=None), [spec.lr if v is None else v for v in lrs]
    return optimizer, lrs


def _check_optimizer(optimizer, pols, lrs, horizon: int, task) -> None:
    """Check the server (outer) optimizer of a sweep, `optimizer`, else the policies' own (they
    must agree on one), with every swept rate (each must agree with an lr= it names)."""
    if optimizer is None:
        own = {p.optimizer for p in pols}
        if len(own) > 1:
            raise ValueError(f"sweep: the policies are defined with different optimizers {sorted(map(str, own))}; "
                             "pass optimizer= to compare them with one")
        optimizer = own.pop()
    for v in list(dict.fromkeys(v for v in lrs if v is not None)) or [None]:
        resolve_optimizer(optimizer, v, horizon, task)
