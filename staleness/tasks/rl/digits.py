"""rl-digits: reverse (or sort) a digit string with a small decoder-only transformer.

A prompt is a string of L digits, L drawn once per prompt from a long-tailed rule (lognormal,
median 3, at most max_digits = 8); the completion must be the reversed (or sorted) string and
is generated to exactly L tokens. Reward = the fraction of the L positions that are correct.

Sequence layout (vocabulary: digits 0-9, PAD = 10, SEP = 11), with T = max_digits:

    index    0 .. T-1                  T       T+1 .. 2T-1
    token    PAD.. d_1 .. d_L          SEP     c_1 .. c_{T-1}     (the model's context is 2T)

The prompt is left-padded, so under "reverse" completion token t always copies the prompt
token at index T-1-t whatever L is. The logits at index T+t are the distribution of c_{t+1}
(t = 0..T-1), restricted to the 10 digits: the policy cannot emit PAD or SEP. The transformer
is `staleness.tasks.transformer.Transformer` (2 pre-LN blocks, d_model 64, 4 heads by default:
about 100k parameters); generation decodes with a KV cache (`cache_fns`).

Warm start: `warm_start` (lengths uniform in 1..T, so long strings are not left to RL alone);
`rl_digits(warm_start_steps=50)` makes it part of `init_fn`, so RL starts from a non-trivial reward:
random guessing scores 0.1, the warm start about 0.2 sampled (0.6 greedy), and 100 on-policy updates
(8 prompts × 8 completions, Adam 1e-3) reach about 0.7 sampled. Nothing is cached on disk.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from staleness.tasks.rl import lengths as _lengths
from staleness.tasks.rl.base import PyTree, RLTask
from staleness.tasks.rl.builders import Policy, PromptSet, check_int, from_functions
from staleness.tasks import transformer
from staleness.tasks.transformer import Transformer

__all__ = ["NAME", "TARGETS", "PAD", "SEP", "VOCAB", "NUM_DIGITS", "DigitsConfig", "rl_digits", "warm_start",
           "make_prompts", "target_of", "reward_of", "policy_fns", "cache_fns"]

NAME = "rl-digits"
TARGETS = ("reverse", "sort")
NUM_DIGITS = 10
PAD, SEP = 10, 11
VOCAB = 12
PROMPT_SALT, EVAL_PROMPT_SALT = 21, 22


class DigitsConfig(NamedTuple):
    """The model and the rule of rl-digits (hashable: one compile per configuration)."""

    max_digits: int = 8        # T: the longest prompt and completion, tokens
    target: str = "reverse"    # "reverse" or "sort" (ascending)
    num_layers: int = 2
    d_model: int = 64
    num_heads: int = 4

    @property
    def context(self) -> int:
        """Tokens the transformer sees: prompt (T) + SEP + completion inputs (T - 1)."""
        return 2 * self.max_digits

    def model(self) -> Transformer:
        return Transformer(num_layers=self.num_layers, d_model=self.d_model, num_heads=self.num_heads,
                           context=self.context, vocab=VOCAB)


def target_of(digits: jax.Array, target: str) -> jax.Array:
    """[T] int32 correct completion of a left-padded prompt `digits` [T] (positions >= L: PAD)."""
    if target == "reverse":
        return digits[::-1]          # left padding: the pads land at the end
    return jnp.sort(digits)          # PAD = 10 sorts after every digit


def reward_of(target: str, prompt: PyTree, completion: jax.Array, length: jax.Array) -> jax.Array:
    """Fraction of the first `length` positions of `completion` [T] that are correct (float32)."""
    t = completion.shape[0]
    live = jnp.arange(t) < length
    right = (completion == target_of(prompt["digits"], target)) & live
    return jnp.sum(right).astype(jnp.float32) / jnp.maximum(length, 1).astype(jnp.float32)


def _sequence(prompt_digits: jax.Array, completion: jax.Array) -> jax.Array:
    """[2T] int32: prompt, SEP, completion[:-1] (the model's input)."""
    return jnp.concatenate([prompt_digits, jnp.array([SEP], jnp.int32), completion[:-1]]).astype(jnp.int32)


@functools.lru_cache(maxsize=None)
def policy_fns(config: DigitsConfig):
    """(init_fn, logits_fn, reward_fn) of the policy for `config` (shared by equal configs)."""
    model = config.model()
    t = config.max_digits

    def init_fn(key: jax.Array) -> PyTree:
        return model.init(key, jnp.zeros((1, config.context), jnp.int32))["params"]

    def logits_fn(params: PyTree, prompt: PyTree, completion: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, _sequence(prompt["digits"], completion)[None])[0]   # [2T, V]
        return logits[t:, :NUM_DIGITS]                                                               # [T, 10]

    return init_fn, logits_fn, functools.partial(reward_of, config.target)


@functools.lru_cache(maxsize=None)
def cache_fns(config: DigitsConfig):
    """(init_cache, step): the KV-cached decode of `policy_fns(config)`'s logits_fn (see
    `staleness.tasks.rl.decode.sample_cached`): completion token t sits at sequence index
    T + 1 + t, and the logits at index T + t are its distribution."""
    model = config.model()
    t = config.max_digits

    def init_cache(params: PyTree, prompt: PyTree, completion: jax.Array, upto):
        logits, cache = transformer.prefill(model, params, _sequence(prompt["digits"], completion))   # [2T, V]
        return jax.lax.dynamic_index_in_dim(logits, t + upto, keepdims=False)[:NUM_DIGITS], cache

    def step(params: PyTree, cache, token: jax.Array, i):
        logits, cache = transformer.decode_step(model, params, cache, token, t + 1 + i)
        return logits[:NUM_DIGITS], cache

    return init_cache, step


def make_prompts(rng: np.random.Generator, lengths: np.ndarray, max_digits: int) -> dict[str, np.ndarray]:
    """{"digits": [N, T] int32 left-padded with PAD, "length": [N] int32}: uniform random digits."""
    n = len(lengths)
    digits = rng.integers(0, NUM_DIGITS, size=(n, max_digits)).astype(np.int32)
    pad = np.arange(max_digits)[None, :] < (max_digits - lengths)[:, None]
    return {"digits": np.where(pad, PAD, digits).astype(np.int32), "length": np.asarray(lengths, np.int32)}


def _random_batch(key: jax.Array, batch: int, config: DigitsConfig) -> tuple[dict, jax.Array, jax.Array]:
    """A batch of fresh prompts (lengths uniform in 1..T) with their correct completions and masks."""
    t = config.max_digits
    k_len, k_dig = jax.random.split(key)
    length = jax.random.randint(k_len, (batch,), 1, t + 1)                                  # [n]
    digits = jax.random.randint(k_dig, (batch, t), 0, NUM_DIGITS)
    digits = jnp.where(jnp.arange(t) < (t - length)[:, None], PAD, digits).astype(jnp.int32)   # [n, T]
    target = jax.vmap(target_of, (0, None))(digits, config.target)                          # [n, T]
    mask = (jnp.arange(t) < length[:, None]).astype(jnp.float32)                            # [n, T]
    return {"digits": digits, "length": length}, target, mask


@functools.partial(jax.jit, static_argnames=("steps", "config", "batch_size", "learning_rate"))
def warm_start(params: PyTree, steps: int, config: DigitsConfig = DigitsConfig(), key: jax.Array | None = None, *,
               batch_size: int = 32, learning_rate: float = 3e-4) -> PyTree:
    """`steps` Adam steps of supervised cross-entropy on correct completions of fresh random
    prompts (batch_size per step, lengths uniform in 1..T); returns the new params.

    Deterministic in `key` (default jax.random.key(0)). One jitted `lax.scan`."""
    key = jax.random.key(0) if key is None else key
    _, logits_fn, _ = policy_fns(config)
    opt = optax.adam(learning_rate)

    def loss(p, prompts, target, mask):
        logits = jax.vmap(logits_fn, (None, 0, 0))(p, prompts, jnp.where(mask > 0, target, PAD))   # [n, T, 10]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(mask > 0, target, 0))
        return jnp.sum(ce * mask) / jnp.sum(mask)

    def step(carry, k):
        p, state = carry
        grads = jax.grad(loss)(p, *_random_batch(k, batch_size, config))
        updates, state = opt.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), jax.random.split(key, steps))
    return params


