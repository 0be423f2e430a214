"""Pipeline tasks: a `Task` whose model is `Staged`, plus what the stages need.

    ptask = staleness.pipeline.tasks.get("digits-resmlp", num_stages=4, batch_size=32)
    ptask.task            # an ordinary staleness Task over the whole model
    ptask.apply(k, p, x)  # stage k's forward
    ptask.output_loss(logits, y)

Built-in names: digits-resmlp, mnist1d-resmlp (residual MLPs for CI, one
residual block per stage unless `blocks` says otherwise) and cifar10-resnet20
(ResNet-20 with GroupNorm, its 9 basic blocks split into K stages, CIFAR-10
from a local directory, see `staleness.tasks.cifar`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

from staleness.pipeline import model as _model
from staleness.tasks import cifar, data
from staleness.tasks.base import Task
from staleness.tasks.classification import classification_task

__all__ = ["PipelineTask", "NAMES", "get", "from_model"]

NAMES = ("digits-resmlp", "mnist1d-resmlp", "cifar10-resnet20")


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy over the batch (the last stage's loss)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineTask:
    """A classification `Task` over a `Staged` model. A pytree (its task's data are the leaves)."""

    task: Task
    model: _model.Staged
    output_loss: Any = cross_entropy

    @property
    def num_stages(self) -> int:
        return self.model.num_stages

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def batch_size(self) -> int:
        return self.task.batch_size

    def apply(self, k: int, params, x: jax.Array) -> jax.Array:
        """Stage k's forward: its output for input x (raw inputs for k = 0, logits for k = K-1)."""
        return self.model.stages[k].apply({"params": params}, x)

    def init_stage_params(self, key: jax.Array) -> tuple:
        return _model.stage_params(self.task.init_params(key))

    def minibatch(self, key: jax.Array, batch: Any):
        """Batch `batch` of the run: the task's minibatch of worker 0, iteration `batch`."""
        return self.task.minibatch(key, 0, batch)

    def evaluate(self, per_stage_params) -> dict[str, jax.Array]:
        return self.task.evaluate(_model.join_params(per_stage_params))


jax.tree_util.register_dataclass(PipelineTask, data_fields=["task"], meta_fields=["model", "output_loss"])


def from_model(name: str, model: _model.Staged, arrays: data.Arrays, *, batch_size: int, seed: int = 0,
               **kwargs) -> PipelineTask:
    """A PipelineTask from a Staged model and in-memory arrays (one data stream: num_workers = 1)."""
    task = classification_task(name, model, arrays, batch_size=batch_size, num_workers=1, seed=seed, **kwargs)
    return PipelineTask(task, model)


def get(name: str, *, num_stages: int, batch_size: int = 32, blocks: int | None = None, width: int = 64,
        data_dir: Any = None, seed: int = 0, augment: bool = True, mnist1d_samples: int = 5000) -> PipelineTask:
    """Built-in pipeline task `name` split into `num_stages` stages.

    Args:
      name: one of NAMES.
      num_stages: K.
      batch_size: examples per batch (GPipe splits it into micro-batches).
      blocks: residual blocks of the MLP tasks (default: K, one per stage);
        for cifar10-resnet20 the basic blocks per ResNet stage (default 3: ResNet-20,
        9 blocks, so K <= 9).
      width: width of the residual MLP.
      data_dir: CIFAR-10 directory (or $STALENESS_CIFAR_DIR).
    """
    if name not in NAMES:
        raise ValueError(f"unknown pipeline task {name!r}; valid names are {', '.join(NAMES)}")
    if name == "cifar10-resnet20":
        model = _model.resnet20_stages(num_stages, blocks=3 if blocks is None else blocks)
        arrays = cifar.load(data_dir, 10)
        train_tf, test_tf = cifar.make_transforms(*cifar.channel_stats(arrays.x_train), augment=bool(augment))
        return from_model(name, model, arrays, batch_size=batch_size, seed=seed, train_transform=train_tf,
                          test_transform=test_tf, eval_chunk=500)
    model = _model.residual_mlp(num_stages if blocks is None else blocks, num_stages, width=width, hidden=width)
    arrays = data.digits() if name == "digits-resmlp" else data.mnist1d(mnist1d_samples)
    return from_model(name, model, arrays, batch_size=batch_size, seed=seed)
