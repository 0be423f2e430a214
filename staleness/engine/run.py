"""Drivers of the compiled replay: `replay`, `simulate` and `sweep`.

The imperative shell: it prepares plans on the host, calls one compiled
function per evaluation chunk, evaluates, records history, checkpoints, and
reports progress. All numerics are in `staleness.engine.core`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from staleness import checkpoint as _checkpoint
from staleness import lr as _lr
from staleness import policies as _policies
from staleness.engine import chunks as _chunks
from staleness.engine import core
from staleness.engine import local as _local_mod
from staleness.engine import optim as _optim
from staleness.engine.plan import Plan, fingerprint, make_plan
from staleness.results import Result
from staleness.schedule import Schedule
from staleness.sim import simulate_schedule

__all__ = ["replay", "simulate", "sweep", "resolve_task"]

def resolve_task(task, num_workers: int, batch_size: int | None = None, data_dir=None, partition: str | None = None):
    """A Task object, or a task name (built-in, registered or 'package.module:factory')
    made for `num_workers` workers: `staleness.tasks.registry.resolve`."""
    from staleness.tasks import registry

    return registry.resolve(task, num_workers, batch_size, data_dir, partition)


def _check_lr(value, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"lr = {value!r} must be a finite number > 0 (the learning rate)")
    return float(value)


def resolve_optimizer(optimizer, lr, horizon: int, task) -> _optim.Optimizer:
    """`optim.resolve` of `optimizer` (None: the task's own, else 'sgd'), with the task's
    parameter shapes (to check that lr= can be set). The task's own optax object is
    described as `optim.TASK_OPTAX`, so a replay that rebuilds the task gets it back."""
    own = optimizer is None and task.optimizer is not None
    if optimizer is None:
        optimizer = task.optimizer if task.optimizer is not None else "sgd"
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


def policy_optimizer(policy_spec: str):
    """The outer optimizer a schedule's policy is defined with (DiLoCo's Nesterov SGD, Local
    SGD's averaging), or None."""
    try:
        return _policies.parse(policy_spec).optimizer
    except ValueError:   # a policy this build does not know (a trace from elsewhere)
        return None


def local_setup(schedules, task, inner_optimizer):
    """(Local config or None, inner Optimizer or None, steps [B, λ] int32 or None) of
    schedules that all are (or all are not) of a local-update method."""
    steps = [s.meta.get("local_steps") for s in schedules]
    if all(x is None for x in steps):
        if inner_optimizer is not None:
            raise ValueError("inner_optimizer is for local-update methods (local_sgd, diloco, async_diloco, "
                             f"streaming_diloco); the policy {schedules[0].policy!r} computes gradients")
        return None, None, None
    if any(x is None for x in steps):
        raise ValueError("sweep: local-update methods and gradient policies need separate sweeps")
    arr = np.asarray(steps, np.int32)
    rounds = max(int(s.columns["iteration"].max()) + 1 if s.num_gradients else 1 for s in schedules)
    works = [_policies.parse(s.policy).work for s in schedules]
    local, inner_opt = local_config(works, arr, rounds, task, inner_optimizer)
    return local, inner_opt, arr


def local_config(works, steps: np.ndarray, rounds: int, task, inner_optimizer):
    """(engine.local.Local, inner Optimizer) of local-update work values `works` whose
    workers take `steps` [B, λ] inner steps per iteration, for `rounds` iterations."""
    h_max = int(steps.max())
    inner = inner_optimizer if inner_optimizer is not None else (task.optimizer or "sgd")
    inner_opt = resolve_optimizer(inner, None, rounds * h_max, task)
    stream = {w for w in works if isinstance(w, _policies.Streaming)}
    if stream:
        if len(set(works)) > 1:
            raise ValueError("sweep: Streaming DiLoCo settings (H, fragments, overlap, alpha, bits) need one sweep "
                             "each: they are compiled into its replay")
        w = stream.pop()
        keys = _local_mod.fragment_keys(jax.eval_shape(task.init_fn, jax.random.key(0)), w.fragments)
        return _local_mod.Local(inner_opt.tx, h_max, False, w.fragments, w.overlap, w.alpha, w.bits, keys), inner_opt
    return _local_mod.Local(inner_opt.tx, h_max, bool((steps != h_max).any())), inner_opt


def streaming_outer(opt: _optim.Optimizer, local) -> _optim.Optimizer:
    """Streaming DiLoCo's outer optimizer: `opt` per fragment (engine.local.fragmented)."""
    if local is None or not local.streaming:
        return opt
    return dataclasses.replace(opt, tx=_fragmented(opt.tx, local.fragment_keys))


@functools.lru_cache(maxsize=64)
def _fragmented(tx, keys):
    return _local_mod.fragmented(tx, keys)   # cached: equal settings share one compiled replay


def learning_rate(opt: _optim.Optimizer, opt_state) -> float | None:
    """The learning rate a run starts from (for its config): the one set, else the state's."""
    if opt.lr is not None:
        return opt.lr
    value = _optim.get_lr(opt_state)
    return None if value is None else float(np.asarray(value).reshape(-1)[0])


_chunk_length = _chunks.chunk_length


def _history_row(update: int, plan: Plan, train_loss: float, metrics: dict) -> dict:
    time = float(plan.update_time[update - 1]) if update > 0 else 0.0
    row = {"update": int(update), "time": time, "train_loss": float(train_loss)}
    row.update({k: float(v) for k, v in metrics.items()})
    return row


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


_update_losses = _chunks.update_losses


def chunk_inputs(task, plan: Plan, k: int, data_key):
    """Scan inputs of chunk k: (update [K], packed [K, 5, C], index [K, C, μ] or None).
    For `indexed` tasks the minibatch indices of every slot are computed here, on the
    host (`task.host_indices`), so the compiled replay only gathers, as a plain
    training loop over a precomputed table does."""
    update, packed = plan.xs(k)
    if not task.indexed:
        return update, packed, None
    lo, hi = k * plan.chunk, (k + 1) * plan.chunk
    return update, packed, task.host_indices(data_key, plan.worker[lo:hi], plan.iteration[lo:hi])


_first_nonfinite = _chunks.first_nonfinite


def replay(
    schedule: Schedule,
    task,
    *,
    lr: float | None = None,
    lr_rule="constant",
    optimizer=None,
    inner_optimizer=None,
    seed: int | None = None,
    eval_every: int | None = None,
    num_evals: int = 20,
    batch_size: int | None = None,
    progress: bool = False,
    checkpoint=None,
    resume: bool = False,
    stop_after: int | None = None,
    slot_mode: str = "vmap",
    config: dict | None = None,
) -> Result:
    """Train `task` along `schedule` (simulated or recorded) in compiled chunks.

    Args:
      schedule: the `Schedule` to replay.
      task: a `staleness.tasks.Task` or a built-in task name.
      lr: the learning rate: sets a spec optimizer's (default `optim.DEFAULT_LR`)
        or the `learning_rate` in an optax optimizer's state (built with
        `optax.inject_hyperparams`); None keeps the optimizer's own.
      lr_rule: a `staleness.lr` rule or spec ('constant', 'per_gradient',
        'per_update', 'delay_adaptive:N'): weights each gradient by its staleness.
      optimizer: the server optimizer: any optax transformation (e.g.
        `optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))`) or a
        spec string ('sgd', 'momentum:0.9', 'adamw:lr=1e-3,wd=0.1,clip=1+cosine');
        see `staleness.engine.optim`. None: the policy's (a local-update method's
        outer optimizer), else the task's own, else 'sgd'.
      inner_optimizer: local-update methods: the workers' inner optimizer (an optax
        transformation or spec; default the task's, else 'sgd'); each worker keeps its
        state across rounds.
      seed: seeds the initial parameters and every minibatch (default: the schedule's seed).
      eval_every: updates between evaluations (= updates per compiled call);
        default ceil(updates / num_evals).
      checkpoint: directory to checkpoint into after every chunk; with
        resume=True, continue from the checkpoint found there.
      stop_after: stop (status 'stopped') after the chunk that reaches this many updates.
      slot_mode: 'vmap' (fast) or 'map': the gradients of an update that holds
        several are computed one by one with `engine.core.gradient`, exactly as
        the real runtime's workers compute them (bitwise trace replays on CPU).
    Returns: a `Result`. Raises `DivergenceError` (with `.result`) on a
    non-finite loss, naming the update, worker and staleness.
    """
    from tqdm.auto import tqdm

    lr = _check_lr(lr, allow_none=True)
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule = {schedule!r} must be a staleness.Schedule")
    schedule.validate()
    if slot_mode not in ("vmap", "map"):
        raise ValueError(f"slot_mode = {slot_mode!r} must be 'vmap' or 'map'")
    rule = _lr.get(lr_rule) if isinstance(lr_rule, str) else lr_rule
    seed = int(schedule.seed if seed is None and schedule.seed is not None else (seed or 0))
    task = resolve_task(task, schedule.num_workers, batch_size)
    if optimizer is None:   # the policy's own outer optimizer (DiLoCo's), else the task's
        optimizer = policy_default(policy_optimizer(schedule.policy), lr)
    opt = resolve_optimizer(optimizer, lr, schedule.num_updates, task)
    local, inner_opt, steps = local_setup([schedule], task, inner_optimizer)
    opt = streaming_outer(opt, local)
    chunk = _chunk_length(schedule.num_updates, eval_every, num_evals)
    plan = make_plan(schedule, chunk)
    consts = {"data_key": core.keys(seed)[1], "rule": jnp.int32(0)}
    if local is not None:
        consts["steps"] = jnp.asarray(steps[0])
    rules = (rule,)

    carry = core.init_carry(task, seed, opt, plan.ring, inner_opt, schedule.num_workers,
                            local is not None and local.streaming)
    config = dict(config or {})
    config.update(**task.config(), lr=learning_rate(opt, carry.opt_state),
                  lr_rule=rule.describe(), optimizer=opt.describe(), seed=seed, policy=schedule.policy,
                  cluster=schedule.cluster, workers=schedule.num_workers, eval_every=chunk)
    if local is not None:
        config.update(inner_optimizer=inner_opt.describe(), local_steps=[int(h) for h in steps[0]])
    hist = _chunks.History(plan.num_updates, _history_row(0, plan, math.nan,
                                                          jax.device_get(core.evaluate(task, carry.params))))
    start = 0
    ckpt = Path(checkpoint) if checkpoint is not None else None
    identity = {"fingerprint": fingerprint(schedule),
                **{k: config[k] for k in ("task", "lr", "lr_rule", "optimizer", "seed", "eval_every")}}
    if ckpt is not None and resume:
        meta, carry = _checkpoint.load(ckpt, carry, match=_checkpoint_identity(identity), name="replay")
        hist.restore(meta)
        start = int(meta["next_chunk"])
    hist.params = jax.device_get(carry.params)

    padded = plan.padded   # static: a plan without padding updates replays without the padding select

    def step(carry, xs):
        return core.run_chunk(task, carry, xs, consts, opt=opt.tx, rules=rules, slot_mode=slot_mode, local=local,
                              padded=padded)

    def record(k, carry, losses, _wall):
        xs = plan.chunk_view(k)
        lo, hi = k * chunk, min((k + 1) * chunk, plan.num_updates)
        per_update = _update_losses(losses, xs["mask"])
        hist.losses(lo, per_update[: hi - lo])
        bad = _first_nonfinite(losses, xs["mask"])
        if bad is not None:
            row, slot = int(bad[0]), int(bad[1])
            d = _chunks.Divergence(lo + row, int(xs["worker"][row, slot]), int(xs["staleness"][row, slot]),
                                   f"iteration {int(xs['iteration'][row, slot])}")
            _chunks.raise_divergence(hist, d, schedule, config, config["lr"], cut=lo + row)
        metrics = jax.device_get(core.evaluate(task, carry.params))
        hist.add(_history_row(hi, plan, float(np.mean(per_update[: hi - lo])), metrics), jax.device_get(carry.params))
        return not (stop_after is not None and hi >= stop_after)

    def save(k, carry):
        if ckpt is not None:
            _checkpoint.save(ckpt, carry, {"next_chunk": k + 1, **hist.state()},
                             match=_checkpoint_identity(identity), name="replay")

    bar = tqdm(total=plan.num_updates, initial=min(start * chunk, plan.num_updates), unit="upd",
               disable=not progress, desc=f"{schedule.policy}", leave=False)
    _chunks.run(step, carry, num_chunks=plan.num_chunks, inputs=lambda k: chunk_inputs(task, plan, k,
                                                                                        consts["data_key"]),
                record=record, start=start, save=save, histories=[hist], bar=bar,
                bar_step=lambda k: min((k + 1) * chunk, plan.num_updates) - k * chunk)
    return hist.result(schedule, config)


def simulate(task, policy, cluster, *, num_updates: int | None = None, max_time: float | None = None,
             seed: int = 0, **kwargs) -> Result:
    """Simulate `policy` on `cluster` and train `task` along the schedule.

    `num_updates` / `max_time` (simulated seconds) bound the run; other
    keyword arguments go to `replay` (lr, lr_rule, optimizer, eval_every, ...).
    Transfers carry the bytes of the task's parameter pytree (and of the method's
    compressed deltas: `staleness.engine.payload`), timed by the cluster's network.
    """
    from staleness import cluster as _cluster
    from staleness.engine import payload as _payload

    if isinstance(policy, str):
        policy = _policies.parse(policy)
    if isinstance(cluster, str):
        cluster = _cluster.parse(cluster)
    task = resolve_task(task, cluster.num_workers, kwargs.get("batch_size"))
    pull_bytes, push_bytes = _payload.payload_bytes(task, policy)
    sched = simulate_schedule(policy, cluster, num_updates=num_updates, max_time=max_time, seed=seed,
                              payload_bytes=pull_bytes, push_bytes=push_bytes)
    return replay(sched, task, seed=seed, **kwargs)


def sweep(task, policies, cluster, *, seeds=(0,), lr_rules=("constant",), lrs=(None,),
          num_updates: int | None = None, max_time: float | None = None, optimizer=None,
          inner_optimizer=None, eval_every: int | None = None, num_evals: int = 20,
          batch_size: int | None = None, progress: bool = False, ring: int | None = None,
          slots: int | None = None, devices=None, block: int | None = None) -> list[Result]:
    """Replay many configurations in one compiled, vmapped call per chunk (policies × seeds ×
    lr_rules × lrs), optionally sharded over local `devices`: `staleness.engine.sweeps.sweep`."""
    from staleness.engine import sweeps

    return sweeps.sweep(task, policies, cluster, seeds=seeds, lr_rules=lr_rules, lrs=lrs, num_updates=num_updates,
                        max_time=max_time, optimizer=optimizer, inner_optimizer=inner_optimizer,
                        eval_every=eval_every, num_evals=num_evals, batch_size=batch_size, progress=progress,
                        ring=ring, slots=slots, devices=devices, block=block)


# -- checkpoints -------------------------------------------------------------------
def _checkpoint_identity(identity: dict) -> dict:
    """What a replay checkpoint must agree with: the schedule's fingerprint and the run's settings."""
    return {k: v for k, v in identity.items()}
