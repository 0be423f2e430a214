"""Drivers of the compiled replay: `replay`, `simulate` and `sweep`.

The imperative shell: it prepares plans on the host, calls one compiled
function per evaluation chunk, evaluates, records history, checkpoints, and
reports progress. All numerics are in `staleness.engine.core`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from staleness import lr as _lr
from staleness import policies as _policies
from staleness.engine import core
from staleness.engine import local as _local_mod
from staleness.engine import optim as _optim
from staleness.engine.plan import Plan, fingerprint, make_plan
from staleness.results import DivergenceError, Result
from staleness.schedule import Schedule
from staleness.sim import simulate_schedule

__all__ = ["replay", "simulate", "sweep", "resolve_task"]

CHECKPOINT_VERSION = 1


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
    parameter shapes (to check that lr= can be set)."""
    if optimizer is None:
        optimizer = task.optimizer if task.optimizer is not None else "sgd"
    shapes = jax.eval_shape(task.init_fn, jax.random.key(0)) if lr is not None else None
    return _optim.resolve(optimizer, lr, horizon, shapes)


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
            raise ValueError("sweep: Streaming DiLoCo settings (fragments, overlap, alpha, bits) need separate sweeps")
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


def _chunk_length(num_updates: int, eval_every: int | None, num_evals: int) -> int:
    if eval_every is not None:
        if not isinstance(eval_every, (int, np.integer)) or eval_every < 1:
            raise ValueError(f"eval_every = {eval_every!r} must be an integer >= 1 (updates)")
        return int(eval_every)
    if not isinstance(num_evals, (int, np.integer)) or num_evals < 1:
        raise ValueError(f"num_evals = {num_evals!r} must be an integer >= 1")
    return max(1, -(-num_updates // num_evals))


def _history_row(update: int, plan: Plan, train_loss: float, metrics: dict) -> dict:
    time = float(plan.update_time[update - 1]) if update > 0 else 0.0
    row = {"update": int(update), "time": time, "train_loss": float(train_loss)}
    row.update({k: float(v) for k, v in metrics.items()})
    return row


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def _update_losses(losses: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[K] mean loss of each update's real slots (NaN for padding updates)."""
    count = mask.sum(axis=1)
    total = np.where(mask, losses, 0.0).sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


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


def _first_nonfinite(losses: np.ndarray, mask: np.ndarray):
    bad = mask & ~np.isfinite(losses)
    if not bad.any():
        return None
    flat = np.flatnonzero(bad.reshape(-1))[0]
    return np.unravel_index(flat, bad.shape)


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
    opt = resolve_optimizer(optimizer if optimizer is not None else policy_optimizer(schedule.policy), lr,
                            schedule.num_updates, task)
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
    rows = [_history_row(0, plan, math.nan, jax.device_get(core.evaluate(task, carry.params)))]
    train_loss = np.full(plan.num_updates, np.nan)
    start = 0
    ckpt = Path(checkpoint) if checkpoint is not None else None
    fp = fingerprint(schedule)
    if ckpt is not None and resume:
        carry, rows, train_loss, start = _load_checkpoint(ckpt, carry, fp, config)
    last_params = jax.device_get(carry.params)
    status = "complete"
    bar = tqdm(total=plan.num_updates, initial=min(start * chunk, plan.num_updates), unit="upd",
               disable=not progress, desc=f"{schedule.policy}", leave=False)
    nxt = chunk_inputs(task, plan, start, consts["data_key"]) if start < plan.num_chunks else None
    try:
        for k in range(start, plan.num_chunks):
            carry, losses = core.run_chunk(task, carry, nxt, consts, opt=opt.tx, rules=rules, slot_mode=slot_mode,
                                           local=local)
            if k + 1 < plan.num_chunks:  # host work for the next chunk while this one runs
                nxt = chunk_inputs(task, plan, k + 1, consts["data_key"])
            xs = plan.chunk_view(k)
            losses = np.asarray(losses)
            lo, hi = k * chunk, min((k + 1) * chunk, plan.num_updates)
            bad = _first_nonfinite(losses, xs["mask"])
            per_update = _update_losses(losses, xs["mask"])
            train_loss[lo:hi] = per_update[: hi - lo]
            if bad is not None:
                row, slot = int(bad[0]), int(bad[1])
                u = lo + row
                result = Result(_frame(rows), schedule, last_params, config, train_loss[:u], "diverged")
                raise DivergenceError(
                    f"non-finite loss at update {u} (gradient of worker {int(xs['worker'][row, slot])}, "
                    f"iteration {int(xs['iteration'][row, slot])}, staleness {int(xs['staleness'][row, slot])}); "
                    f"try a smaller lr (now {config['lr']}) or a staleness-aware lr_rule",
                    result,
                )
            metrics = jax.device_get(core.evaluate(task, carry.params))
            rows.append(_history_row(hi, plan, float(np.mean(per_update[: hi - lo])), metrics))
            last_params = jax.device_get(carry.params)
            bar.update(hi - lo)
            if ckpt is not None:
                _save_checkpoint(ckpt, carry, rows, train_loss, k + 1, fp, config)
            if stop_after is not None and hi >= stop_after and hi < plan.num_updates:
                status = "stopped"
                break
    except KeyboardInterrupt:
        # Ctrl-C: keep everything recorded up to the last completed chunk.
        status = "stopped"
        done = int(rows[-1]["update"])
        train_loss[done:] = np.nan
    finally:
        bar.close()
    return Result(_frame(rows), schedule, last_params, config, train_loss, status)


def simulate(task, policy, cluster, *, num_updates: int | None = None, max_time: float | None = None,
             seed: int = 0, **kwargs) -> Result:
    """Simulate `policy` on `cluster` and train `task` along the schedule.

    `num_updates` / `max_time` (simulated seconds) bound the run; other
    keyword arguments go to `replay` (lr, lr_rule, optimizer, eval_every, ...).
    """
    if isinstance(policy, str):
        policy = _policies.parse(policy)
    sched = simulate_schedule(policy, cluster, num_updates=num_updates, max_time=max_time, seed=seed)
    return replay(sched, task, seed=seed, **kwargs)


def sweep(task, policies, cluster, *, seeds=(0,), lr_rules=("constant",), lrs=(None,),
          num_updates: int | None = None, max_time: float | None = None, optimizer=None,
          inner_optimizer=None, eval_every: int | None = None, num_evals: int = 20,
          batch_size: int | None = None, progress: bool = False) -> list[Result]:
    """Replay many configurations in one compiled, vmapped call per chunk.

    Configurations are the product policies × seeds × lr_rules × lrs (in that
    order); every schedule is padded to the same number of updates, gradient
    slots and ring size. Returns one Result per configuration; each equals
    the corresponding `simulate` up to float rounding (vmap reorders sums).
    A diverging configuration gets status 'diverged' and its history stops there.
    """
    from tqdm.auto import tqdm

    pols = [_policies.parse(p) if isinstance(p, str) else p for p in policies]
    rules_in = [_lr.get(r) if isinstance(r, str) else r for r in lr_rules]
    lrs = [_check_lr(v, allow_none=True) for v in lrs]
    seeds = [int(s) for s in seeds]
    if not pols or not seeds or not rules_in or not lrs:
        raise ValueError("sweep: policies, seeds, lr_rules and lrs must each be non-empty")
    schedules = {(p, s): simulate_schedule(p, cluster, num_updates=num_updates, max_time=max_time, seed=s)
                 for p in pols for s in seeds}
    configs = list(itertools.product(pols, seeds, rules_in, lrs))
    task = resolve_task(task, cluster.num_workers if not isinstance(cluster, str) else
                        next(iter(schedules.values())).num_workers, batch_size)
    u_max = max(s.num_updates for s in schedules.values())
    chunk = _chunk_length(u_max, eval_every, num_evals)
    slots = max(int(s.update_members()[1].sum(1).max()) for s in schedules.values())
    ring = max(make_plan(s, chunk).ring for s in schedules.values())
    plans = [make_plan(schedules[(p, s)], chunk, slots=slots, ring=ring, num_updates=u_max)
             for p, s, _, _ in configs]
    distinct_rules = tuple(dict.fromkeys(rules_in))
    set_lrs = [v for v in lrs if v is not None]
    if optimizer is None:   # the policies' own (outer) optimizer, if they agree on one
        own = {p.optimizer for p in pols}
        if len(own) > 1:
            raise ValueError(f"sweep: the policies are defined with different optimizers {sorted(map(str, own))}; "
                             "pass optimizer= to compare them with one")
        optimizer = own.pop()
    opt = resolve_optimizer(optimizer, set_lrs[0] if set_lrs else None, u_max, task)
    local, inner_opt, steps = local_setup([schedules[(p, s)] for p, s, _, _ in configs], task, inner_optimizer)
    opt = streaming_outer(opt, local)
    n = len(configs)
    seed_arr = jnp.asarray([s for _, s, _, _ in configs], jnp.int32)
    consts = {
        "data_key": jax.vmap(lambda s: core.keys(s)[1])(seed_arr),
        "rule": jnp.asarray([distinct_rules.index(r) for _, _, r, _ in configs], jnp.int32),
    }
    if local is not None:
        consts["steps"] = jnp.asarray(steps)        # [B, λ]
    carry = core.init_carry_batched(task, [s for _, s, _, _ in configs], opt, ring,
                                    lrs=[v for *_, v in configs], inner=inner_opt,
                                    num_workers=next(iter(schedules.values())).num_workers,
                                    streaming=local is not None and local.streaming)
    rates = [v if v is not None else learning_rate(opt, jax.tree.map(lambda a, i=i: a[i], carry.opt_state))
             for i, (*_, v) in enumerate(configs)]
    metrics0 = jax.device_get(core.evaluate_batched(task, carry.params))
    rows = [[_history_row(0, plans[i], math.nan, {k: v[i] for k, v in metrics0.items()})] for i in range(n)]
    train_loss = [np.full(p.num_updates, np.nan) for p in plans]
    status = ["complete"] * n
    final_params = [None] * n
    num_chunks = plans[0].num_chunks
    bar = tqdm(total=num_chunks * chunk, unit="upd", disable=not progress, desc=f"sweep x{n}", leave=False)
    data_keys = [core.keys(s)[1] for _, s, _, _ in configs]

    def inputs(k):
        parts = [chunk_inputs(task, p, k, key) for p, key in zip(plans, data_keys)]
        index = None if parts[0][2] is None else np.stack([x[2] for x in parts], axis=1)   # [K, B, C, μ]
        return parts[0][0], np.stack([x[1] for x in parts], axis=1), index                # packed [K, B, 5, C]

    nxt = inputs(0)
    try:
        for k in range(num_chunks):
            carry, losses = core.run_chunk_batched(task, carry, nxt, consts, opt=opt.tx, rules=distinct_rules,
                                                   local=local)
            if k + 1 < num_chunks:
                nxt = inputs(k + 1)
            xs = {"mask": np.stack([p.chunk_view(k)["mask"] for p in plans])}
            losses = np.swapaxes(np.asarray(losses), 0, 1)  # [B, K, C]
            metrics = jax.device_get(core.evaluate_batched(task, carry.params))
            params_host = None
            lo = k * chunk
            for i, p in enumerate(plans):
                if status[i] != "complete" or lo >= p.num_updates:
                    continue
                hi = min(lo + chunk, p.num_updates)
                mask = xs["mask"][i]
                per_update = _update_losses(losses[i], mask)[: hi - lo]
                train_loss[i][lo:hi] = per_update
                if _first_nonfinite(losses[i], mask) is not None:
                    status[i] = "diverged"
                    continue
                rows[i].append(_history_row(hi, p, float(np.mean(per_update)), {m: v[i] for m, v in metrics.items()}))
                if hi == p.num_updates:
                    params_host = params_host if params_host is not None else jax.device_get(carry.params)
                    final_params[i] = jax.tree.map(lambda a: a[i], params_host)
            bar.update(chunk)
    finally:
        bar.close()
    if any(fp is None for fp in final_params):
        params_host = jax.device_get(carry.params)
        final_params = [fp if fp is not None else jax.tree.map(lambda a: a[i], params_host)
                        for i, fp in enumerate(final_params)]
    results = []
    task_config = task.config()
    for i, (pol, s, rule, alpha) in enumerate(configs):
        sched = schedules[(pol, s)]
        cfg = dict(task_config, lr=rates[i], lr_rule=rule.describe(),
                   optimizer=opt.describe(), seed=s, policy=sched.policy, cluster=sched.cluster,
                   workers=sched.num_workers, eval_every=chunk, sweep=True)
        if local is not None:
            cfg.update(inner_optimizer=inner_opt.describe(), local_steps=[int(h) for h in steps[i]])
        results.append(Result(_frame(rows[i]), sched, final_params[i], cfg, train_loss[i], status[i]))
    return results


# -- checkpoints -------------------------------------------------------------------
def _save_checkpoint(path: Path, carry, rows, train_loss, next_chunk: int, fp: str, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    leaves = jax.device_get(jax.tree.leaves(carry))
    tmp = path / "carry.tmp.npz"
    np.savez(tmp, *leaves)
    meta = {"version": CHECKPOINT_VERSION, "next_chunk": next_chunk, "fingerprint": fp,
            "config": {k: config[k] for k in ("task", "lr", "lr_rule", "optimizer", "seed", "eval_every")},
            "rows": rows, "train_loss": [None if not np.isfinite(x) else float(x) for x in train_loss]}
    (path / "state.tmp.json").write_text(json.dumps(meta))
    tmp.replace(path / "carry.npz")  # atomic renames: a crash leaves the previous checkpoint
    (path / "state.tmp.json").replace(path / "state.json")


def _load_checkpoint(path: Path, template, fp: str, config: dict):
    state_file = path / "state.json"
    if not state_file.exists():
        raise FileNotFoundError(f"checkpoint = {str(path)!r}: no state.json there to resume from")
    meta = json.loads(state_file.read_text())
    if meta.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"checkpoint version {meta.get('version')!r} is not supported")
    if meta["fingerprint"] != fp:
        raise ValueError(f"checkpoint = {str(path)!r} was written for a different schedule; cannot resume")
    want = {k: config[k] for k in meta["config"]}
    if want != meta["config"]:
        raise ValueError(f"checkpoint = {str(path)!r} was written with {meta['config']}, not {want}")
    with np.load(path / "carry.npz") as z:
        leaves = [z[f"arr_{i}"] for i in range(len(z.files))]
    treedef = jax.tree.structure(template)
    carry = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    train_loss = np.array([np.nan if x is None else x for x in meta["train_loss"]], np.float64)
    return carry, meta["rows"], train_loss, int(meta["next_chunk"])
