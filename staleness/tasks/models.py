"""Small flax.linen models for the built-in tasks.

None of them keeps state outside its params (no BatchNorm): the loss must be a
pure function of (params, batch) so that a stale gradient is exactly "the
gradient at an older version of the params". Running batch statistics would be
a second, separately-stale piece of server state, and how stale normalisation
statistics affect convergence is a research question of its own; ResNet-20
therefore uses GroupNorm, which normalises within each example.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

CONV_IMPLS = ("auto", "patches", "lax")


class Conv(nn.Module):
    """An N-d convolution with "SAME" padding, laid out like `flax.linen.Conv`.

    Params "kernel" [*kernel_size, in, features] and "bias" [features], with
    nn.Conv's default initialisers, so the two are interchangeable. Two
    implementations compute the same function (up to float32 rounding):
    - "patches": gather the kernel-offset slices of the padded input into
      [B, *out, prod(kernel_size)·in] and multiply by the flattened kernel. XLA:CPU
      runs a convolution (and its gradients) inside a `while` loop, i.e. inside
      `lax.scan`, an order of magnitude slower than outside one
      (jax-ml/jax#12868; measured 16x for a 3x3 conv gradient here), and the
      engine replays schedules in a scan; the matmul form keeps its speed.
    - "lax": `lax.conv_general_dilated` (cuDNN on GPU).
    "auto" (default) picks "patches" when the default backend is CPU, else "lax".
    Measured on a 2-core CPU, ResNet-sized 3x3 layer, batch 128: gradient inside
    a scan 1.04 s ("lax") vs 0.08 s ("patches"); a lone jitted gradient 0.03 s
    vs 0.14 s. Pick "lax" for CPU code that never runs a model inside a loop.
    """

    features: int
    kernel_size: Sequence[int]
    strides: Sequence[int] | None = None
    use_bias: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.impl not in CONV_IMPLS:
            raise ValueError(f"impl must be one of {CONV_IMPLS}; got {self.impl!r}.")
        ks = tuple(self.kernel_size)
        strides = tuple(self.strides) if self.strides is not None else (1,) * len(ks)
        kernel = self.param("kernel", self.kernel_init, (*ks, x.shape[-1], self.features), jnp.float32)
        impl = self.impl
        if impl == "auto":
            impl = "patches" if jax.default_backend() == "cpu" else "lax"
        if impl == "lax":
            spatial = "".join("HWDXYZ"[: len(ks)])
            dims = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
            y = jax.lax.conv_general_dilated(x, kernel, strides, "SAME", dimension_numbers=dims)
        else:
            y = _conv_patches(x, kernel, strides)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        return y


def _conv_patches(x: jax.Array, kernel: jax.Array, strides: tuple[int, ...]) -> jax.Array:
    """SAME-padded strided convolution as one matmul over gathered kernel offsets."""
    ks, spatial = kernel.shape[:-2], x.shape[1:-1]
    out = [-(-n // s) for n, s in zip(spatial, strides, strict=True)]
    pads = [max((o - 1) * s + k - n, 0) for o, s, k, n in zip(out, strides, ks, spatial, strict=True)]
    x = jnp.pad(x, ((0, 0), *((p // 2, p - p // 2) for p in pads), (0, 0)))
    cols = []
    for offset in np.ndindex(*ks):  # kernel-major order matches kernel.reshape(-1, features)
        stop = [first + (n - 1) * s + 1 for first, n, s in zip(offset, out, strides, strict=True)]
        cols.append(jax.lax.slice(x, (0, *offset, 0), (x.shape[0], *stop, x.shape[-1]), (1, *strides, 1)))
    patches = jnp.concatenate(cols, axis=-1)
    return patches @ kernel.reshape(-1, kernel.shape[-1])


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
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for c in self.channels:
            x = nn.relu(Conv(c, (3, 3), impl=self.conv_impl)(x))
        # 2x2 average pooling, written out: flax's avg_pool divides by an int and
        # fails under jax_numpy_dtype_promotion="strict".
        x = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
        return nn.Dense(self.num_outputs)(x.reshape((x.shape[0], -1)))


class CNN1D(nn.Module):
    """Three strided 1-D conv layers and a linear head. Input [B, L] or [B, L, C]."""

    channels: Sequence[int] = (32, 32, 32)
    kernel_sizes: Sequence[int] = (5, 3, 3)
    num_outputs: int = 10
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim == 2:
            x = x[..., None]
        for c, k in zip(self.channels, self.kernel_sizes, strict=True):
            x = nn.relu(Conv(c, (k,), strides=(2,), impl=self.conv_impl)(x))
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
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        conv = functools.partial(Conv, use_bias=False, kernel_init=_he_init, impl=self.conv_impl)
        y = conv(self.features, (3, 3), (self.strides,) * 2)(x)
        y = nn.relu(nn.GroupNorm(num_groups=self.groups)(y))
        y = conv(self.features, (3, 3))(y)
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
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = Conv(self.widths[0], (3, 3), use_bias=False, kernel_init=_he_init, impl=self.conv_impl)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        for stage, width in enumerate(self.widths):
            for block in range(self.blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(width, strides, self.groups, self.conv_impl)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_outputs)(x)


def resnet20(num_outputs: int, conv_impl: str = "auto") -> ResNet:
    """ResNet-20 for CIFAR with GroupNorm (8 groups) instead of BatchNorm."""
    return ResNet(blocks=3, num_outputs=num_outputs, conv_impl=conv_impl)
