"""What a minibatch is: the types, the no-example sentinel, the per-example key.

Every task's `sample_fn` returns a `Batch`: {"x": [μ, ...], "y": [μ], "index": [μ]} ("index": the
examples' positions in the training set, `NO_EXAMPLE` for tasks without data). This module is the
vocabulary both `staleness.tasks.base` (the `Task` value) and `staleness.tasks.data` (the samplers)
speak, so neither has to import the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any
Batch = dict[str, jax.Array]

NO_EXAMPLE = -1
"""Sentinel in `batch["index"]` for tasks without a training set (quadratic)."""


def example_key(key: jax.Array, worker: Any, iteration: Any) -> jax.Array:
    """The per-(worker, iteration) key every minibatch is drawn from."""
    return jax.random.fold_in(jax.random.fold_in(key, worker), iteration)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Concatenate minibatches along the example axis.

    The large-batch equivalent of one BSP round is
    `concat_batches([task.minibatch(key, w, i) for w in range(λ)])`; since every loss is a mean over
    equal-sized batches, `task.loss` on it equals the mean of the λ per-worker losses. A batch
    stacked by `vmap` over workers ([λ, μ, ...]) is `concat_batches(list_of_it)` or
    `jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), b)`.
    """
    if not batches:
        raise ValueError("concat_batches needs at least one batch; got an empty sequence.")
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *batches)
