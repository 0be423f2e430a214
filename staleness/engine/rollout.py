"""The learner step of asynchronous RL inside the compiled replay (data staleness).

For one update slot (an actor's rollout, one row of the schedule):

    idx     = task.prompt_indices(data_key, actor, iteration)      # its B prompts
    rollout = task.generate(θ_v, key(actor, iteration), idx)        # sampled from the ring's version v
    loss, g = value_and_grad(task.loss)(θ_u, rollout, prox)         # at the learner's current version u

where v is the slot's pull (behavior) version, read from the ring of versions
like a stale gradient's parameters, and u the version the update applies to.
π_prox (decoupled PPO) is the learner's version before this update, θ_u itself
(no gradient through it). The update is then the engine's one server update
(`engine.update`) on the mean of the slots' gradients, as for any policy.

The generation key of (actor, iteration) is folded from the run's data key, so
a rollout is a pure function of the seed, its row and its behavior parameters:
the simulator's timing (`RLTask.rollout_sizes`) and the replay see the same
prompts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["Learner", "generation_key", "generate_rollout", "learner_gradient", "behavior_loss", "rollout_gradient",
           "GENERATION_SALT"]

GENERATION_SALT = 0x6E6
"""Folded into the data key for the generation keys (the prompts use the data key itself)."""


def generation_key(data_key, actor, iteration):
    """The sampling key of `actor`'s rollout `iteration`."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(data_key, GENERATION_SALT), actor), iteration)


def generate_rollout(task, behavior, data_key, actor, iteration):
    """`actor`'s rollout `iteration`: its prompts, sampled from `behavior` params (what an
    actor computes; the real runtime's workers call it)."""
    idx = task.prompt_indices(data_key, actor, iteration)
    return task.generate(behavior, generation_key(data_key, actor, iteration), idx)


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


def rollout_gradient(task, params, behavior, data_key, actor, iteration):
    """(loss, grad, mean reward) of one rollout: generated with `behavior` params, the
    objective and its gradient at `params` (π_prox = `params`, without gradient)."""
    rollout = generate_rollout(task, behavior, data_key, actor, iteration)
    loss, grad = learner_gradient(task, params, rollout)
    return loss, grad, jnp.mean(rollout.rewards)


class Learner(NamedTuple):
    """Static configuration of the learner step (a jit static argument; `Work.engine_local`
    of `policies.Rollout`). It keeps no per-worker state."""

    learner: bool = True
    streaming: bool = False

    def slots(self, task, slot_mode: str, data_key, params, behavior, worker, iteration):
        """(losses [C], grads [C, ...] or one pytree for C == 1) of one update's C rollouts;
        `behavior` holds each slot's behavior params ([C, ...] leaves)."""
        c = worker.shape[0]
        if c == 1:
            loss, grad, _ = rollout_gradient(task, params, jax.tree.map(lambda a: a[0], behavior), data_key,
                                             worker[0], iteration[0])
            return loss[None], grad

        def one(args):
            b, w, i = args
            loss, grad, _ = rollout_gradient(task, params, b, data_key, w, i)
            return loss, grad

        if slot_mode == "map":
            outs = [one(jax.tree.map(lambda a, k=k: a[k], (behavior, worker, iteration))) for k in range(c)]
            return jnp.stack([o[0] for o in outs]), jax.tree.map(lambda *g: jnp.stack(g), *[o[1] for o in outs])
        return jax.vmap(one)((behavior, worker, iteration))
