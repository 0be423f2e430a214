"""RL tasks for data staleness (asynchronous RL): actors generate, a learner trains on stale rollouts.

    from staleness.tasks import rl
    task = rl.get("rl-digits", num_workers=4, objective="decoupled_ppo", seed=0, eps=0.2)
    params = task.init_params(jax.random.key(0))             # rl-digits: after a short supervised warm start
    idx = task.prompt_indices(seed, actor, iteration)         # [B] prompts, counter-based
    rollout = task.generate(params_v, key, idx)               # tokens/logp/mask [B, G, T], rewards [B, G]
    grads = jax.grad(task.loss)(params_u, rollout, task.logp(params_prev, rollout))
    task.evaluate(params)                                     # {"reward", "greedy_reward"}
    task.decode_tokens(idx)                                   # tokens the batch decodes (timing)

Built-in names: rl-bandit (`bandit`), rl-digits (`digits`). Your own:
`from_functions(Policy(init_fn, logits_fn, max_length), PromptSet(prompts, length_rule), reward_fn)`.
Objectives: `objectives`. Length rules: `lengths`.
"""

from __future__ import annotations

import inspect
from typing import Any

from staleness.tasks.rl import bandit, decode, digits, lengths, objectives
from staleness.tasks.rl.base import RLTask, Rollout
from staleness.tasks.rl.builders import Policy, PromptSet, from_functions
from staleness.tasks.rl.objectives import OBJECTIVES, Objective

__all__ = ["OBJECTIVES", "NAMES", "Objective", "Policy", "PromptSet", "RLTask", "Rollout", "bandit", "decode",
           "digits", "from_functions", "get", "lengths", "names", "objectives", "builder", "from_config",
           "is_task"]

_BUILTINS = {bandit.NAME: bandit.rl_bandit, digits.NAME: digits.rl_digits}
NAMES = tuple(_BUILTINS)
"""The built-in RL task names."""


def names() -> tuple[str, ...]:
    """The built-in RL task names."""
    return NAMES


def is_task(task) -> bool:
    """Whether `task` is an RL task (an `RLTask`, or a built-in RL task name)."""
    return isinstance(task, RLTask) or (isinstance(task, str) and task in _BUILTINS)


def builder(name: str):
    """The factory of built-in RL task `name`, or None."""
    return _BUILTINS.get(name)


def from_config(cfg: dict, num_workers: int) -> RLTask:
    """The built-in RL task a Result's config records (`RLTask.config()`), built again for
    `num_workers` actors: name, seed, objective and its parameters, group size, prompts per
    rollout and the task's options. A length rule other than the default cannot be rebuilt
    from its text: ValueError (pass the task itself)."""
    name = cfg.get("task")
    if name not in _BUILTINS:
        raise ValueError(f"task = {name!r} is not a built-in RL task ({', '.join(NAMES)}); pass the task itself")
    options = {k: v for k, v in (cfg.get("task_options") or {}).items() if k != "length_rule"}
    task = get(name, num_workers=num_workers, objective=cfg["objective"], seed=int(cfg.get("task_seed") or 0),
               group_size=int(cfg["group_size"]), prompts_per_rollout=int(cfg["prompts_per_rollout"]),
               **dict(cfg.get("objective_params") or {}), **options)
    recorded = (cfg.get("task_options") or {}).get("length_rule")
    if recorded is not None and recorded != dict(task.options).get("length_rule"):
        raise ValueError(f"task {name!r} was built with length_rule = {recorded}, which cannot be rebuilt from its "
                         "text; pass the task itself")
    return task


def get(name: str, num_workers: int = 4, objective: str = "decoupled_ppo", seed: int = 0,
        **options: Any) -> RLTask:
    """The built-in RL task `name` for `num_workers` actors, trained with `objective`.

    Args:
      name: "rl-bandit" or "rl-digits".
      num_workers: actors.
      objective: a registered objective, or 'package.module:name' (`objectives.spec`).
      seed: seed of the prompts, their lengths and the evaluation key.
      **options: the objective's parameters (`objectives.make`) and the task's own options
        (`bandit.rl_bandit`, `digits.rl_digits`: group_size, prompts_per_rollout, num_prompts, ...).
    """
    if name not in _BUILTINS:
        raise ValueError(f"name = {name!r} is not a built-in RL task; valid: {', '.join(NAMES)} "
                         "(build your own with staleness.tasks.rl.from_functions)")
    factory = _BUILTINS[name]
    task_options = [p for p in inspect.signature(factory).parameters
                    if p not in ("options", "objective_params", "num_workers", "objective", "seed")]
    task_options += list(getattr(factory, "model_options", ()))
    objective_params = list(objectives.spec(objective).defaults)   # (imports a module:name objective)
    for key in options:
        if key not in task_options and key not in objective_params:
            raise ValueError(f"{key} = {options[key]!r} is not an option of {name!r}; valid: task options "
                             f"{', '.join(task_options)}; parameters of objective {objective!r} "
                             f"{', '.join(objective_params)}")
    return factory(num_workers=num_workers, objective=objective, seed=seed, **options)


def __dir__():
    return sorted(__all__)
