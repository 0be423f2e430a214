"""One server update: what "apply the gradients of one update" means, in one place.

    server_update(...) = apply(tx, params, opt_state, aggregate(grads, staleness, mask, rules), real)

`aggregate` is Rudra's (1/c) Σ_l scale(τ_l)·g_l over the c real gradient slots (the lr
rule weights each gradient inside the average; with SGD it is the learning rate α·scale(τ),
with AdamW it rescales the gradient Adam sees); `apply` is `tx.update` +
`optax.apply_updates`. The compiled replay (`engine.core`), the real runtime's server
(`runtime.numerics`) and the pipeline stages (`pipeline.stage`) all call these functions,
so a recorded trace replays to the same bits on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from staleness import lr as _lr

__all__ = ["rule_scale", "aggregate", "round_share", "apply", "server_update", "scale_by_staleness"]


def rule_scale(rules: tuple, rule_index, staleness, mask):
    """[C] lr-rule factors of one update's slots; `rule_index` picks one of several rules (sweeps)."""
    if len(rules) == 1:
        return rules[0].scale(staleness, mask)
    return jnp.stack([r.scale(staleness, mask) for r in rules])[rule_index]


def aggregate(grads, staleness, mask, rules: tuple, rule_index=0, weights=None):
    """The gradient of one update from its C slots (staleness [C], mask [C] bool).

    C > 1: `grads` has [C, ...] leaves; returns (1/c) Σ_l scale(τ_l)·g_l over the c
    real slots, or with `weights` ([C] float32: Decoupled DiLoCo's tokens per slot)
    Σ_l scale(τ_l)·(w_l / Σ_real w)·g_l (equal weights give the same bits under a constant
    rule: w / Σw and 1/c are both the rounded 1/c). C == 1: `grads` is one gradient pytree
    (not stacked); it is scaled by the rule unless the rule is constant (then returned as it
    is: one-worker ASP runs exactly the ops of plain training).
    """
    if mask.shape[0] == 1:
        if len(rules) == 1 and isinstance(rules[0], _lr.Constant):
            return grads
        scale = rule_scale(rules, rule_index, staleness, mask).astype(jnp.float32)
        return jax.tree.map(lambda g: g * scale[0], grads)
    scale = rule_scale(rules, rule_index, staleness, mask).astype(jnp.float32)
    if weights is None:
        weights = scale / jnp.maximum(mask.sum(), 1).astype(jnp.float32)
    else:
        w = jnp.where(mask, weights.astype(jnp.float32), 0.0)
        weights = scale * (w / jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny))
    return jax.tree.map(lambda g: jnp.tensordot(weights, g, axes=1).astype(g.dtype), grads)


def round_share(weights, mask, round_weights):
    """The share of a round that one local-update merge takes, as (tokens merged, tokens of a
    round), int32: the tokens of its real slots (`weights` [C], `mask` [C]) and every learner's
    tokens of one iteration (`round_weights` [λ], live or not: after a failure a merge of the
    live learners is less than a round). Equal when every learner is merged once:
    the clock of `tasks.optim.clocked_nesterov`, kept in whole tokens so that it never drifts."""
    merged = jnp.where(mask, jnp.asarray(weights).astype(jnp.int32), 0).sum()
    return merged, jnp.asarray(round_weights).astype(jnp.int32).sum()


def apply(tx, params, opt_state, grad, real=True, **extra):
    """One optimizer step: (params, opt_state) after `tx.update` + `optax.apply_updates`.
    real: False (may be traced) keeps both unchanged (a padding update). `extra` goes to
    `tx.update` (Streaming DiLoCo's fragment index; a token-weighted merge's `share` of a
    round, which a transformation that does not read it ignores)."""
    if "share" in extra:
        tx = optax.with_extra_args_support(tx)
    updates, new_state = tx.update(grad, opt_state, params, **extra)
    new_params = optax.apply_updates(params, updates)
    if real is True:
        return new_params, new_state
    keep = lambda new, old: jnp.where(real, new, old)  # noqa: E731
    return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_state, opt_state)


def server_update(tx, rules: tuple, params, opt_state, grads, staleness, mask, rule_index=0, weights=None,
                  **extra):
    """One server update from C gradient slots (see `aggregate`); an update with no
    real slot (all of `mask` False) changes nothing. Returns (params, opt_state)."""
    grad = aggregate(grads, staleness, mask, rules, rule_index, weights)
    return apply(tx, params, opt_state, grad, mask.any(), **extra)


def scale_by_staleness(rule):
    """An optax transformation scaling the (one) gradient by `rule`'s factor for its
    staleness: `tx.update(g, state, params, staleness=τ)`. Placed first in a chain
    it is what `aggregate` does for an update of one gradient, for loops written by
    hand (the engine applies the rule in `aggregate`, per gradient slot).
    """
    import optax

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None, *, staleness=0, **extra):
        del params, extra
        tau = jnp.asarray(staleness, jnp.int32).reshape(1)
        scale = rule.scale(tau, jnp.ones(1, bool)).astype(jnp.float32)[0]
        return jax.tree.map(lambda g: g * scale, updates), state

    return optax.GradientTransformationExtraArgs(init, update)