@functools.lru_cache(maxsize=None)
def _init_fn(config: DigitsConfig, warm_start_steps: int):
    init_fn, _, _ = policy_fns(config)
    if warm_start_steps == 0:
        return jax.jit(init_fn)

    def init_and_warm(key: jax.Array) -> PyTree:
        k_init, k_warm = jax.random.split(key)
        return warm_start(init_fn(k_init), warm_start_steps, config, k_warm)

    return jax.jit(init_and_warm)


def _config(options: dict[str, Any]) -> DigitsConfig:
    """The DigitsConfig of the model options in `options` (removed from it), checked."""
    config = DigitsConfig(**{k: options.pop(k) for k in DigitsConfig._fields if k in options})
    check_int("max_digits", config.max_digits, 1, "the longest prompt, tokens")
    if config.target not in TARGETS:
        raise ValueError(f"target = {config.target!r} is not a digits task; valid: {', '.join(TARGETS)}")
    check_int("num_layers", config.num_layers, 1, "transformer blocks")
    check_int("num_heads", config.num_heads, 1, "attention heads")
    check_int("d_model", config.d_model, 1, "model width")
    if config.d_model % config.num_heads:
        raise ValueError(f"d_model = {config.d_model} must be a multiple of num_heads = {config.num_heads}")
    return config._replace(max_digits=int(config.max_digits), num_layers=int(config.num_layers),
                           d_model=int(config.d_model), num_heads=int(config.num_heads))


