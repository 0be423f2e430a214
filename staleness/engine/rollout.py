"""The learner step of asynchronous RL inside the compiled replay (data staleness).

For one update slot (an actor's rollout, one row of the schedule):

    idx     = task.prompt_indices(data_key, actor, iteration)      # its B prompts
    rollout = task.generate(θ_v, key(actor, iteration), idx)        # sampled from the ring's version v
    loss, g = value_and_grad(task.loss)(θ_u, rollout, prox)         # at the learner's current version u

where v is the slot's pull (behavior) version, read from the ring like a stale gradient's
parameters, and u the version the update applies to; π_prox (decoupled PPO) is θ_u itself
(no gradient through it). The update is then the engine's one server update
(`engine.update`). With in-flight weight updates (`rl_inflight`) the slot reads one
version per segment (`Learner`) and position t is sampled with its segment's version
(`decode.sample(starts=)`). The generation key of (actor, iteration) is folded from the
run's data key, so a rollout is a pure function of the seed, its row and its behavior
parameters: the simulator's timing (`RLTask.rollout_sizes`) and the replay see the same prompts.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from staleness.engine import update as _update

__all__ = ["Learner", "SEGMENT_START", "SEGMENT_VERSION", "generation_key", "generate_rollout", "learner_gradient",
           "learner_update", "behavior_loss", "rollout_gradient", "GENERATION_SALT"]

GENERATION_SALT = 0x6E6
"""Folded into the data key for the generation keys (the prompts use the data key itself)."""


def generation_key(data_key, actor, iteration):
    """The sampling key of `actor`'s rollout `iteration`."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(data_key, GENERATION_SALT), actor), iteration)


def generate_rollout(task, behavior, data_key, actor, iteration, starts=None, keep_cache: bool = True):
    """`actor`'s rollout `iteration`: its prompts, sampled from `behavior` params (what an
    actor computes; the real runtime's workers call it). starts: [S] first position of each
    in-flight segment, `behavior` then stacked per segment (None: one version); keep_cache:
    a new version keeps the earlier tokens' KV cache (in-flight updates) or re-prefills
    (partial rollouts; `RLTask.generate`)."""
    idx = task.prompt_indices(data_key, actor, iteration)
    return task.generate(behavior, generation_key(data_key, actor, iteration), idx, starts, keep_cache=keep_cache)


def learner_gradient(task, params, rollout):
    """(loss, grad) of the objective at the learner's `params` on `rollout`, with
    π_prox = `params` (no gradient through it): what the learner computes per rollout
    (the real runtime's server calls it)."""
    prox = lax.stop_gradient(task.logp(params, rollout))
    return jax.value_and_grad(task.loss)(params, rollout, prox)


def behavior_loss(task, rollout):
    """The objective at the behavior policy itself (π_θ = π_prox = π_behav): what an actor
    reports with its push in a real run (finite; the learner's loss needs its version)."""
    return task.objective.loss(rollout.logp, rollout.logp, None, rollout.mask, rollout.rewards)


def rollout_gradient(task, params, behavior, data_key, actor, iteration, starts=None):
    """(loss, grad, mean reward) of one rollout: generated with `behavior` params (per
    segment with `starts`), the objective and its gradient at `params` (π_prox = `params`,
    without gradient)."""
    rollout = generate_rollout(task, behavior, data_key, actor, iteration, starts)
    loss, grad = learner_gradient(task, params, rollout)
    return loss, grad, jnp.mean(rollout.rewards)


SEGMENT_START, SEGMENT_VERSION = range(2)
"""Rows of an in-flight slot's segments input ([2, S] int32)."""


def _prompts(rollout, lo: int, size: int):
    """The prompts lo .. lo + size − 1 of `rollout` (fields with a leading [B] axis; traced lo)."""
    return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, lo, size, axis=0), rollout)


DIAGNOSTICS = ("kl_behav", "is_weight_mean", "is_weight_max", "ess", "entropy", "clip_fraction",
               "masked_fraction", "kl_version")
