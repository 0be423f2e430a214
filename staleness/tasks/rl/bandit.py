"""rl-bandit: a contextual bandit whose expected policy gradient is known in closed form.

N contexts x_n ∈ R^d are the prompts, the K arms are the tokens, and the policy is linear softmax,
π(a | x) = softmax(x·W)_a. The reward table is deterministic, from the seed: r(x_n, ·) = the
min-max normalised scores x_n·U (U ~ N(0, 1)), so rewards lie in [0, 1], every context's best arm
has reward 1 and is linearly realisable (greedy reward 1 is reachable). A rollout is a sequence of
length T = 1: G arms sampled per context. Each prompt still has a long-tailed decode length
(`task.lengths`; default `DEFAULT_LENGTHS`), used only for timing.

Float64 NumPy references, for exact numerics tests of the objectives: `policy_gradient` (closed
form), `expected_gradient` (every one of a group's K^G joint outcomes enumerated) and
`enumerated` (the same outcomes as JAX rollouts, to average the task's own `jax.grad(task.loss)`
over). With the group-mean baseline the expected gradient is not the textbook one: on-policy it
is −(1 − 1/G) · policy_gradient for every objective (the mean includes the sample itself);
off-policy the clip makes it piecewise, hence the enumeration.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks.rl import lengths as _lengths
from staleness.tasks.rl.base import PyTree, RLTask, Rollout
from staleness.tasks.rl.builders import Policy, PromptSet, check_int, from_functions
from staleness.tasks.rl.objectives import ADV_EPS

__all__ = ["NAME", "DEFAULT_LENGTHS", "rl_bandit", "probs", "policy_gradient", "expected_gradient",
           "expected_reward", "enumerated", "MAX_OUTCOMES"]

NAME = "rl-bandit"
DEFAULT_LENGTHS = _lengths.LogNormal(median=128.0, sigma=1.0, high=1024)
"""Decode lengths (tokens, timing only) of the bandit's prompts."""
PROMPT_SALT = 11
MAX_OUTCOMES = 1 << 16
"""The most joint outcomes (K^G) `expected_gradient` enumerates per prompt."""


@functools.lru_cache(maxsize=None)
def _fns(dim: int, arms: int, init_scale: float):
    """(jitted init_fn, logits_fn, reward_fn), shared by bandits of one shape (one compile)."""

    def init_fn(key: jax.Array) -> PyTree:
        return {"W": init_scale * jax.random.normal(key, (dim, arms), jnp.float32)}

    def logits_fn(params: PyTree, prompt: PyTree, completion: jax.Array) -> jax.Array:
        del completion   # one action: nothing to condition on
        return (prompt["x"] @ params["W"])[None, :]                   # [T = 1, K]

    def reward_fn(prompt: PyTree, completion: jax.Array, length: jax.Array) -> jax.Array:
        del length
        return prompt["r"][completion[0]]

    return jax.jit(init_fn), logits_fn, reward_fn


