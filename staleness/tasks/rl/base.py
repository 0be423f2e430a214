"""The `RLTask` value: policy + prompts + reward + length rule + objective, as pure functions.

An RL task is what actors sample from and the learner trains. Its methods (the example in
`staleness.tasks.rl`) are pure and jittable with fixed shapes, so a whole asynchronous run
replays inside one `lax.scan`.

Data staleness is u − v: the actor generated with version v, the learner's gradient is at u.
Time comes from the prompt: `lengths[i]` tokens are decoded for prompt i whatever the params,
so a batch's generation time is prefill + max(lengths[idx]) × per-token time, computable
before any numerics.

`RLTask` is a pytree like `staleness.tasks.Task` (see there): its leaves are its arrays (prompts,
lengths); everything else (functions, sizes, objective) is static.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks import sampling
from staleness.tasks.rl import decode
from staleness.tasks.rl import lengths as _lengths
from staleness.tasks.rl.objectives import Objective

__all__ = ["Rollout", "RLTask", "EVAL_SALT", "PROBE_SALT", "PROBE_PROMPTS", "ACTOR_DTYPES"]

PyTree = Any

EVAL_SALT = 0x5EED
"""Folded into the task seed's key for the fixed-key sampled evaluation (`reward`)."""
PROBE_SALT = 0x9B0E
"""Folded into the task seed's key for the probe completions (`RLTask.probe`)."""


class Rollout(NamedTuple):
    """What an actor pushes: G completions of each of B prompts, padded to T positions."""

    prompt_idx: jax.Array   # [B] int32, rows of task.prompts
    tokens: jax.Array       # [B, G, T] int32, the completions (pad_token past each prompt's length)
    logp: jax.Array         # [B, G, T] float32, behavior log-probs log π_v(token) (0.0 past the length)
    mask: jax.Array         # [B, G, T] float32, 1.0 on generated tokens (t < length), 0.0 on padding
    rewards: jax.Array      # [B, G] float32, one reward per completion
    lengths: jax.Array      # [B] int32, the completion length of each prompt (= mask.sum(-1))


def _gather(tree: PyTree, idx: jax.Array) -> PyTree:
    return jax.tree.map(lambda a: jnp.asarray(a)[idx], tree)


ACTOR_DTYPES = ("float32", "bfloat16", "float16")
"""The precisions an RL task's actors may sample in (`RLTask.actor_dtype`)."""


def _cast(tree: PyTree, dtype) -> PyTree:
    """`tree` with its floating arrays in `dtype` (integer arrays, e.g. tokens, as they are)."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, tree)


def _complete(task: "RLTask", params: PyTree, keys: jax.Array, prompts: PyTree, lengths: jax.Array,
              greedy: bool, starts: jax.Array | None = None, actor: bool = False, keep_cache: bool = True
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens [n, T], logp [n, T], rewards [n]) of one completion per prompt (keys [n]);
    `starts`: in-flight segments (`decode.sample`), params stacked per segment. actor: sample
    as the task's actors do (`RLTask.actor_dtype`, `RLTask.actor_logits_fn`), else with the
    learner's own function in float32. A task with a KV cache (`RLTask.cached`) decodes with
    it (`decode.sample_cached`; keep_cache: an in-flight update keeps the earlier tokens'
    cache, else re-prefills), one without recomputes every prefix (`decode.sample`)."""
    logits_fn = task.logits_fn
    if actor:
        logits_fn = task.actor_logits_fn or task.logits_fn
        if task.actor_dtype != "float32":   # training–inference mismatch: the actor's precision
            params, prompts = _cast(params, task.actor_dtype), _cast(prompts, task.actor_dtype)
    if task.cached and logits_fn is task.logits_fn:   # a KV-cached decode of the same policy
        one = functools.partial(decode.sample_cached, task.init_cache, task.step, max_length=task.max_length,
                                pad_token=task.pad_token, greedy=greedy, starts=starts, keep_cache=keep_cache)
    else:
        one = functools.partial(decode.sample, logits_fn, max_length=task.max_length, pad_token=task.pad_token,
                                greedy=greedy, starts=starts)
    tokens, logp = jax.vmap(one, (None, 0, 0, 0))(params, keys, prompts, lengths)
    rewards = jax.vmap(task.reward_fn)(prompts, tokens, lengths).astype(jnp.float32)
    return tokens, logp, rewards


