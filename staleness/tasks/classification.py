"""`classification_task`: a cross-entropy Task from a flax module and in-memory arrays."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from staleness.tasks import data
from staleness.tasks.base import Task
from staleness.tasks.batches import PyTree
from staleness.tasks.checks import check_common, check_shard
from staleness.tasks.errors import ModelKindError
from staleness.tasks.flax_models import model_kind


@functools.lru_cache(maxsize=64)
def _classifier_fns(model: nn.Module, input_shape: tuple[int, ...], test_transform: Any):
    """(jitted init_fn, loss_fn, per_example) for a flax classifier. Cached so that tasks sharing
    a model (different batch sizes, seeds, partitions) share compiled code."""

    def init_fn(key: jax.Array) -> PyTree:
        return model.init(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]

    def loss_fn(params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
        logits = model.apply({"params": params}, batch["x"])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    def per_example(params: PyTree, x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
        if test_transform is not None:
            x = test_transform(x)
        return data.classification_metrics(model.apply({"params": params}, x), y)

    return jax.jit(init_fn), loss_fn, per_example


def classification_task(name: str, model: nn.Module, arrays: data.Arrays, *, batch_size: int, num_workers: int = 1,
                        partition: str = "iid", seed: int = 0,
                        train_transform: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
                        test_transform: Callable[[jax.Array], jax.Array] | None = None,
                        eval_chunk: int = data.DEFAULT_EVAL_CHUNK) -> Task:
    """A cross-entropy classification task from a flax module and in-memory arrays.

    Args:
      name, batch_size, num_workers, partition, seed: as `Task`'s (seed: of the partition layout).
      model: flax.linen module mapping inputs [B, ...] to logits [B, classes]; it
        must not use mutable collections (no BatchNorm). For nnx modules, other
        losses or dict data use `staleness.tasks.from_flax`.
      arrays: `data.Arrays` of NumPy arrays; labels are int class ids.
      train_transform: optional (key, raw x batch) -> model input, applied to each
        minibatch (e.g. normalisation + augmentation).
      test_transform: optional raw x batch -> model input for evaluation.
      eval_chunk: test examples per step of the chunked evaluation loop.

    Returns:
      A `Task` with metric_names ("loss", "accuracy").
    """
    if not isinstance(model, nn.Module):
        kind = model_kind(model)   # ModelKindError for a class or a non-flax object
        raise ModelKindError(f"classification_task takes a flax.linen Module; got a flax {kind} module "
                             f"{type(model).__name__}. Build nnx models with staleness.tasks.from_flax(model, "
                             "'cross_entropy', (x, y), ...).")
    check_common(batch_size, num_workers, partition, seed)
    train_size, test_size = len(arrays.y_train), len(arrays.y_test)
    if train_size == 0 or test_size == 0:
        raise ValueError(f"task {name!r} needs training and test examples; got {train_size} and {test_size}.")
    check_shard(partition, num_workers, train_size, name)
    if isinstance(eval_chunk, bool) or not isinstance(eval_chunk, int) or eval_chunk < 1:
        raise ValueError(f"eval_chunk must be an int >= 1 (test examples per evaluation step); got {eval_chunk!r}.")
    fns_args = (model, tuple(arrays.x_train.shape[1:]), test_transform)
    try:
        hash(fns_args)
    except TypeError:  # an unhashable module: build uncached
        init_fn, loss_fn, per_example = _classifier_fns.__wrapped__(*fns_args)
    else:
        init_fn, loss_fn, per_example = _classifier_fns(*fns_args)
    arrays_data = {"x_train": arrays.x_train, "y_train": arrays.y_train.astype(np.int32),
                   **data.sampler_data(arrays.y_train, partition, num_workers, seed, name=repr(name)),
                   **data.chunked_test_data(arrays.x_test, arrays.y_test.astype(np.int32), eval_chunk)}
    return Task(
        name=name, batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=("loss", "accuracy"), train_size=train_size, test_size=test_size, seed=seed,
        init_fn=init_fn, loss_fn=loss_fn, sample_fn=data.make_sample_fn(batch_size, partition, train_size,
                                                                      train_transform),
        gather_fn=data.make_gather_fn(train_transform), eval_fn=data.make_eval_fn(per_example, test_size),
        data=data.device_data(arrays_data),
    )