def rl_digits(num_workers: int = 4, objective: str = "decoupled_ppo", seed: int = 0, *, num_prompts: int = 256,
              num_eval_prompts: int = 128, group_size: int = 8, prompts_per_rollout: int = 8,
              length_rule: Any = None, warm_start_steps: int = 50, actor_dtype: str = "float32",
              kv_cache: bool = True, **options: Any) -> RLTask:
    """rl-digits (see the module docstring).

    Args:
      num_workers: actors.
      objective: one of OBJECTIVES.
      seed: seed of the prompts, their lengths and the evaluation key.
      num_prompts: N training prompts; num_eval_prompts: held-out prompts for `evaluate`.
      group_size: G completions per prompt; prompts_per_rollout: B prompts per rollout.
      length_rule: prompt lengths, a `lengths` rule with draw(rng, n) and high <= max_digits
        (default lognormal, median 3, sigma 0.7, at most max_digits).
      warm_start_steps: supervised steps `init_fn` runs before RL (0: a random policy).
      actor_dtype: the precision the actors sample in (`staleness.tasks.rl.RLTask`).
      kv_cache: decode with a KV cache (`cache_fns`; False: recompute every prefix).
      **options: the model's (`DigitsConfig` fields: max_digits = T, the longest prompt, 8;
        target "reverse" or "sort"; num_layers 2, d_model 64, num_heads 4) and the objective's
        parameters (eps, c, std_advantages).
    """
    config = _config(options)
    for arg, value, low, what in (("num_prompts", num_prompts, 1, "training prompts"),
                                  ("num_eval_prompts", num_eval_prompts, 1, "held-out prompts"),
                                  ("warm_start_steps", warm_start_steps, 0, "supervised steps before RL"),
                                  ("seed", seed, 0, "seed of the prompts and lengths")):
        check_int(arg, value, low, what)
    t = config.max_digits
    rule = _lengths.LogNormal(3.0, 0.7, t) if length_rule is None else length_rule
    if not callable(getattr(rule, "draw", None)):
        raise ValueError(f"length_rule = {rule!r} must be a rule with draw(rng, n), e.g. "
                         "staleness.tasks.rl.lengths.lognormal(median=3, sigma=0.7, high=8)")
    prompts, eval_prompts = (_prompts(rule, seed, salt, n, t)
                             for salt, n in ((PROMPT_SALT, num_prompts), (EVAL_PROMPT_SALT, num_eval_prompts)))
    _, logits_fn, reward_fn = policy_fns(config)
    init_cache, step = cache_fns(config) if kv_cache else (None, None)
    recorded = (("num_prompts", int(num_prompts)), ("num_eval_prompts", int(num_eval_prompts)),
                *config._asdict().items(), ("length_rule", str(rule)), ("warm_start_steps", int(warm_start_steps)),
                ("actor_dtype", actor_dtype), ("kv_cache", bool(kv_cache)))
    return from_functions(Policy(_init_fn(config, int(warm_start_steps)), logits_fn, max_length=t, pad_token=PAD,
                                 init_cache=init_cache, step=step),
                          PromptSet(prompts, _lengths.from_prompts("length"), eval_prompts=eval_prompts),
                          reward_fn, objective=objective, name=NAME, num_workers=num_workers, group_size=group_size,
                          prompts_per_rollout=prompts_per_rollout, seed=seed, reward_range=(0.0, 1.0),
                          options=recorded, optimizer=OPTIMIZER, actor_dtype=actor_dtype, **options)


OPTIMIZER = "adam:lr=1e-3"
"""The learner's default optimizer for rl-digits."""

rl_digits.optimizer = OPTIMIZER                   # read by tasks.registry.declared_optimizer
rl_digits.model_options = DigitsConfig._fields   # read by rl.get: options that are not in the signature


def _prompts(rule: Any, seed: int, salt: int, n: int, max_digits: int) -> dict[str, np.ndarray]:
    """n prompts whose lengths come from `rule` (checked against max_digits: the model's context)."""
    high = getattr(rule, "high", None)
    if isinstance(high, (int, np.integer)) and high > max_digits:
        raise ValueError(f"length_rule = {rule} can draw lengths up to {high} > max_digits = {max_digits} "
                         f"(the model's context holds 2 * max_digits = {2 * max_digits} tokens); lower its high "
                         "or raise max_digits")
    rng = np.random.default_rng(np.random.SeedSequence([seed, salt]))
    lengths = _lengths.draw(lambda prompts, r: rule.draw(r, n), {"n": np.zeros(n)}, rng, max_digits, "length_rule")
    return make_prompts(rng, lengths, max_digits)
