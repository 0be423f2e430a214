"""Local updates: a worker's inner steps and the delta it pushes (Local SGD, DiLoCo).

A worker of a local-update method (a policy whose `work` is
`policies.LocalSteps`) pulls the global parameters θ, takes H inner steps of
its inner optimizer on its own minibatches, and pushes the delta

    Δ = θ − θ_H        (an "outer gradient": θ − Δ is the worker's end point)

which the server aggregates like gradients (lr-rule weights, mean over the
update's slots) and applies with its outer optimizer
(`engine.update.server_update`): outer SGD with learning rate 1 averages the
workers' parameters (Local SGD); Nesterov SGD (0.7, 0.9) is DiLoCo. The inner
optimizer's state is the worker's and persists across its rounds.

Inner step h of round r of worker w uses the minibatch of (w, r·H_max + h), so
every inner step has its own examples (H_max: the largest number of steps of
any worker; Dynamic Local Updates give slower workers fewer, the rest of the
scan is masked). `local_delta` is shared by the compiled replay and the real
runtime's workers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

__all__ = ["Local", "local_delta", "init_states"]


class Local(NamedTuple):
    """Static configuration of a local-update replay (hashable: a jit static argument).

    inner: the inner optimizer's optax transformation. max_steps: H_max.
    masked: whether workers take different numbers of steps (a step mask is applied).
    """

    inner: Any
    max_steps: int
    masked: bool


def local_delta(task, local: Local, params, inner_state, data_key, worker, round_, steps):
    """H inner steps from `params`: returns (mean inner loss, Δ = params − θ_H, inner state).

    steps: this worker's number of steps (<= local.max_steps; traced).
    """
    inner, h_max = local.inner, local.max_steps
    base = round_ * h_max

    def step(carry, h):
        p, s, total = carry
        loss, g = jax.value_and_grad(task.loss)(p, task.minibatch(data_key, worker, base + h))
        updates, s_new = inner.update(g, s, p)
        p_new = optax.apply_updates(p, updates)
        if local.masked:
            on = h < steps
            p_new = jax.tree.map(lambda a, b: jnp.where(on, a, b), p_new, p)
            s_new = jax.tree.map(lambda a, b: jnp.where(on, a, b), s_new, s)
            loss = jnp.where(on, loss, 0.0)
        return (p_new, s_new, total + loss), None

    (end, state, total), _ = lax.scan(step, (params, inner_state, jnp.zeros((), jnp.float32)),
                                      jnp.arange(h_max, dtype=jnp.int32))
    delta = jax.tree.map(lambda a, b: a - b, params, end)
    count = steps if local.masked else h_max
    return total / jnp.asarray(count, jnp.float32), delta, state


def init_states(inner_opt, params, num_workers: int):
    """[λ] stacked fresh inner-optimizer states (each with the inner learning rate)."""
    one = inner_opt.init(params)
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + jnp.shape(a)).copy(), one)