@functools.partial(jax.jit, static_argnames=("keep_cache",))
def _generate(task: "RLTask", params: PyTree, key: jax.Array, prompt_idx: jax.Array,
              starts: jax.Array | None = None, keep_cache: bool = True) -> Rollout:
    idx = jnp.asarray(prompt_idx, jnp.int32)                                 # [B]
    b, g, t = idx.shape[0], task.group_size, task.max_length
    prompts = _gather(task.prompts, jnp.repeat(idx, g))                     # [B·G, ...]
    lengths = jnp.asarray(task.completion_lengths)[idx]                      # [B]
    keys = jax.random.split(key, b * g)                                      # [B·G]
    tokens, logp, rewards = _complete(task, params, keys, prompts, jnp.repeat(lengths, g), greedy=False,
                                      starts=starts, actor=True, keep_cache=keep_cache)
    mask = (jnp.arange(t) < lengths[:, None, None]).astype(jnp.float32)     # [B, 1, T]
    return Rollout(prompt_idx=idx, tokens=tokens.reshape(b, g, t), logp=logp.reshape(b, g, t),
                   mask=jnp.broadcast_to(mask, (b, g, t)), rewards=rewards.reshape(b, g), lengths=lengths)


def _per_token(per_sequence, task: "RLTask", params: PyTree, rollout: Rollout) -> jax.Array:
    """`per_sequence(logits_fn, params, prompt, tokens, mask)` over every completion: [B, G, T]."""
    b, g, t = rollout.tokens.shape
    prompts = _gather(task.prompts, jnp.repeat(rollout.prompt_idx, g))      # [B·G, ...]
    out = jax.vmap(functools.partial(per_sequence, task.logits_fn), (None, 0, 0, 0))(
        params, prompts, rollout.tokens.reshape(b * g, t), rollout.mask.reshape(b * g, t))
    return out.reshape(b, g, t)


@jax.jit
def _logp(task: "RLTask", params: PyTree, rollout: Rollout) -> jax.Array:
    return _per_token(decode.token_logp, task, params, rollout)


@jax.jit
def _entropy(task: "RLTask", params: PyTree, rollout: Rollout) -> jax.Array:
    return _per_token(decode.token_entropy, task, params, rollout)


SIZE_BLOCK = 64
"""Rollouts of one actor whose sizes `RLTask.rollout_sizes` draws at once (the simulator asks
for them one by one; one vectorized draw costs about what one draw does)."""

PROBE_PROMPTS = 8
"""Held-out prompts of the probe set that `RLTask.version_kl` compares two versions on."""


def _probe_prompts(task: "RLTask") -> tuple[PyTree, jax.Array]:
    n = min(PROBE_PROMPTS, _lengths.num_prompts(task.eval_prompts))
    return _gather(task.eval_prompts, jnp.arange(n)), jnp.asarray(task.eval_lengths)[:n]


@jax.jit
def _probe(task: "RLTask", params: PyTree) -> tuple[jax.Array, jax.Array]:
    prompts, lengths = _probe_prompts(task)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(task.seed), PROBE_SALT), len(lengths))
    tokens, _, _ = _complete(task, params, keys, prompts, lengths, greedy=False)
    return tokens, (jnp.arange(task.max_length) < lengths[:, None]).astype(jnp.float32)      # [n, T] each


@jax.jit
def _version_kl(task: "RLTask", params_a: PyTree, params_b: PyTree, probe) -> jax.Array:
    prompts, _ = _probe_prompts(task)
    tokens, mask = probe
    kl = jax.vmap(functools.partial(decode.token_kl, task.logits_fn), (None, None, 0, 0, 0))(
        params_a, params_b, prompts, tokens, mask)
    return jnp.sum(kl) / jnp.maximum(jnp.sum(mask), 1.0)


@jax.jit
def _evaluate(task: "RLTask", params: PyTree) -> dict[str, jax.Array]:
    n, s = _lengths.num_prompts(task.eval_prompts), task.eval_samples
    lengths = jnp.asarray(task.eval_lengths)                                  # [E]
    _, _, greedy = _complete(task, params, jax.random.split(jax.random.key(0), n), task.eval_prompts, lengths,
                             greedy=True)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(task.seed), EVAL_SALT), n * s)
    prompts = _gather(task.eval_prompts, jnp.repeat(jnp.arange(n), s))        # [E·S, ...]
    _, _, sampled = _complete(task, params, keys, prompts, jnp.repeat(lengths, s), greedy=False)
    return {"reward": jnp.mean(sampled), "greedy_reward": jnp.mean(greedy)}


