"""`from_functions`: an `RLTask` from the user's own policy, prompt set, reward and length rule.

    task = rl.from_functions(
        rl.Policy(init_fn=lambda key: {"w": 0.01 * jax.random.normal(key, (d, k))},
                  logits_fn=lambda params, prompt, completion: (prompt["x"] @ params["w"])[None],   # [T=1, K]
                  max_length=1),
        rl.PromptSet(prompts={"x": x, "r": r}, length_rule=rl.lengths.constant(1)),
        reward_fn=lambda prompt, completion, length: prompt["r"][completion[0]],                 # scalar
        objective="tis", c=2.0)

Every argument is checked here, at construction, with a one-line `staleness.tasks.TaskError`
naming it; the model's shapes with `jax.eval_shape` (no FLOPs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks import metrics as _metrics
from staleness.tasks.errors import TaskError
from staleness.tasks.rl import lengths as _lengths
from staleness.tasks.rl import objectives
from staleness.tasks.rl.base import ACTOR_DTYPES, PyTree, RLTask

__all__ = ["Policy", "PromptSet", "from_functions", "check_int", "LENGTH_SALT", "EVAL_LENGTH_SALT", "DECODE_SALT"]

LENGTH_SALT, EVAL_LENGTH_SALT, DECODE_SALT = 1, 2, 3
"""Streams of numpy.random.SeedSequence([seed, salt]) the length rules draw from."""


def check_int(name: str, value: Any, low: int, what: str) -> int:
    """`value` as an int >= low, else a TaskError naming `name` and saying what it is."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise TaskError(f"{name} = {value!r} must be an int >= {low} ({what})")
    return int(value)


def _host_prompts(prompts: Any, what: str) -> PyTree:
    leaves = jax.tree.leaves(prompts)
    if not leaves:
        raise TaskError(f"{what} must be a pytree of arrays with one row per prompt; got {prompts!r}")

    def frozen(a):
        a = np.array(a)
        a.flags.writeable = False
        return a

    out = jax.tree.map(frozen, prompts)
    sizes = {int(np.shape(a)[0]) if np.ndim(a) else -1 for a in jax.tree.leaves(out)}
    if len(sizes) != 1 or -1 in sizes or 0 in sizes:
        raise TaskError(f"{what}: every array needs the same leading axis >= 1 (one row per prompt); got "
                        f"shapes {[np.shape(a) for a in jax.tree.leaves(out)]}")
    return out


def _one(prompts: PyTree) -> PyTree:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), prompts)


def _check_model(init_fn, logits_fn, reward_fn, prompts: PyTree, max_length: int, name: str = "logits_fn") -> int:
    """Shapes of init_fn, logits_fn (called `name`) and reward_fn with `jax.eval_shape`;
    returns the vocabulary V."""
    for arg, f in (("init_fn", init_fn), (name, logits_fn), ("reward_fn", reward_fn)):
        if not callable(f):
            raise TaskError(f"{arg} must be a function; got a {type(f).__name__}")
    try:
        params = jax.eval_shape(init_fn, jax.random.key(0))
    except Exception as e:   # the user's code: report it against the argument, in one line
        raise TaskError(f"init_fn(key) failed: {_first_line(e)}") from e
    prompt = _one(prompts)
    completion = jax.ShapeDtypeStruct((max_length,), jnp.int32)
    try:
        logits = jax.eval_shape(logits_fn, params, prompt, completion)
    except Exception as e:
        raise TaskError(f"{name} failed on a completion of max_length = {max_length} tokens (is max_length "
                        f"longer than the model's context?): {_first_line(e)}") from e
    if (not hasattr(logits, "shape") or len(logits.shape) != 2 or logits.shape[0] != max_length
            or logits.shape[1] < 2 or not jnp.issubdtype(logits.dtype, jnp.floating)):
        raise TaskError(f"{name}(params, prompt, completion [{max_length}]) must return float logits "
                        f"[{max_length}, V] with V >= 2 (row t: the distribution of token t); got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)} {getattr(logits, 'shape', '')}")
    try:
        reward = jax.eval_shape(reward_fn, prompt, completion, jax.ShapeDtypeStruct((), jnp.int32))
    except Exception as e:
        raise TaskError(f"reward_fn(prompt, completion [{max_length}], length) failed: {_first_line(e)}") from e
    if not hasattr(reward, "shape") or reward.shape != () or not (
            jnp.issubdtype(reward.dtype, jnp.floating) or jnp.issubdtype(reward.dtype, jnp.integer)):
        raise TaskError(f"reward_fn(prompt, completion [{max_length}], length) must return one scalar reward per "
                        f"completion (shape ()); got {getattr(reward, 'dtype', type(reward).__name__)} "
                        f"{getattr(reward, 'shape', '')}")
    return int(logits.shape[1])


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _reward_range(reward_range: Any) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError):
        raise TaskError(f"reward_range = {reward_range!r} must be (low, high), the range rewards lie in") from None
    if not low < high or math.isnan(low) or math.isnan(high):
        raise TaskError(f"reward_range = {reward_range!r} must have low < high")
    return low, high