def rl_bandit(num_workers: int = 4, objective: str = "decoupled_ppo", seed: int = 0, *, num_prompts: int = 64,
              dim: int = 8, arms: int = 4, group_size: int = 4, prompts_per_rollout: int = 8,
              length_rule: Any = DEFAULT_LENGTHS, init_scale: float = 0.01, actor_dtype: str = "float32",
              **objective_params: Any) -> RLTask:
    """rl-bandit (see the module docstring).

    Args:
      num_workers: actors.
      objective: one of OBJECTIVES; **objective_params its parameters (eps, c, std_advantages).
      seed: seed of the contexts, the reward table and the decode lengths.
      num_prompts, dim, arms: N contexts of dimension d, K arms.
      group_size: G arms sampled per context per rollout (>= 2).
      prompts_per_rollout: B contexts per rollout.
      length_rule: decode lengths for timing (tokens; default lognormal, median 128, max 1024).
      init_scale: std of the initial W (0.01: a near-uniform policy).
      actor_dtype: the precision the actors sample in (`staleness.tasks.rl.RLTask`).
    """
    num_prompts = check_int("num_prompts", num_prompts, 1, "contexts")
    dim = check_int("dim", dim, 1, "context dimension")
    arms = check_int("arms", arms, 2, "arms")
    seed = check_int("seed", seed, 0, "seed of the contexts, rewards and lengths")
    if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or not 0 <= init_scale < np.inf:
        raise ValueError(f"init_scale = {init_scale!r} must be a number >= 0 (std of the initial W)")
    rng = np.random.default_rng(np.random.SeedSequence([seed, PROMPT_SALT]))
    x = rng.standard_normal((num_prompts, dim)).astype(np.float32)                     # [N, d]
    scores = x.astype(np.float64) @ rng.standard_normal((dim, arms))                   # [N, K]
    span = scores.max(1, keepdims=True) - scores.min(1, keepdims=True)
    r = ((scores - scores.min(1, keepdims=True)) / span).astype(np.float32)             # [N, K] in [0, 1]
    init_fn, logits_fn, reward_fn = _fns(dim, arms, float(init_scale))
    options = (("num_prompts", num_prompts), ("dim", dim), ("arms", arms), ("length_rule", str(length_rule)),
               ("init_scale", float(init_scale)), ("actor_dtype", actor_dtype))
    return from_functions(Policy(init_fn, logits_fn, max_length=1),
                          PromptSet({"x": x, "r": r}, _lengths.constant(1), decode_length_rule=length_rule),
                          reward_fn, objective=objective, name=NAME, num_workers=num_workers, group_size=group_size,
                          prompts_per_rollout=prompts_per_rollout, seed=seed, reward_range=(0.0, 1.0),
                          options=options, actor_dtype=actor_dtype, **objective_params)


# -- Float64 references ------------------------------------------------------------------------


