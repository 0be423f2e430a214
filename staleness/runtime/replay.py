"""Replay a recorded trace in the engine and compare with the real run.

On CPU the replay (slot_mode='map') reproduces the recorded run's final parameters
bit for bit (the same compiled per-gradient function and server update on the same
gradients in the same order), given the recording process's CPU device
configuration (a process with 8 virtual CPU devices replayed a one-device rl-digits
run to within 3e-8, not bitwise). On GPUs compare with a tolerance.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

__all__ = ["replay_trace", "Comparison", "compare_params"]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Final parameters of a replay vs the recorded run."""

    bitwise: bool
    max_abs_diff: float   # over all leaves (inf if the structures differ)

    def within(self, tolerance: float) -> bool:
        return self.bitwise or self.max_abs_diff <= tolerance


def _check_shapes(task, recorded, cfg) -> None:
    """The task's parameters must have the recorded run's structure and shapes: another model
    would train on the schedule and be compared leaf by leaf with nothing it relates to."""
    import jax

    want = [tuple(np.shape(x)) for x in jax.tree.leaves(recorded.params)]
    got = [tuple(x.shape) for x in jax.tree.leaves(jax.eval_shape(task.init_params, jax.random.key(0)))]
    if want != got:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has other parameters ({sum(map(np.prod, got)):.0f} "
                         f"values in {len(got)} arrays) than the recorded run's task {cfg.get('task')!r} "
                         f"({sum(map(np.prod, want)):.0f} in {len(want)}); replay with the task the run was "
                         "recorded with")


def compare_params(a, b) -> Comparison:
    import jax

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb) or any(np.shape(x) != np.shape(y) for x, y in zip(la, lb)):
        return Comparison(False, float("inf"))
    bitwise = all(np.array_equal(x, y) for x, y in zip(la, lb))
    diff = max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                for x, y in zip(la, lb) if np.size(x)), default=0.0)
    return Comparison(bitwise, diff)


def _rebuild(name: str, cfg: dict, num_workers: int, batch_size, data_dir):
    """The task `name` for a replay of a run whose config is `cfg`: the recorded task rebuilt
    from its config, or another task named by the caller, built with its defaults (the
    parameter check then says whether it is the recorded run's). ValueError in one line
    when the task kinds (RL, supervised) differ or a rebuilt task differs from the recorded one."""
    import staleness as st

    recorded = cfg.get("task")
    rl_run = "objective" in cfg
    if name != recorded:
        task = st.tasks.get(name, num_workers=num_workers, data_dir=data_dir)
        if st.tasks.rl.is_task(task) != rl_run:
            kind = "an RL run (rollouts, an objective)" if rl_run else "a supervised run (gradients of minibatches)"
            raise ValueError(f"the recorded run is {kind} on task {recorded!r}; task {name!r} is "
                             f"{'an RL' if st.tasks.rl.is_task(task) else 'a supervised'} task: replay with the "
                             "task the run was recorded with")
        return task
    if rl_run and name in st.tasks.rl.NAMES:
        return st.tasks.rl.from_config(cfg, num_workers)
    if rl_run:   # the user's own RL task: its factory, called as the run called it
        task = st.tasks.get(name, num_workers=num_workers, seed=int(cfg.get("task_seed") or 0),
                            **(cfg.get("task_options") or {}))
        got = task.config()
        for key in ("objective", "objective_params", "group_size", "prompts_per_rollout", "max_length"):
            if key in cfg and got.get(key) != cfg[key]:
                raise ValueError(f"task {name!r} rebuilt by its factory has {key} = {got.get(key)!r}, the recorded run "
                                 f"had {cfg[key]!r}; pass the task itself, or the options it was built with "
                                 "(--task-option)")
        return task
    return st.tasks.get(name, batch_size=int(batch_size or cfg.get("batch_size") or 32), num_workers=num_workers,
                        partition=cfg.get("partition", "iid"), seed=int(cfg.get("task_seed") or 0),
                        data_dir=data_dir, **(cfg.get("task_options") or {}))


def replay_trace(trace, task=None, *, lr=None, lr_rule=None, optimizer=None, seed=None, batch_size=None,
                 data_dir=None, **replay_kwargs):
    """Replay `trace` in the engine with slot_mode='map'.

    Args:
      trace: a `Result` of a real run, a Result directory, a `Schedule`, or a schedule JSON file.
      task, lr, lr_rule, optimizer, seed, batch_size: default to the Result's config;
        a bare Schedule needs `task`.
    Returns: (replay Result, Comparison with the recorded parameters or None).
    """
    import staleness as st
    from staleness.tasks.optim import TASK_OPTAX
    from staleness.engine.result import Result
    from staleness.schedule import Schedule

    recorded = None
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        if path.is_dir():
            trace = Result.load(path)
        elif path.is_file():
            try:
                trace = Schedule.load(path)
            except (ValueError, KeyError) as e:
                raise ValueError(f"trace = {str(path)!r} is not a schedule JSON file ({e})") from None
        else:
            raise FileNotFoundError(f"trace = {str(path)!r}: no such Result directory or schedule file")
    if isinstance(trace, Result):
        recorded, sched, cfg = trace, trace.schedule, dict(trace.config)
    elif isinstance(trace, Schedule):
        sched, cfg = trace, {}
    else:
        raise ValueError(f"trace = {trace!r} must be a Result, a Schedule or a path to one")
    task = task if task is not None else cfg.get("task")
    if task is None:
        raise ValueError("task is required to replay a bare trace (it has no config)")
    if isinstance(task, str):
        task = _rebuild(task, cfg, sched.num_workers, batch_size, data_dir)
    if recorded is not None:
        _check_shapes(task, recorded, cfg)
    if optimizer is None and cfg.get("optimizer") == "optax":
        raise ValueError("the recorded run used an optax optimizer object; replay it from Python with "
                         "optimizer=<the same optax transformation>")
    if cfg.get("inner_optimizer") and "inner_optimizer" not in replay_kwargs:
        replay_kwargs["inner_optimizer"] = cfg["inner_optimizer"]
    recorded_opt = cfg.get("optimizer", "sgd")
    if recorded_opt == TASK_OPTAX:   # the task's own optax object: the task built again has it
        recorded_opt = None
    kw = dict(lr=lr if lr is not None else cfg.get("lr"),
              lr_rule=lr_rule or cfg.get("lr_rule", "constant"),
              optimizer=optimizer if optimizer is not None else recorded_opt,
              seed=seed if seed is not None else cfg.get("seed", sched.seed or 0))
    if cfg.get("sync"):   # how the recorded run executed (collective: its sums in another order)
        replay_kwargs["config"] = {**replay_kwargs.get("config", {}), "recorded_sync": cfg["sync"]}
    if "eval_every" not in replay_kwargs and cfg.get("eval_every"):
        replay_kwargs["eval_every"] = int(cfg["eval_every"])
    if replay_kwargs.get("progress") is True and hasattr(task, "estimate_note") and sched.num_updates:
        note = task.estimate_note(sched.num_updates, rollouts_per_update=max(
            1, round(int(sched.applied.sum()) / sched.num_updates)))
        if note:   # a long RL replay says so before it starts
            print(note, file=sys.stderr, flush=True)
    rep = st.engine.replay(sched, task, slot_mode="map", **kw, **replay_kwargs)
    return rep, (compare_params(recorded.params, rep.params) if recorded is not None else None)