class Policy(NamedTuple):
    """The user's policy model, as functions per item (no prompt or group axis; the task vmaps).

    init_fn: key -> params (a pytree of float arrays).
    logits_fn: (params, prompt, completion [T] int32) -> logits [T, V], causal: row t is the
      distribution of completion token t given the prompt and completion[:t] (see
      `staleness.tasks.rl.decode`). Sampling and the learner's log-probs both use it.
    max_length: T, the completion positions the policy's context holds (the rollouts' T axis).
    pad_token: token id stored past each completion's length (need not be in the vocabulary).
    init_cache, step: optional, a KV-cached decode of the same policy (both or neither; see
      `staleness.tasks.rl.decode.sample_cached`): init_cache(params, prompt, completion [T],
      upto) -> (logits [V] of completion position `upto`, cache) encodes the prompt and the
      first `upto` tokens; step(params, cache, token, t) -> (logits [V] of position t + 1,
      cache) appends completion token t. The learner's log-probs stay logits_fn's.
    """

    init_fn: Callable[[jax.Array], PyTree]
    logits_fn: Callable[[PyTree, PyTree, jax.Array], jax.Array]
    max_length: int
    pad_token: int = 0
    init_cache: Callable | None = None
    step: Callable | None = None


class PromptSet(NamedTuple):
    """The prompts and how long their completions are.

    prompts: a pytree of host arrays with leading axis N (one row per prompt).
    length_rule: (prompts, rng) -> [N] int completion lengths in [1, max_length], drawn once at
      construction from numpy.random.SeedSequence([seed, 1]); see `staleness.tasks.rl.lengths`.
    eval_prompts: held-out prompts for `evaluate` (None: the training prompts); their lengths
      come from the same rule (stream [seed, 2]).
    decode_length_rule: the tokens each prompt decodes for timing when the numerics generate
      fewer (the bandit); None: the completion lengths. Stream [seed, 3].
    """

    prompts: PyTree
    length_rule: Callable[[PyTree, np.random.Generator], Any]
    eval_prompts: PyTree = None
    decode_length_rule: Callable | None = None


def from_functions(policy: Policy, prompt_set: PromptSet,
                   reward_fn: Callable[[PyTree, jax.Array, jax.Array], jax.Array], *,
                   objective: str = "decoupled_ppo", name: str = "rl-custom", num_workers: int = 4,
                   group_size: int = 4, prompts_per_rollout: int = 8, seed: int = 0, eval_samples: int = 4,
                   reward_range: tuple[float, float] = (-math.inf, math.inf), options: tuple = (),
                   optimizer: Any = None, prefill: float = 0.0, actor_dtype: str = "float32",
                   actor_logits_fn: Callable | None = None, **objective_params: Any) -> RLTask:
    """An `RLTask` from the user's policy functions, prompt set, reward function and length rule.

    Args:
      policy: a `Policy` (init_fn, logits_fn, max_length, pad_token).
      prompt_set: a `PromptSet` (prompts, length_rule, eval_prompts, decode_length_rule).
      reward_fn: (prompt, completion [T] int32, length int32 scalar) -> scalar reward, per item;
        positions >= length hold pad_token.
      objective: a registered objective (`objectives.make`); **objective_params its parameters.
      name, num_workers, group_size (>= 2), prompts_per_rollout, seed, eval_samples, options,
        optimizer, prefill, actor_dtype: the `RLTask` attributes.
      reward_range: (low, high) of rewards, recorded with the metrics.
      actor_logits_fn: the actors' own implementation of the same policy (the signature of
        `policy.logits_fn`, checked likewise); None: the policy's.

    Returns:
      The RLTask.
    """
    if not isinstance(policy, Policy):
        raise TaskError(f"policy must be a staleness.tasks.rl.Policy(init_fn, logits_fn, max_length); got "
                        f"{type(policy).__name__}")
    if not isinstance(prompt_set, PromptSet):
        raise TaskError(f"prompt_set must be a staleness.tasks.rl.PromptSet(prompts, length_rule); got "
                        f"{type(prompt_set).__name__}")
    if not isinstance(name, str) or not name.strip():
        raise TaskError(f"name = {name!r} must be a non-empty string (the task's name)")
    num_workers = check_int("num_workers", num_workers, 1, "actors")
    group_size = check_int("group_size", group_size, 2, "completions per prompt; the group baseline needs two")
    prompts_per_rollout = check_int("prompts_per_rollout", prompts_per_rollout, 1, "prompts per rollout")
    max_length = check_int("max_length", policy.max_length, 1, "completion positions of the policy's context")
    seed = check_int("seed", seed, 0, "seed of the length draws and the evaluation key")
    eval_samples = check_int("eval_samples", eval_samples, 1, "completions per held-out prompt in evaluate")
    pad_token = check_int("pad_token", policy.pad_token, 0, "token id past each completion's length")
    try:
        objective_value = objectives.make(objective, **objective_params)
    except ValueError as e:
        raise TaskError(str(e)) from None
    prompts = _host_prompts(prompt_set.prompts, "prompts")
    eval_prompts = prompts if prompt_set.eval_prompts is None else _host_prompts(prompt_set.eval_prompts,
                                                                                  "eval_prompts")
    completion_lengths, eval_lengths, decode_lengths = _draw_lengths(prompt_set, prompts, eval_prompts, max_length,
                                                                     seed)
    _check_model(policy.init_fn, policy.logits_fn, reward_fn, prompts, max_length)
    if actor_dtype not in ACTOR_DTYPES:
        raise TaskError(f"actor_dtype = {actor_dtype!r} must be one of {', '.join(ACTOR_DTYPES)} (the precision the "
                        "actors sample in)")
    if actor_logits_fn is not None:
        _check_model(policy.init_fn, actor_logits_fn, reward_fn, prompts, max_length, "actor_logits_fn")
    _check_cache(policy, prompts, max_length)
    low, high = _reward_range(reward_range)
    metrics = tuple(_metrics.Metric(m, "higher", low, high).validate() for m in RLTask.metric_names)
    return RLTask(name=name, num_workers=num_workers, group_size=group_size, prompts_per_rollout=prompts_per_rollout,
                  max_length=max_length, seed=seed, objective=objective_value, init_fn=policy.init_fn,
                  logits_fn=policy.logits_fn, reward_fn=reward_fn, prompts=prompts,
                  completion_lengths=completion_lengths, lengths=decode_lengths, eval_prompts=eval_prompts,
                  eval_lengths=eval_lengths, eval_samples=eval_samples, pad_token=pad_token, metrics=metrics,
                  options=tuple(options), optimizer=optimizer, prefill=_prefill(prefill), actor_dtype=actor_dtype,
                  actor_logits_fn=actor_logits_fn, init_cache=policy.init_cache, step=policy.step)