"""What `Learner.update` reports per update (see `learner_update`; kl_version: `RLTask.version_kl`
of the version before and after the update)."""


def learner_update(task, tx, rules: tuple, rule_index, params, opt_state, rollouts, staleness, mask,
                   minibatches: int = 1, padded: bool = False, many: bool = True):
    """One version of the learner (AReaL's): (params, opt_state, losses [C], diag) after training
    on the C rollouts of one update.

    π_prox is each rollout's log-probs at `params`, the version's parameters before its first
    step (no gradient). With minibatches M = 1 the update is one optimizer step on the mean
    of the rollouts' gradients (`engine.update`: the lr rule weights each by its staleness).
    With M > 1 every rollout's B prompts are split in M parts of B / M, and the learner
    takes M optimizer steps, step m on the m-th part of every rollout at the current θ
    (π_prox fixed), so the clip around π_prox binds from the second step on. `losses`:
    each rollout's loss, the mean over the M steps.

    rollouts: `Rollout` fields stacked on a leading [C] axis (many=True), or one rollout
    (many=False: C = 1, gradients unstacked, as `engine.update.aggregate` takes one).
    staleness, mask: [C] int32 / bool. padded: some update has no real rollout (then it
    changes nothing). The compiled replay (`Learner.update`) and the real runtime's learner
    (`runtime.numerics`) both call this, so a recorded run replays bitwise. diag: over the
    update's real rollouts, `_diagnostics` and the objective's clip_fraction and
    masked_fraction (means over the steps)."""
    def step(p, o, batch, prox):
        if many:
            (losses, aux), grads = lax.map(lambda a: _value_and_grad(task, p, *a), (batch, prox))
        else:
            (losses, aux), grads = _value_and_grad(task, p, batch, prox)
            losses, aux = losses[None], jax.tree.map(lambda v: v[None], aux)
        if padded:
            p, o = _update.server_update(tx, rules, p, o, grads, staleness, mask, rule_index)
        else:
            p, o = _update.apply(tx, p, o, _update.aggregate(grads, staleness, mask, rules, rule_index), True)
        return p, o, losses, aux

    logp = functools.partial(_prox_logp, task, params)
    prox = lax.map(logp, rollouts) if many else logp(rollouts)
    diag = _diagnostics(task, params, rollouts, prox, mask, many)   # unused outputs are dead code under jit
    if minibatches == 1:
        params, opt_state, losses, aux = step(params, opt_state, rollouts, prox)
        return params, opt_state, losses, _with_aux(diag, aux, mask)
    b = (rollouts.tokens.shape[1] if many else rollouts.tokens.shape[0])
    if b % minibatches:
        raise ValueError(f"minibatches = {minibatches} must divide the prompts per rollout ({b}): each optimizer "
                         "step trains on B / minibatches prompts of every rollout")
    size = b // minibatches

    def one(carry, m):
        p, o = carry
        take = (lambda t: jax.vmap(lambda x: _prompts(x, m * size, size))(t)) if many else (
            lambda t: _prompts(t, m * size, size))
        p, o, losses, aux = step(p, o, take(rollouts), take(prox))
        return (p, o), (losses, aux)

    (params, opt_state), (losses, aux) = lax.scan(one, (params, opt_state), jnp.arange(minibatches))
    return params, opt_state, jnp.mean(losses, axis=0), _with_aux(diag, jax.tree.map(lambda v: v.mean(0), aux), mask)


def _prox_logp(task, params, rollout):
    return lax.stop_gradient(task.logp(params, rollout))


def _value_and_grad(task, params, rollout, prox):
    def loss(p):
        return task.objective.loss_aux(task.logp(p, rollout), rollout.logp, prox, rollout.mask, rollout.rewards)
    return jax.value_and_grad(loss, has_aux=True)(params)


def _masked_mean(values, mask):
    """Mean of [C] values over the real slots (`mask`)."""
    return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _with_aux(diag: dict, aux: dict, mask) -> dict:
    """`diag` with the objective's aux ([C] per rollout) as means over the real rollouts."""
    if not diag:
        return diag
    return {**diag, **{k: _masked_mean(v, mask) for k, v in aux.items()}}


