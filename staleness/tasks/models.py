"""Small flax.linen models for the built-in tasks.

None of them keeps state outside its params (no BatchNorm): the loss must be a
pure function of (params, batch) so that a stale gradient is exactly "the
gradient at an older version of the params". Running batch statistics would be
a second, separately-stale piece of server state, and how stale normalisation
statistics affect convergence is a research question of its own; ResNet-20
therefore uses GroupNorm, which normalises within each example.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs; returns logits [B, num_outputs]."""

    hidden: Sequence[int]
    num_outputs: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_outputs)(x)


class CNN2D(nn.Module):
    """Two 3x3 conv layers, 2x2 average pooling, a linear head. Input [B, H, W, C]."""

    channels: Sequence[int] = (16, 32)
    num_outputs: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for c in self.channels:
            x = nn.relu(nn.Conv(c, (3, 3), padding="SAME")(x))
        # 2x2 average pooling, written out: flax's avg_pool divides by an int and
        # fails under jax_numpy_dtype_promotion="strict".
        x = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
        return nn.Dense(self.num_outputs)(x.reshape((x.shape[0], -1)))


class CNN1D(nn.Module):
    """Three strided 1-D conv layers and a linear head. Input [B, L] or [B, L, C]."""

    channels: Sequence[int] = (32, 32, 32)
    kernel_sizes: Sequence[int] = (5, 3, 3)
    num_outputs: int = 10

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim == 2:
            x = x[..., None]
        for c, k in zip(self.channels, self.kernel_sizes, strict=True):
            x = nn.relu(nn.Conv(c, (k,), strides=(2,), padding="SAME")(x))
        return nn.Dense(self.num_outputs)(x.reshape((x.shape[0], -1)))


_he_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with GroupNorm, identity shortcut.

    When the block downsamples, the shortcut is He et al.'s option A (CIFAR
    ResNets): stride-2 subsampling plus zero channel padding, which adds no
    parameters.
    """

    features: int
    strides: int = 1
    groups: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.Conv(self.features, (3, 3), (self.strides,) * 2, padding="SAME",
                    use_bias=False, kernel_init=_he_init)(x)
        y = nn.relu(nn.GroupNorm(num_groups=self.groups)(y))
        y = nn.Conv(self.features, (3, 3), padding="SAME", use_bias=False, kernel_init=_he_init)(y)
        y = nn.GroupNorm(num_groups=self.groups)(y)
        if x.shape != y.shape:
            x = x[:, :: self.strides, :: self.strides, :]
            extra = self.features - x.shape[-1]
            x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
        return nn.relu(x + y)


class ResNet(nn.Module):
    """CIFAR ResNet (He et al. 2016, sec. 4.2): 3 stages of `blocks` basic blocks.

    `blocks=3` is ResNet-20 (6·3+2 layers), about 0.27M parameters; widths 16/32/64.
    Input [B, 32, 32, 3]; returns logits [B, num_outputs].
    """

    blocks: int = 3
    widths: Sequence[int] = (16, 32, 64)
    num_outputs: int = 10
    groups: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Conv(self.widths[0], (3, 3), padding="SAME", use_bias=False, kernel_init=_he_init)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        for stage, width in enumerate(self.widths):
            for block in range(self.blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(width, strides, self.groups)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_outputs)(x)


def resnet20(num_outputs: int) -> ResNet:
    """ResNet-20 for CIFAR with GroupNorm (8 groups) instead of BatchNorm."""
    return ResNet(blocks=3, num_outputs=num_outputs)
