"""Models split into K pipeline stages.

A `Staged` model is an ordinary flax.linen module (so a `Task` can train and
evaluate it whole, and plain backpropagation is `jax.grad` of its loss) whose
parameters are `{"stages_0": ..., ..., "stages_{K-1}": ...}`: stage k is the
submodule `model.stages[k]`, applied to the previous stage's output.

    model = split(blocks, num_stages=4, first=embed, last=head)

groups blocks into K contiguous stages (`split`); a list of K stage modules is
`Staged(tuple(modules))`. Stage 0 takes the task's inputs, the last stage returns logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from staleness.tasks import models as _models

__all__ = ["Chain", "Embed", "Head", "Residual", "Staged", "balanced_sizes", "resnet20_stages",
           "residual_mlp", "split", "stage_params", "join_params"]


class Chain(nn.Module):
    """Layers applied in order (one pipeline stage)."""

    layers: tuple[nn.Module, ...]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


class Staged(nn.Module):
    """K stages applied in order; params {"stages_k": params of stage k}."""

    stages: tuple[nn.Module, ...]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for stage in self.stages:
            x = stage(x)
        return x

    @property
    def num_stages(self) -> int:
        return len(self.stages)


def stage_params(params) -> tuple:
    """Full-model params -> tuple of per-stage params."""
    return tuple(params[f"stages_{k}"] for k in range(len(params)))


def join_params(per_stage: Sequence) -> dict:
    """Tuple of per-stage params -> full-model params."""
    return {f"stages_{k}": p for k, p in enumerate(per_stage)}


def balanced_sizes(num_blocks: int, num_stages: int) -> list[int]:
    """Blocks per stage: as equal as possible, earlier stages take the remainder."""
    q, r = divmod(num_blocks, num_stages)
    return [q + (1 if i < r else 0) for i in range(num_stages)]


def split(blocks: Sequence[nn.Module], num_stages: int, *, first: nn.Module | None = None,
          last: nn.Module | None = None) -> Staged:
    """Group `blocks` into `num_stages` contiguous stages.

    Args:
      blocks: the model's blocks in order (identical or not).
      num_stages: K, 1 <= K <= len(blocks).
      first: optional input layer, prepended to stage 0.
      last: optional output layer (e.g. the classifier head), appended to stage K-1.
    """
    blocks = list(blocks)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages = {num_stages!r} must be an integer >= 1")
    if num_stages > len(blocks):
        raise ValueError(f"num_stages = {num_stages} is more than the model's {len(blocks)} blocks; "
                         f"give num_stages between 1 and {len(blocks)} (or a model with more blocks)")
    stages, i = [], 0
    for k, size in enumerate(balanced_sizes(len(blocks), num_stages)):
        layers = blocks[i:i + size]
        i += size
        if k == 0 and first is not None:
            layers = [first, *layers]
        if k == num_stages - 1 and last is not None:
            layers = [*layers, last]
        stages.append(Chain(tuple(layers)))
    return Staged(tuple(stages))


# -- residual MLP -----------------------------------------------------------------
class Embed(nn.Module):
    """Flatten, Dense(width), ReLU: the input layer of the residual MLP."""

    width: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.relu(nn.Dense(self.width)(x.reshape((x.shape[0], -1))))


class Residual(nn.Module):
    """x + Dense(ReLU(Dense(x))), width preserved."""

    width: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.relu(nn.Dense(self.hidden)(x))
        return x + nn.Dense(self.width, kernel_init=nn.initializers.lecun_normal())(h)


class Head(nn.Module):
    """The classifier: Dense(num_outputs) on [B, width] (or global mean pool first on images)."""

    num_outputs: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim > 2:
            x = jnp.mean(x, axis=tuple(range(1, x.ndim - 1)))
        return nn.Dense(self.num_outputs)(x)


def residual_mlp(num_blocks: int, num_stages: int, *, width: int = 64, hidden: int = 64,
                 num_outputs: int = 10) -> Staged:
    """A residual MLP: Embed(width), `num_blocks` Residual blocks, Head, in K stages."""
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks = {num_blocks!r} must be an integer >= 1")
    blocks = [Residual(width, hidden) for _ in range(num_blocks)]
    return split(blocks, num_stages, first=Embed(width), last=Head(num_outputs))


# -- ResNet ---------------------------------------------------------------------------
_HE_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")  # as staleness.tasks.models.ResNet


class Stem(nn.Module):
    """ResNet input layer: 3x3 conv, GroupNorm, ReLU."""

    width: int = 16
    groups: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _models.Conv(self.width, (3, 3), use_bias=False, kernel_init=_HE_INIT)(x)
        return nn.relu(nn.GroupNorm(num_groups=self.groups)(x))


def resnet20_stages(num_stages: int, *, num_outputs: int = 10, blocks: int = 3,
                    widths: Sequence[int] = (16, 32, 64), groups: int = 8) -> Staged:
    """The CIFAR ResNet of `staleness.tasks.models.ResNet` (ResNet-20 for blocks=3, with
    GroupNorm) as 3·blocks basic blocks split into K stages; stem on stage 0, head on the last."""
    body = []
    for stage, width in enumerate(widths):
        for b in range(blocks):
            body.append(_models.BasicBlock(features=width, strides=2 if stage > 0 and b == 0 else 1, groups=groups))
    return split(body, num_stages, first=Stem(widths[0], groups), last=Head(num_outputs))
