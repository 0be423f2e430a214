"""Sampling and scoring completions from one policy function, per item (then `vmap`ped).

A policy is a single causal function

    logits_fn(params, prompt, completion [T] int32) -> logits [T, V]

where row t is the distribution of completion token t given the prompt and completion[:t]
(teacher forcing: row t must not read completion[t:]). Both directions come from it (`sample`,
`sample_cached` with a policy's KV cache, `token_logp`), so a behavior log-probability and the
learner's log-probability of the same tokens at the same params are the same function.

In-flight weight updates (PipelineRL): `starts=` takes params stacked on a leading [S] axis, one
version per segment, and samples position t with segment s(t) = #{j : starts[j] <= t} − 1
(starts[0] = 0, ascending; a padding entry holds a start past the last position).

Everything has fixed shapes (T = the task's max_length), so both run inside `jit`/`scan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["sample", "sample_cached", "token_logp", "token_entropy", "token_kl"]

LogitsFn = Callable[[Any, Any, jax.Array], jax.Array]


def sample(logits_fn: LogitsFn, params: Any, key: jax.Array, prompt: Any, length: jax.Array, *,
           max_length: int, pad_token: int, greedy: bool = False,
           starts: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """One completion of exactly `length` tokens (int32 scalar, 1 <= length <= max_length).

    Args:
      logits_fn, params: the policy (see the module docstring) and its parameters.
      key: PRNG key of this completion (split per position; unused when greedy).
      prompt: one prompt (a pytree of arrays without the prompt axis).
      max_length: T, the completion axis; pad_token: the token stored at positions >= length.
      greedy: argmax instead of sampling at temperature 1.
      starts: [S] int32 first position of each segment (in-flight updates); `params` then
        has a leading [S] axis, one version per segment. None: one version.

    Returns:
      (tokens [T] int32, logp [T] float32): the sampled tokens (pad_token past `length`) and
      their log-probabilities under the policy (0.0 past `length`).
    """
    keys = jax.random.split(key, max_length)

    def step(tokens, inputs):
        t, k = inputs
        p = _version(params, starts, t)
        logits = jax.lax.dynamic_index_in_dim(logits_fn(p, prompt, tokens), t, keepdims=False)        # [V]
        token, logp = _draw(logits, k, t, length, greedy, pad_token)
        return tokens.at[t].set(token), logp

    tokens0 = jnp.full((max_length,), pad_token, jnp.int32)                                          # [T]
    tokens, logp = jax.lax.scan(step, tokens0, (jnp.arange(max_length), keys))
    return tokens, logp


def _segment(starts: jax.Array, t) -> jax.Array:
    return jnp.sum((starts <= t).astype(jnp.int32)) - 1


def _version(params: Any, starts: jax.Array | None, t) -> Any:
    """The params of position t's segment (all of `params` without `starts`)."""
    if starts is None:
        return params
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, _segment(starts, t), keepdims=False), params)


def _draw(logits: jax.Array, k: jax.Array, t, length, greedy: bool, pad_token: int) -> tuple[jax.Array, jax.Array]:
    """(token, its log-prob) of position t from logits [V]: (pad_token, 0.0) past `length`."""
    logp_all = jax.nn.log_softmax(logits.astype(jnp.float32))                                       # [V]
    token = jnp.argmax(logits) if greedy else jax.random.categorical(k, logits)
    live = t < length
    return jnp.where(live, token, pad_token).astype(jnp.int32), jnp.where(live, logp_all[token], 0.0)


def sample_cached(init_cache: Callable, step: Callable, params: Any, key: jax.Array, prompt: Any, length: jax.Array,
                  *, max_length: int, pad_token: int, greedy: bool = False, starts: jax.Array | None = None,
                  keep_cache: bool = True) -> tuple[jax.Array, jax.Array]:
    """`sample` with a KV cache: the same tokens for the same key (the same random numbers per
    position; the logits equal to float32 rounding), in one prefill and T one-token steps
    instead of T whole forward passes (`init_cache` and `step`: see `staleness.tasks.rl.Policy`).

    In-flight weight updates (`starts`, params stacked [S, ...]): position t's logits come from
    version s(t). keep_cache=True (PipelineRL): a new version computes only the tokens from its
    first position on, over the keys and values that older versions computed for the earlier
    ones; keep_cache=False (AReaL's partial rollouts): where the version changes, the prompt
    and every token so far are encoded again with the new version (a re-prefill), so position
    t is version s(t) on the whole prefix, as `sample` computes it."""
    keys = jax.random.split(key, max_length)
    tokens0 = jnp.full((max_length,), pad_token, jnp.int32)                                          # [T]
    logits0, cache0 = init_cache(_version(params, starts, 0), prompt, tokens0, 0)

    def body(carry, inputs):
        cache, logits, tokens = carry
        t, k = inputs
        token, logp = _draw(logits, k, t, length, greedy, pad_token)
        tokens = tokens.at[t].set(token)
        nxt = _version(params, starts, t + 1)
        if starts is not None and not keep_cache:   # a new version re-encodes the whole prefix
            logits, cache = jax.lax.cond(_segment(starts, t + 1) != _segment(starts, t),
                                         lambda: init_cache(nxt, prompt, tokens, t + 1),
                                         lambda: step(nxt, cache, token, t))
        else:
            logits, cache = step(nxt, cache, token, t)
        return (cache, logits, tokens), logp

    (_, _, tokens), logp = jax.lax.scan(body, (cache0, logits0, tokens0), (jnp.arange(max_length), keys))
    return tokens, logp


def token_logp(logits_fn: LogitsFn, params: Any, prompt: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """[T] log π(tokens[t] | prompt, tokens[:t]) where mask[t] > 0, 0.0 elsewhere (one forward pass)."""
    logp_all = jax.nn.log_softmax(logits_fn(params, prompt, tokens).astype(jnp.float32), axis=-1)   # [T, V]
    live = mask > 0
    safe = jnp.where(live, tokens, 0)        # pad tokens may lie outside the policy's vocabulary
    logp = jnp.take_along_axis(logp_all, safe[:, None], axis=-1)[:, 0]                              # [T]
    return jnp.where(live, logp, 0.0)


def token_entropy(logits_fn: LogitsFn, params: Any, prompt: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """[T] entropy of π(· | prompt, tokens[:t]) where mask[t] > 0, 0.0 elsewhere (one forward pass)."""
    logp_all = jax.nn.log_softmax(logits_fn(params, prompt, tokens).astype(jnp.float32), axis=-1)   # [T, V]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return jnp.where(mask > 0, entropy, 0.0)


def token_kl(logits_fn: LogitsFn, params_p: Any, params_q: Any, prompt: Any, tokens: jax.Array,
             mask: jax.Array) -> jax.Array:
    """[T] KL(π_p(· | prompt, tokens[:t]) ‖ π_q(· | ...)) over the whole vocabulary where
    mask[t] > 0, 0.0 elsewhere (two forward passes)."""
    lp = jax.nn.log_softmax(logits_fn(params_p, prompt, tokens).astype(jnp.float32), axis=-1)       # [T, V]
    lq = jax.nn.log_softmax(logits_fn(params_q, prompt, tokens).astype(jnp.float32), axis=-1)
    return jnp.where(mask > 0, jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1), 0.0)
