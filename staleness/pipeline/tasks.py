"""Pipeline tasks: a `Task` whose model is `Staged`, plus what the stages need.

    ptask = staleness.pipeline.tasks.get("digits-resmlp", num_stages=4, batch_size=32)
    ptask.task            # an ordinary staleness Task over the whole model
    ptask.apply(k, p, x)  # stage k's forward
    ptask.output_loss(logits, y)

Built-in names: digits-resmlp, mnist1d-resmlp (residual MLPs for CI), cifar10-resnet20
(ResNet-20 with GroupNorm, CIFAR-10 from a local directory, see `staleness.tasks.cifar`) and
stdlib-lm (the byte-level transformer of `staleness.tasks.lm`, see `stdlib_lm`); `get` splits them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax

from staleness.pipeline import model as _model
from staleness.tasks import cifar, data
from staleness.tasks import lm as _lm
from staleness.tasks import transformer as _transformer
from staleness.tasks.base import Task
from staleness.tasks.classification import classification_task

__all__ = ["PipelineTask", "NAMES", "LM_OPTIONS", "get", "from_model", "stdlib_lm", "lm_stage_params",
           "lm_params_from_stages"]

NAMES = ("digits-resmlp", "mnist1d-resmlp", "cifar10-resnet20", "stdlib-lm")
LM_OPTIONS = ("num_heads", "context", "corpus_bytes", "eval_windows")
"""Options of stdlib-lm that `get(..., lm_options={...})` passes on (see `staleness.tasks.lm.stdlib_lm`)."""


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


def get(name: str, *, num_stages: int, batch_size: int = 32, blocks: int | None = None, width: int | None = None,
        data_dir: Any = None, seed: int = 0, augment: bool = True, mnist1d_samples: int = 5000,
        lm_options: dict | None = None) -> PipelineTask:
    """Built-in pipeline task `name` split into `num_stages` stages.

    Args:
      name: one of NAMES.
      num_stages: K.
      batch_size: examples per batch (GPipe splits it into micro-batches).
      blocks: residual blocks of the MLP tasks (default: K, one per stage);
        for cifar10-resnet20 the basic blocks per ResNet stage (default 3: ResNet-20,
        9 blocks, so K <= 9); for stdlib-lm the transformer blocks (default max(K, 2)).
      width: width of the residual MLP (default 64); d_model of stdlib-lm (default 128).
      data_dir: CIFAR-10 directory (or $STALENESS_CIFAR_DIR).
      lm_options: stdlib-lm only: {option: value} for the options in LM_OPTIONS.
    """
    if name not in NAMES:
        raise ValueError(f"unknown pipeline task {name!r}; valid names are {', '.join(NAMES)}")
    if name == "stdlib-lm":
        num_layers = max(num_stages, 2) if blocks is None else blocks
        unknown = sorted(set(lm_options or {}) - set(LM_OPTIONS))
        if unknown:
            raise ValueError(f"lm_options {unknown} are not options of stdlib-lm; valid: {', '.join(LM_OPTIONS)}")
        return stdlib_lm(num_stages, batch_size=batch_size, num_layers=num_layers,
                         d_model=128 if width is None else width, seed=seed, **(lm_options or {}))
    if lm_options:
        raise ValueError(f"lm_options apply to stdlib-lm only; got {sorted(lm_options)} for {name!r}")
    width = 64 if width is None else width
    if name == "cifar10-resnet20":
        model = _model.resnet20_stages(num_stages, blocks=3 if blocks is None else blocks)
        arrays = cifar.load(data_dir, 10)
        train_tf, test_tf = cifar.make_transforms(*cifar.channel_stats(arrays.x_train), augment=bool(augment))
        return from_model(name, model, arrays, batch_size=batch_size, seed=seed, train_transform=train_tf,
                          test_transform=test_tf, eval_chunk=500)
    model = _model.residual_mlp(num_stages if blocks is None else blocks, num_stages, width=width, hidden=width)
    arrays = data.digits() if name == "digits-resmlp" else data.mnist1d(mnist1d_samples)
    return from_model(name, model, arrays, batch_size=batch_size, seed=seed)


# -- the byte-level transformer LM ----------------------------------------------------
def stdlib_lm(num_stages: int, *, batch_size: int = 32, num_layers: int = 2, d_model: int = 128,
              num_heads: int = 4, context: int = 64, corpus_bytes: int = _lm.DEFAULT_CORPUS_BYTES,
              eval_windows: int = 256, seed: int = 0) -> PipelineTask:
    """stdlib-lm (`staleness.tasks.lm`) with its `num_layers` blocks in `num_stages` stages.

    Stage 0 is the token + positional embedding and the first block(s), stage K-1
    the last block(s) and the head (final LayerNorm, output projection); blocks
    are spread as `model.balanced_sizes`. Stage inputs are [B, T] tokens (stage 0)
    and [B, T, d_model] activations; the last stage returns [B, T, 256] logits and
    `output_loss` is the mean next-byte cross-entropy, the task's own loss. The
    unsplit model's params map to the stages with `lm_stage_params`.
    """
    _lm.check_model_options(num_layers, d_model, num_heads, context)
    embed, blocks, head = _transformer.parts(num_layers, d_model, num_heads, context)
    model = _model.split(blocks, num_stages, first=embed, last=head)
    task = _lm.lm_task(_lm.NAME, model, context=context, batch_size=batch_size, num_workers=1, seed=seed,
                       corpus_bytes=corpus_bytes, eval_windows=eval_windows)
    return PipelineTask(task, model)


def lm_stage_params(params, num_stages: int) -> tuple:
    """Params of the unsplit `Transformer` ({"embed", "block_i", "head"}) -> per-stage params
    of the `stdlib_lm(num_stages)` model ({"layers_j"} of each stage), the same arrays."""
    num_layers = sum(1 for k in params if k.startswith("block_"))
    stages, i = [], 0
    for k, size in enumerate(_model.balanced_sizes(num_layers, num_stages)):
        layers = ([params["embed"]] if k == 0 else []) + [params[f"block_{j}"] for j in range(i, i + size)]
        if k == num_stages - 1:
            layers.append(params["head"])
        i += size
        stages.append({f"layers_{j}": p for j, p in enumerate(layers)})
    return tuple(stages)


def lm_params_from_stages(per_stage) -> dict:
    """The inverse of `lm_stage_params`: per-stage params -> the unsplit `Transformer`'s params."""
    layers = [stage[f"layers_{j}"] for stage in per_stage for j in range(len(stage))]
    embed, *blocks, head = layers
    return {"embed": embed, **{f"block_{i}": b for i, b in enumerate(blocks)}, "head": head}