def _seed_bits(seed: Any, xp) -> Any:
    """The 2 uint32 words of the data key: those of jax.random.key(seed) for an int seed."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        s = int(seed)
        return xp.asarray([(s >> 32) & 0xFFFFFFFF, s & 0xFFFFFFFF], dtype=xp.uint32)
    if isinstance(seed, jax.Array) and jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)   # a typed key; a raw uint32 key is its own words
    seed = xp.asarray(seed)
    if seed.ndim == 0:                     # an integer array (traced): the words of key(seed), seed < 2^32
        return xp.stack([xp.zeros((), xp.uint32), seed.astype(xp.uint32)])
    return seed.reshape(-1)[:2].astype(xp.uint32)


ESTIMATE_SECONDS = 5.4e-10
"""Seconds of RL numerics per (completion × decoded token × parameter), a KV-cached decode plus
the learner's step (measured: rl-digits, 4 rollouts of 8 × 8 completions of at most 8 tokens,
1e5 parameters, 9 learner updates per second on a 2-core CPU); recomputing every prefix costs
about max_length / 2 times more."""
ESTIMATE_FROM = 120.0
"""Runs estimated at this many seconds of RL numerics or more say so before they start."""


def _human(n: float, unit: str) -> str:
    if unit == "B":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if n < 1024 or suffix == "TiB":
                return f"{n:.3g} {suffix}"
            n /= 1024
    return f"{n:.3g} s" if n < 3600 else f"{n / 3600:.3g} h"


@dataclasses.dataclass(frozen=True, eq=False)
class RLTask:
    """One RL problem: policy, prompts, reward, length rule and objective (build one with
    `staleness.tasks.rl.get` or `staleness.tasks.rl.from_functions`, which check every argument).

    Attributes:
      name: e.g. "rl-bandit".
      num_workers: actors the task is built for (prompt_indices checks actor ids against it).
      group_size: G, completions per prompt (the group of the baseline), >= 2.
      prompts_per_rollout: B, prompts per rollout.
      max_length: T, the completion axis of rollouts (the most tokens the policy generates).
      seed: the seed the prompts, lengths and evaluation key were drawn from.
      objective: the validated `Objective` that `loss` computes.
      init_fn: key -> params (float32 pytree).
      logits_fn: (params, prompt, completion [T] int32) -> logits [T, V], causal (see `decode`).
      reward_fn: (prompt, completion [T] int32, length int32) -> scalar reward.
      prompts: pytree of host arrays with leading axis num_prompts (rows are prompts).
      completion_lengths: [num_prompts] int32 in [1, T]: tokens generated per completion (the mask).
      lengths: [num_prompts] int32: tokens each prompt's completion decodes (timing). The same
        array as completion_lengths except where the numerics are shorter than the simulated
        decode (the bandit: one action, a long-tailed simulated length).
      eval_prompts: pytree of held-out prompts (leading axis num_eval_prompts).
      eval_lengths: [num_eval_prompts] int32 completion lengths of the held-out prompts.
      eval_samples: completions sampled per held-out prompt for `evaluate`'s "reward".
      pad_token: token id stored past each completion's length.
      metrics: `staleness.tasks.metrics.Metric` of "reward" and "greedy_reward" (higher is better).
      options: ((key, value), ...) the task-specific options it was built with.
      optimizer: the learner's optimizer when a run names none (a spec or an optax
        transformation); None: 'sgd'.
      prefill: the simulated cost of a rollout's prompt, in decoded tokens (timing only).
      actor_dtype: the precision the actors sample in (`ACTOR_DTYPES`): their params (and the
        prompts' floating arrays) cast to it, so the behaviour log-probs they record are those
        of a lower-precision forward while the learner computes in float32 (training–inference
        mismatch: "staleness 0" is not on-policy).
      actor_logits_fn: the actors' own implementation of the policy (same signature as
        logits_fn, e.g. another kernel or a quantized model); None: logits_fn.
      init_cache, step: a KV-cached decode of logits_fn (`decode.sample_cached`), or None.
    """

    name: str
    num_workers: int
    group_size: int
    prompts_per_rollout: int
    max_length: int
    seed: int
    objective: Objective
    init_fn: Callable[[jax.Array], PyTree]
    logits_fn: Callable[[PyTree, PyTree, jax.Array], jax.Array]
    reward_fn: Callable[[PyTree, jax.Array, jax.Array], jax.Array]
    prompts: PyTree
    completion_lengths: np.ndarray
    lengths: np.ndarray
    eval_prompts: PyTree
    eval_lengths: np.ndarray
    eval_samples: int = 4
    pad_token: int = 0
    metrics: tuple = ()
    options: tuple = ()
    optimizer: Any = None
    prefill: float = 0.0
    actor_dtype: str = "float32"
    actor_logits_fn: Callable | None = None
    init_cache: Callable | None = None
    step: Callable | None = None

    metric_names = ("reward", "greedy_reward")
    indexed = False        # the engine draws no minibatch indices: rollouts are generated in the replay
    partition = "iid"      # every actor samples the whole prompt set

    @property
    def cached(self) -> bool:
        """Whether generation decodes with a KV cache (the task gives init_cache and step)."""
        return self.init_cache is not None and self.step is not None

    @property
    def batch_size(self) -> int:
        """Prompts per rollout (B), what a supervised task's minibatch size is to a run."""
        return self.prompts_per_rollout

    @property
    def default_metric(self) -> str:
        """The metric a comparison ranks by: "reward"."""
        return "reward"

    def holdout(self, fraction: float = 0.25, seed: int = 0) -> "RLTask":
        """The task's validation split (for learning-rate tuning): a `fraction` of its
        training prompts (drawn with `seed`) become the prompts it evaluates on, the rest
        the prompts its actors sample; its own held-out (evaluation) prompts are not used.
        The objective, group size and every other setting stay the task's. ValueError with
        fewer than 2 training prompts."""
        if not (isinstance(fraction, float) and 0.0 < fraction < 1.0):
            raise ValueError(f"holdout: fraction = {fraction!r} must be a float in (0, 1)")
        n = self.num_prompts
        k = max(1, round(fraction * n))
        if n - k < 1:
            raise ValueError(f"task {self.name!r} has {n} training prompt(s): too few to hold out a validation split")
        perm = np.random.default_rng(seed).permutation(n)
        val, train = np.sort(perm[:k]), np.sort(perm[k:])
        take = lambda idx: jax.tree.map(lambda a: np.asarray(a)[idx], self.prompts)   # noqa: E731
        completion = np.asarray(self.completion_lengths)
        return dataclasses.replace(self, name=f"{self.name}[validation]", prompts=take(train),
                                   completion_lengths=completion[train], lengths=np.asarray(self.lengths)[train],
                                   eval_prompts=take(val), eval_lengths=completion[val])

    def rollout_sizes(self, data_key: Any):
        """sizes(actor, iteration) -> the simulated size of that rollout in decoded tokens:
        `prefill` + the tokens its batch decodes (`decode_tokens` of its prompts, drawn from
        `data_key` like the replay draws them). The simulator multiplies an actor's seconds
        per token by it (`staleness.sim.scheduler.simulate_schedule(sizes=...)`)."""
        bits = np.asarray(jax.random.key_data(data_key)) if isinstance(data_key, jax.Array) else data_key
        lengths, prefill = np.asarray(self.lengths), float(self.prefill)
        prompt_indices = self.prompt_indices
        block, cache = SIZE_BLOCK, {}   # (actor, first iteration of a block) -> [SIZE_BLOCK] sizes

        def sizes(actor: int, iteration: int) -> float:
            first = iteration - iteration % block
            got = cache.get((actor, first))
            if got is None:   # one vectorized draw of the next SIZE_BLOCK rollouts of this actor
                idx = prompt_indices(bits, np.full((block, 1), actor), np.arange(first, first + block)[:, None])
                got = cache[(actor, first)] = prefill + lengths[np.asarray(idx).reshape(block, -1)].max(axis=1)
            return float(got[iteration - first])
        return sizes

    @property
    def num_prompts(self) -> int:
        """N, the number of training prompts."""
        return _lengths.num_prompts(self.prompts)

    @property
    def num_eval_prompts(self) -> int:
        """Held-out prompts `evaluate` averages over."""
        return _lengths.num_prompts(self.eval_prompts)

    def init_params(self, key: jax.Array) -> PyTree:
        """Initial parameters from a PRNG key (for rl-digits: after the supervised warm start)."""
        return self.init_fn(key)

    def prompt_indices(self, seed: Any, actor: Any, iteration: Any) -> Any:
        """The B prompts actor `actor` generates for at its `iteration`: [..., B] int32 in [0, N).

        Counter-based like `staleness.tasks.sampling` (uniform with replacement, a hash of
        (seed, actor, iteration, j)): pure, so a schedule's rollouts can be recovered. NumPy on
        the host when every argument is a Python/NumPy value; jax.numpy when any is a JAX array
        (traced inside `jit`/`scan`); both give the same indices.

        Args:
          seed: an int (or an int array, possibly traced, < 2^32), or a JAX PRNG key; an int s
            gives the indices of jax.random.key(s).
          actor: actor id in [0, num_workers) (checked when a Python int).
          iteration: the actor's rollout counter, >= 0.
        """
        if isinstance(actor, (int, np.integer)) and not 0 <= actor < self.num_workers:
            raise ValueError(f"actor = {actor} is out of range for task {self.name!r} with num_workers = "
                             f"{self.num_workers}; valid actors are 0..{self.num_workers - 1}")
        if isinstance(iteration, (int, np.integer)) and iteration < 0:
            raise ValueError(f"iteration = {iteration} must be >= 0")
        on_device = any(isinstance(v, jax.Array) for v in (seed, actor, iteration))
        if on_device:
            d = sampling.draws(jnp, _seed_bits(seed, jnp), actor, iteration, self.prompts_per_rollout)
            return sampling.positions(jnp, d, actor, self.num_prompts)
        return sampling.host_indices(_seed_bits(seed, np), np.asarray(actor), np.asarray(iteration),
                                     self.prompts_per_rollout, self.num_prompts)

    def generate(self, params: PyTree, key: jax.Array, prompt_idx: jax.Array, starts: jax.Array | None = None,
                 keep_cache: bool = True) -> Rollout:
        """G sampled completions (temperature 1) of each prompt in `prompt_idx` ([B] int32), as
        the actors sample them (in `actor_dtype`, with `actor_logits_fn`).

        Each completion of prompt i has exactly completion_lengths[i] tokens; rewards are
        reward_fn of each. Pure in (params, key, prompt_idx): the same key gives the same
        rollout. Give each actor and iteration its own key, e.g.
        fold_in(fold_in(key, actor), iteration). Jittable; B may differ from prompts_per_rollout.

        starts, keep_cache: in-flight weight updates, `params` stacked on a leading [S] axis, one
        version per segment (`decode.sample`; with a KV cache, `decode.sample_cached`). Without
        a cache every position recomputes its prefix (re-prefill).
        """
        return _generate(self, params, key, prompt_idx, starts, keep_cache=keep_cache)

    def logp(self, params: PyTree, rollout: Rollout) -> jax.Array:
        """[B, G, T] log π_params of the rollout's tokens (0.0 on padding): the learner's
        log-probs, and π_prox when called with the params before the current update."""
        return _logp(self, params, rollout)

    def loss(self, params: PyTree, rollout: Rollout, prox_logp: jax.Array | None = None) -> jax.Array:
        """The objective (scalar, to minimise) at the learner's current `params` (version u) on
        `rollout` (generated with version v <= u; its logp are the behavior log-probs).
        prox_logp: [B, G, T] log π_prox (decoupled_ppo; None: π_prox = π_behav)."""
        return self.objective.loss(self.logp(params, rollout), rollout.logp, prox_logp, rollout.mask,
                                   rollout.rewards)

    def entropy(self, params: PyTree, rollout: Rollout) -> jax.Array:
        """[B, G, T] entropy of π_params's next-token distribution at each of the rollout's
        positions (0.0 on padding)."""
        return _entropy(self, params, rollout)

    def probe(self, params: PyTree) -> tuple[jax.Array, jax.Array]:
        """The probe set `version_kl` compares versions on: (tokens [n, T], mask [n, T]) of one
        completion of each of the first n = `PROBE_PROMPTS` held-out prompts, sampled from
        π_params with a fixed key (from the task seed). A run takes it once, at its initial
        parameters, so every update is compared on the same sequences."""
        return _probe(self, params)

    def version_kl(self, params_a: PyTree, params_b: PyTree, probe) -> jax.Array:
        """KL(π_a ‖ π_b) per token on the probe set (`probe`): the exact KL of the two
        next-token distributions over the vocabulary at every probe position, averaged over
        the positions (what changed between two versions, on the same sequences every time)."""
        return _version_kl(self, params_a, params_b, probe)

    def evaluate(self, params: PyTree) -> dict[str, jax.Array]:
        """{"reward": mean reward of `eval_samples` completions of each held-out prompt sampled at
        temperature 1 with a fixed key (from the task seed; what RL maximises, and the same
        random numbers at every evaluation, so differences between params are not sampling
        noise), "greedy_reward": of the greedy (argmax) completion of each}. Jittable."""
        return _evaluate(self, params)

    def decode_tokens(self, prompt_idx: Any) -> np.ndarray:
        """Tokens a batch of prompts `prompt_idx` ([..., B]) decodes: max of their `lengths`
        (host NumPy; a batch decodes as long as its longest completion)."""
        return np.max(self.lengths[np.asarray(prompt_idx)], axis=-1)

    @functools.cached_property
    def param_count(self) -> int:
        """Number of scalar parameters."""
        shapes = jax.eval_shape(self.init_fn, jax.random.key(0))
        return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes)))

    def estimate(self, updates: int, runs: int = 1, rollouts_per_update: int | None = None) -> tuple[float, int]:
        """(seconds, bytes): the RL numerics of `runs` runs of `updates` learner updates of
        `rollouts_per_update` rollouts each (default: one per actor), in a 2-core CPU's terms
        (`ESTIMATE_SECONDS`; a GPU is faster), and the parameters a replay holds (the ring of
        versions and the optimizer's state, float32)."""
        c = rollouts_per_update or self.num_workers
        per_rollout = self.prompts_per_rollout * self.group_size * self.max_length * self.param_count
        factor = 1.0 if self.cached else max(1.0, self.max_length / 2)
        seconds = float(updates) * runs * c * per_rollout * ESTIMATE_SECONDS * factor
        return seconds, 4 * self.param_count * (self.num_workers + 8)

    def estimate_note(self, updates: int | None, runs: int = 1, rollouts_per_update: int | None = None,
                      at_least: float | None = None) -> str | None:
        """The line a command prints before a run of `estimate`d `at_least` (default
        `ESTIMATE_FROM`) seconds or more; else None, and None without an update budget."""
        if updates is None:
            return None
        seconds, nbytes = self.estimate(updates, runs, rollouts_per_update)
        if seconds < (ESTIMATE_FROM if at_least is None else at_least):
            return None
        c = rollouts_per_update or self.num_workers
        return (f"estimate: about {_human(seconds, 's')} of RL numerics on 2 CPU cores ({runs} run(s) x {updates} "
                f"learner updates x {c} rollouts of {self.prompts_per_rollout} prompts x {self.group_size} "
                f"completions of up to {self.max_length} tokens, {self.param_count:,} parameters), about "
                f"{_human(nbytes, 'B')} of parameters in memory; Ctrl-C keeps what was recorded")

    def metric(self, name: str):
        """The `staleness.tasks.metrics.Metric` `name` (ValueError naming the valid ones)."""
        from staleness.tasks import metrics

        return metrics.find(self.metrics, name, self.name)

    def config(self) -> dict:
        """What a Result's config records of its task: name, seed, objective and its parameters,
        sizes, the length distribution (tokens) and the metrics."""
        return {"task": self.name, "task_seed": self.seed, "num_workers": self.num_workers,
                "objective": self.objective.name, "objective_params": dict(self.objective.params),
                "group_size": self.group_size, "prompts_per_rollout": self.prompts_per_rollout,
                "num_prompts": self.num_prompts, "num_eval_prompts": self.num_eval_prompts,
                "max_length": self.max_length, "eval_samples": self.eval_samples, "param_count": self.param_count,
                "actor_dtype": self.actor_dtype, "actor_logits_fn": self.actor_logits_fn is not None,
                "kv_cache": self.cached, "lengths": _lengths.summary(self.lengths),
                "completion_lengths": _lengths.summary(self.completion_lengths),
                "task_options": {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                                 for k, v in self.options},
                "metrics": {m.name: m.to_json() for m in self.metrics}}

    def __repr__(self) -> str:
        return (f"RLTask(name={self.name!r}, objective={self.objective.describe()}, num_workers={self.num_workers}, "
                f"num_prompts={self.num_prompts}, group_size={self.group_size}, "
                f"prompts_per_rollout={self.prompts_per_rollout}, max_length={self.max_length})")


jax.tree_util.register_dataclass(
    RLTask,
    data_fields=["prompts", "completion_lengths", "lengths", "eval_prompts", "eval_lengths"],
    meta_fields=["name", "num_workers", "group_size", "prompts_per_rollout", "max_length", "seed", "objective",
                 "init_fn", "logits_fn", "reward_fn", "eval_samples", "pad_token", "metrics", "options", "optimizer",
                 "prefill", "actor_dtype", "actor_logits_fn", "init_cache", "step"],
)