def _diagnostics(task, params, rollouts, prox, mask, many: bool) -> dict:
    """`objectives.diagnostics` of π_prox against π_behav (kl_behav, is_weight_mean,
    is_weight_max, ess, and the entropy of π_prox) per rollout, then means over the real
    ones (is_weight_max: the largest)."""
    from staleness.tasks.rl import objectives

    def one(args):
        r, lp = args
        return objectives.diagnostics(lp, r.logp, r.mask, lax.stop_gradient(task.entropy(params, r)))

    per = lax.map(one, (rollouts, prox)) if many else jax.tree.map(lambda v: v[None], one((rollouts, prox)))
    out = {k: _masked_mean(v, mask) for k, v in per.items() if k != "is_weight_max"}
    out["is_weight_max"] = jnp.max(jnp.where(mask, per["is_weight_max"], -jnp.inf))
    return out


class Learner(NamedTuple):
    """Static configuration of the learner step (a jit static argument; `engine.local.configure`
    of `policies.Rollout`). It keeps no per-worker state."""

    learner: bool = True
    streaming: bool = False
    inflight: bool = False   # in-flight segments: the replay step's `index` input is [C, 2, S] (`SEGMENT_START`,
    #                          `SEGMENT_VERSION`) and the behavior params [C, S, ...]
    minibatches: int = 1     # optimizer steps per version (`learner_update`)
    reprefill: bool = False  # a version reaching a rollout re-encodes its prefix (AReaL's partial rollouts), else
    #                          it keeps the earlier tokens' KV cache (PipelineRL's in-flight updates); a task
    #                          without a KV cache recomputes every prefix either way

    def rollouts(self, task, slot_mode: str, data_key, behavior, worker, iteration, segments=None):
        """The C rollouts of one update, each generated with the ops an actor uses for it
        alone (`generate_rollout`; `lax.map` over the slots, or one call per slot with
        slot_mode 'map'): stacked [C, ...], or the rollout itself for C == 1. `behavior`
        holds each slot's behavior params ([C, ...] leaves; [C, S, ...] with in-flight
        `segments` [C, 2, S])."""
        c = worker.shape[0]
        starts = None if segments is None else segments[:, SEGMENT_START]
        keep = not self.reprefill
        if c == 1:
            return generate_rollout(task, jax.tree.map(lambda a: a[0], behavior), data_key, worker[0], iteration[0],
                                    None if starts is None else starts[0], keep)

        def one(args):
            b, w, i, st = args
            return generate_rollout(task, b, data_key, w, i, st, keep)

        if slot_mode == "map":
            outs = [one(jax.tree.map(lambda a, k=k: a[k], (behavior, worker, iteration, starts))) for k in range(c)]
            return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
        return lax.map(one, (behavior, worker, iteration, starts))

    def update(self, task, static, consts, params, opt_state, behavior, slots, segments):
        """One update of the compiled replay: its rollouts (`rollouts`), then `learner_update`,
        and the KL between the version before and after it on the task's probe set
        (`RLTask.version_kl` on `consts['probe']`, the run's `RLTask.probe`). static: the
        replay's static configuration (`opt`, `rules`, `slot_mode`, `padded`); slots: the C
        slots' (worker, iteration, staleness, mask). Returns (params, opt_state, losses [C],
        diag: `DIAGNOSTICS`)."""
        worker, iteration, staleness, mask = slots
        rollouts = self.rollouts(task, static.slot_mode, consts["data_key"], behavior, worker, iteration, segments)
        new, opt_state, losses, diag = learner_update(task, static.opt, static.rules, consts["rule"], params,
                                                      opt_state, rollouts, staleness, mask, self.minibatches,
                                                      static.padded, many=worker.shape[0] > 1)
        diag["kl_version"] = task.version_kl(params, new, consts["probe"])
        return new, opt_state, losses, diag
