"""Sampling and scoring completions from one policy function, per item (then `vmap`ped).

A policy is a single causal function

    logits_fn(params, prompt, completion [T] int32) -> logits [T, V]

where row t is the distribution of completion token t given the prompt and completion[:t]
(teacher forcing: row t must not read completion[t:]). Both directions come from it, so a
behavior log-probability and the learner's log-probability of the same tokens at the same
params are the same function:

- `sample`: a `lax.scan` over the T positions; step t recomputes the whole forward pass on
  the tokens so far (no KV cache: fine at these sizes) and samples token t (or takes the
  argmax). Positions t >= length are not sampled: they hold `pad_token` and log-prob 0.
- `token_logp`: one teacher-forced forward pass, log-softmax, the log-prob of each token.

In-flight weight updates (PipelineRL): `sample(..., starts=)` takes params stacked on a
leading [S] axis, one version per segment, and samples position t with segment
s(t) = #{j : starts[j] <= t} − 1 (starts[0] = 0, ascending; a padding entry holds a start
past the last position). Since every step recomputes the prefix, position t's token and
log-prob are those of version s(t) on the whole prefix (AReaL's partial rollout, and
PipelineRL's up to its KV cache of the earlier tokens, kept from older versions).

Everything has fixed shapes (T = the task's max_length), so both run inside `jit`/`scan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["sample", "token_logp"]

LogitsFn = Callable[[Any, Any, jax.Array], jax.Array]


def sample(logits_fn: LogitsFn, params: Any, key: jax.Array, prompt: Any, length: jax.Array, *,
           max_length: int, pad_token: int, greedy: bool = False,
           starts: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """One completion of exactly `length` tokens (int32 scalar, 1 <= length <= max_length).

    Args:
      logits_fn: the policy (see the module docstring).
      params: its parameters.
      key: PRNG key of this completion (split per position; unused when greedy).
      prompt: one prompt (a pytree of arrays without the prompt axis).
      length: tokens to generate.
      max_length: T, the completion axis.
      pad_token: the token stored at positions >= length.
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
        p = params
        if starts is not None:   # the version of position t's segment
            seg = jnp.sum((starts <= t).astype(jnp.int32)) - 1
            p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, seg, keepdims=False), params)
        logits = jax.lax.dynamic_index_in_dim(logits_fn(p, prompt, tokens), t, keepdims=False)        # [V]
        logp_all = jax.nn.log_softmax(logits.astype(jnp.float32))                                   # [V]
        token = jnp.argmax(logits) if greedy else jax.random.categorical(k, logits)
        live = t < length
        logp = jnp.where(live, logp_all[token], 0.0)
        token = jnp.where(live, token, pad_token).astype(jnp.int32)
        return tokens.at[t].set(token), logp

    tokens0 = jnp.full((max_length,), pad_token, jnp.int32)                                          # [T]
    tokens, logp = jax.lax.scan(step, tokens0, (jnp.arange(max_length), keys))
    return tokens, logp


def token_logp(logits_fn: LogitsFn, params: Any, prompt: Any, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """[T] log π(tokens[t] | prompt, tokens[:t]) where mask[t] > 0, 0.0 elsewhere (one forward pass)."""
    logp_all = jax.nn.log_softmax(logits_fn(params, prompt, tokens).astype(jnp.float32), axis=-1)   # [T, V]
    live = mask > 0
    safe = jnp.where(live, tokens, 0)        # pad tokens may lie outside the policy's vocabulary
    logp = jnp.take_along_axis(logp_all, safe[:, None], axis=-1)[:, 0]                              # [T]
    return jnp.where(live, logp, 0.0)
