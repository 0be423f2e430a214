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

In-flight weight updates (`rl_inflight`): a rollout's tokens come from several
versions. The slot then reads one version per segment from the ring (the
`index` input of the replay step carries [2, S]: each segment's first
completion position and its version), and generation samples position t with
its segment's version (`decode.sample(starts=)`), so its behavior log-probs are
that version's.

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

__all__ = ["Learner", "SEGMENT_START", "SEGMENT_VERSION", "generation_key", "generate_rollout", "learner_gradient", "behavior_loss", "rollout_gradient",
           "GENERATION_SALT"]

GENERATION_SALT = 0x6E6
"""Folded into the data key for the generation keys (the prompts use the data key itself)."""


def generation_key(data_key, actor, iteration):
    """The sampling key of `actor`'s rollout `iteration`."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(data_key, GENERATION_SALT), actor), iteration)


def generate_rollout(task, behavior, data_key, actor, iteration, starts=None):
    """`actor`'s rollout `iteration`: its prompts, sampled from `behavior` params (what an
    actor computes; the real runtime's workers call it). starts: [S] first position of each
    in-flight segment, `behavior` then stacked per segment (None: one version)."""
    idx = task.prompt_indices(data_key, actor, iteration)
    return task.generate(behavior, generation_key(data_key, actor, iteration), idx, starts)


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


class Learner(NamedTuple):
    """Static configuration of the learner step (a jit static argument; `Work.engine_local`
    of `policies.Rollout`). It keeps no per-worker state.

    inflight: rollouts carry in-flight segments: the replay step's `index` input is
    [C, 2, S] (`SEGMENT_START`, `SEGMENT_VERSION`) and the behavior params [C, S, ...]."""

    learner: bool = True
    streaming: bool = False
    inflight: bool = False

    def slots(self, task, slot_mode: str, data_key, params, behavior, worker, iteration, segments=None):
        """(losses [C], grads [C, ...] or one pytree for C == 1) of one update's C rollouts;
        `behavior` holds each slot's behavior params ([C, ...] leaves; [C, S, ...] with
        in-flight `segments` [C, 2, S])."""
        c = worker.shape[0]
        starts = None if segments is None else segments[:, SEGMENT_START]
        if c == 1:
            loss, grad, _ = rollout_gradient(task, params, jax.tree.map(lambda a: a[0], behavior), data_key,
                                             worker[0], iteration[0], None if starts is None else starts[0])
            return loss[None], grad

        def one(args):
            b, w, i, st = args
            loss, grad, _ = rollout_gradient(task, params, b, data_key, w, i, st)
            return loss, grad

        if slot_mode == "map":
            outs = [one(jax.tree.map(lambda a, k=k: a[k], (behavior, worker, iteration, starts))) for k in range(c)]
            return jnp.stack([o[0] for o in outs]), jax.tree.map(lambda *g: jnp.stack(g), *[o[1] for o in outs])
        return lax.map(one, (behavior, worker, iteration, starts))