def _check_cache(policy: "Policy", prompts: PyTree, max_length: int) -> None:
    """A KV-cached decode's functions: both or neither, and their shapes (`jax.eval_shape`)."""
    if (policy.init_cache is None) != (policy.step is None):
        raise TaskError("init_cache and step come together (a KV-cached decode); give both or neither")
    if policy.init_cache is None:
        return
    params = jax.eval_shape(policy.init_fn, jax.random.key(0))
    completion = jax.ShapeDtypeStruct((max_length,), jnp.int32)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    try:
        logits, cache = jax.eval_shape(policy.init_cache, params, _one(prompts), completion, scalar)
        logits2, cache2 = jax.eval_shape(policy.step, params, cache, scalar, scalar)
    except Exception as e:
        raise TaskError(f"init_cache(params, prompt, completion, upto) / step(params, cache, token, t) failed: "
                        f"{_first_line(e)}") from e
    if getattr(logits, "ndim", None) != 1 or getattr(logits2, "shape", None) != logits.shape:
        raise TaskError(f"init_cache and step must return (logits [V], cache) with the same V; got "
                        f"{getattr(logits, 'shape', logits)} and {getattr(logits2, 'shape', logits2)}")
    if jax.tree.structure(cache) != jax.tree.structure(cache2) or any(
            a.shape != b.shape or a.dtype != b.dtype for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(cache2))):
        raise TaskError("step(params, cache, token, t) must return a cache of the shapes init_cache returns")


def _prefill(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value < math.inf):
        raise TaskError(f"prefill = {value!r} must be a finite number >= 0 (a prompt's simulated cost in decoded "
                        "tokens)")
    return float(value)


def _draw_lengths(prompt_set: PromptSet, prompts: PyTree, eval_prompts: PyTree, max_length: int, seed: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(completion lengths [N], eval lengths [E], decode lengths [N]), each checked (TaskError)."""
    try:
        completion = _lengths.draw(prompt_set.length_rule, prompts, _rng(seed, LENGTH_SALT), max_length,
                                   "length_rule")
        evaluation = (completion if eval_prompts is prompts else
                      _lengths.draw(prompt_set.length_rule, eval_prompts, _rng(seed, EVAL_LENGTH_SALT), max_length,
                                    "length_rule"))
        decode = (completion if prompt_set.decode_length_rule is None else
                  _lengths.draw(prompt_set.decode_length_rule, prompts, _rng(seed, DECODE_SALT), None,
                                "decode_length_rule"))
    except TaskError:
        raise
    except ValueError as e:
        raise TaskError(str(e)) from None
    return completion, evaluation, decode


def _rng(seed: int, salt: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, salt]))