def probs(params: PyTree, x: np.ndarray) -> np.ndarray:
    """[..., K] float64 π(· | x) of the linear softmax policy."""
    logits = np.asarray(x, np.float64) @ np.asarray(params["W"], np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _table(task: RLTask, prompt_idx: Any) -> tuple[np.ndarray, np.ndarray]:
    idx = np.asarray(prompt_idx).reshape(-1)
    return np.asarray(task.prompts["x"], np.float64)[idx], np.asarray(task.prompts["r"], np.float64)[idx]


def expected_reward(task: RLTask, params: PyTree, prompt_idx: Any = None) -> float:
    """mean_b Σ_a π(a | x_b) r(x_b, a) (float64; all prompts when prompt_idx is None)."""
    x, r = _table(task, np.arange(task.num_prompts) if prompt_idx is None else prompt_idx)
    return float(np.mean(np.sum(probs(params, x) * r, -1)))


def policy_gradient(task: RLTask, params: PyTree, prompt_idx: Any) -> dict[str, np.ndarray]:
    """{"W": [d, K]} float64 ∇_W mean_b E_{a~π}[r(x_b, a)] = mean_b x_b ⊗ π_b ⊙ (r_b − π_b·r_b)."""
    x, r = _table(task, prompt_idx)
    p = probs(params, x)                                                   # [B, K]
    g = p * (r - np.sum(p * r, -1, keepdims=True))                         # [B, K]
    return {"W": x.T @ g / len(x)}


def _outcomes(arms: int, group: int) -> np.ndarray:
    """[K^G, G] every joint outcome of a group of G arms."""
    if arms ** group > MAX_OUTCOMES:
        raise ValueError(f"arms ** group_size = {arms}^{group} outcomes is more than MAX_OUTCOMES = {MAX_OUTCOMES} "
                         "to enumerate; use fewer arms or a smaller group")
    return np.array(list(itertools.product(range(arms), repeat=group)), np.int64).reshape(-1, group)


def expected_gradient(task: RLTask, params: PyTree, prompt_idx: Any, *, behavior_params: PyTree = None,
                      prox_params: PyTree = None) -> dict[str, np.ndarray]:
    """{"W": [d, K]} float64 E[∇_W task.loss(params, rollout, prox_logp)] over the rollouts of
    prompts `prompt_idx` that `behavior_params` samples (default: params, on-policy), with
    π_prox = prox_params (default: the behavior policy, as `loss` with prox_logp=None).

    Exact: each prompt's K^G joint outcomes are enumerated with probability Π_i β(a_i); the
    per-sample gradient is coef_i · x ⊗ (e_{a_i} − π_θ(·|x)) with coef_i the objective's own
    float64 reference (`ObjectiveSpec.reference`; T = 1: a sequence's ratio is its token's).
    The loss is −(1/(B G)) Σ_b Σ_i, so the result is the mean over prompts. An objective
    without a reference: ValueError.
    """
    obj = dict(task.objective.params)
    name, g = task.objective.name, task.group_size
    reference = task.objective.reference
    if reference is None:
        raise ValueError(f"objective {name!r} has no float64 reference (register it with reference=...); the "
                         "exact expected gradient needs one")
    x, r = _table(task, prompt_idx)
    behavior_params = params if behavior_params is None else behavior_params
    prox_params = behavior_params if prox_params is None else prox_params
    p_new, p_beh, p_prox = probs(params, x), probs(behavior_params, x), probs(prox_params, x)   # [B, K]
    arms = p_new.shape[-1]
    a = _outcomes(arms, g)                                                     # [M, G]
    onehot = np.eye(arms)[a]                                                   # [M, G, K]
    grad = np.zeros((x.shape[1], arms))
    for b in range(len(x)):
        weight = np.prod(p_beh[b][a], axis=-1)                                 # [M]
        rew = r[b][a]                                                          # [M, G]
        adv = rew - rew.mean(-1, keepdims=True)
        if obj["std_advantages"]:
            adv = adv / (rew.std(-1, keepdims=True) + ADV_EPS)
        rho = p_new[b][a] / p_beh[b][a]                                        # [M, G]
        coef = reference(adv, rho, p_new[b][a] / p_prox[b][a], p_prox[b][a] / p_beh[b][a], **obj)
        dlogits = -np.einsum("m,mg,mgk->k", weight, coef, onehot - p_new[b]) / g      # [K]
        grad += np.outer(x[b], dlogits)
    return {"W": grad / len(x)}


def enumerated(task: RLTask, behavior_params: PyTree, prompt: int) -> tuple[Rollout, np.ndarray]:
    """Every joint outcome of one group of prompt `prompt` as M = K^G rollouts of one prompt
    (fields with a leading axis M: tokens [M, 1, G, 1], ...; behavior log-probs from
    `task.logp(behavior_params, ·)`), and their probabilities [M] float64 under behavior_params.
    Σ_m p_m ∇task.loss(params, rollout_m) is the exact expected gradient of that prompt."""
    a = _outcomes(int(np.shape(task.prompts["r"])[1]), task.group_size)      # [M, G]
    m, g = a.shape
    r = np.asarray(task.prompts["r"])[prompt][a]                               # [M, G]
    tokens = jnp.asarray(a.reshape(m, 1, g, 1), jnp.int32)
    ones = jnp.ones((m, 1, g, 1), jnp.float32)
    rollouts = Rollout(prompt_idx=jnp.full((m, 1), prompt, jnp.int32), tokens=tokens, logp=jnp.zeros_like(ones),
                       mask=ones, rewards=jnp.asarray(r.reshape(m, 1, g), jnp.float32),
                       lengths=jnp.ones((m, 1), jnp.int32))
    logp = jax.vmap(task.logp, (None, 0))(behavior_params, rollouts)
    weight = np.prod(probs(behavior_params, np.asarray(task.prompts["x"])[prompt])[a], axis=-1)
    return rollouts._replace(logp=logp), weight
