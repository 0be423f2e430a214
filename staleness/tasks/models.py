"""Small flax.linen models for the built-in tasks.

None of them keeps state outside its params (no BatchNorm): the loss must be a
pure function of (params, batch) so that a stale gradient is exactly "the gradient at an older
version of the params". Running batch statistics would be a second, separately-stale piece of server
state, and how stale normalisation statistics affect convergence is a research question of its own;
ResNet-20 therefore uses GroupNorm, which normalises within each example.
"""

from __future__ import annotations

import functools
import math
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
      [B, *out, prod(kernel_size)·in] and multiply by the flattened kernel. XLA:CPU runs a convolution (and
      its gradients) inside a `while` loop, i.e. inside `lax.scan`, an order of magnitude slower
      than outside one (jax-ml/jax#12868; measured 16x for a 3x3 conv gradient here), and the engine
      replays schedules in a scan; the matmul form keeps its speed.
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
    """SAME-padded strided convolution as one matmul over gathered kernel offsets.

    The patches [B, *out, k·in] (k = prod(kernel_size), kernel-major, matching
    kernel.reshape(-1, features)) are built as a *sum* of the k offset slices, each zero-padded into
    its own block of channels, not as a concatenation: XLA:CPU fuses the sum (and its transpose in
    the gradient, a sum of shifted slices) into one loop kernel, while it compiles a concatenation
    of k slices as k + 1 separate kernels, each its own LLVM module. Same values: each entry of the
    sum has one non-zero term. The padded input goes through an optimization barrier so that it is
    computed once: without it XLA fused the producer of `x` (GroupNorm + ReLU in ResNet-20) into the
    patch sum and recomputed it k times per entry (ResNet-20 under BSP's vmap: 1.5x slower).
    Measured on ResNet-20, 2 cores: XLA compile of the forward 14 s -> 2.6 s, of one replay chunk
    20 s -> 8 s of CPU; run time the same or better.
    """
    ks, spatial = kernel.shape[:-2], x.shape[1:-1]
    cin, k = x.shape[-1], math.prod(ks)
    out = [-(-n // s) for n, s in zip(spatial, strides, strict=True)]
    pads = [max((o - 1) * s + kk - n, 0) for o, s, kk, n in zip(out, strides, ks, spatial, strict=True)]
    x = jax.lax.optimization_barrier(jnp.pad(x, ((0, 0), *((p // 2, p - p // 2) for p in pads), (0, 0))))
    patches = None
    for j, offset in enumerate(np.ndindex(*ks)):  # kernel-major order matches kernel.reshape(-1, features)
        stop = [first + (n - 1) * s + 1 for first, n, s in zip(offset, out, strides, strict=True)]
        cols = jax.lax.slice(x, (0, *offset, 0), (x.shape[0], *stop, cin), (1, *strides, 1))
        cols = jnp.pad(cols, ((0, 0),) * (cols.ndim - 1) + ((j * cin, (k - 1 - j) * cin),))
        patches = cols if patches is None else patches + cols
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


@functools.lru_cache(maxsize=None)
def block_variance_scaling(scale: float, mode: str, distribution: str, block: int) -> nn.initializers.Initializer:
    """`nn.initializers.variance_scaling(scale, mode, distribution)` that draws its
    random numbers as the first prod(shape) entries of one [block] vector.

    Why: XLA:CPU compiles a large threefry kernel per distinct shape drawn
    (ResNet-20's kernels have six shapes, its head a seventh), and identical
    kernels once. With one draw shape for every parameter the model's init
    compiles one: ResNet-20's jitted init took 7.5 s of CPU to compile (20 s
    wall on 2 loaded cores) with flax's initialisers, 2.8 s with these.

    With `jax_threefry_partitionable` (JAX's default) element i of a draw does not depend on the
    draw's shape, so the values are those of `variance_scaling` (the same draws; the scaling may
    round differently, by at most 1 ulp); without it they are other draws of the same distribution.
    Parameters larger than `block` are drawn at their own shape. Fans as `variance_scaling`'s
    defaults (in_axis=-2, out_axis=-1). Distributions: "normal", "truncated_normal".
    """
    if distribution not in ("normal", "truncated_normal"):
        raise ValueError(f"distribution must be 'normal' or 'truncated_normal'; got {distribution!r}.")
    if mode not in ("fan_in", "fan_out", "fan_avg"):
        raise ValueError(f"mode must be 'fan_in', 'fan_out' or 'fan_avg'; got {mode!r}.")

    def init(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
        shape = tuple(shape)
        if len(shape) < 2:
            raise ValueError(f"block_variance_scaling initialises kernels [..., in, out]; got shape {shape}.")
        size = math.prod(shape)
        receptive = math.prod(shape[:-2])
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
        denominator = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
        variance = jnp.array(scale / denominator, dtype=dtype)
        draw = (max(block, size),)
        if distribution == "normal":
            unit, stddev = jax.random.normal(key, draw, dtype), jnp.sqrt(variance)
        else:  # constant: stddev of a standard normal truncated to (-2, 2), as variance_scaling
            unit = jax.random.truncated_normal(key, -2, 2, draw, dtype)
            stddev = jnp.sqrt(variance) / jnp.array(0.87962566103423978, dtype)
        return unit[:size].reshape(shape) * stddev

    return init


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with GroupNorm, identity shortcut.

    When the block downsamples, the shortcut is He et al.'s option A (CIFAR
    ResNets): stride-2 subsampling plus zero channel padding, which adds no
    parameters. `init_block`: draw size of the kernels' He initialiser (see
    `block_variance_scaling`; same values); 0 means 9·features², this block's largest kernel.
    """

    features: int
    strides: int = 1
    groups: int = 8
    conv_impl: str = "auto"
    init_block: int = 0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        he = block_variance_scaling(2.0, "fan_out", "normal", self.init_block or 9 * self.features ** 2)
        conv = functools.partial(Conv, use_bias=False, kernel_init=he, impl=self.conv_impl)
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
    Input [B, 32, 32, 3]; returns logits [B, num_outputs]. Initialised as flax's He (convs)
    and LeCun (head) initialisers, drawn at one shape (`block_variance_scaling`).
    """

    blocks: int = 3
    widths: Sequence[int] = (16, 32, 64)
    num_outputs: int = 10
    groups: int = 8
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        block = max(9 * max(self.widths) ** 2, max(self.widths) * self.num_outputs)
        he = block_variance_scaling(2.0, "fan_out", "normal", block)
        x = Conv(self.widths[0], (3, 3), use_bias=False, kernel_init=he, impl=self.conv_impl)(x)
        x = nn.relu(nn.GroupNorm(num_groups=self.groups)(x))
        for stage, width in enumerate(self.widths):
            for b in range(self.blocks):
                strides = 2 if stage > 0 and b == 0 else 1
                x = BasicBlock(width, strides, self.groups, self.conv_impl, init_block=block)(x)
        x = jnp.mean(x, axis=(1, 2))
        lecun = block_variance_scaling(1.0, "fan_in", "truncated_normal", block)
        return nn.Dense(self.num_outputs, kernel_init=lecun)(x)


def resnet20(num_outputs: int, conv_impl: str = "auto") -> ResNet:
    """ResNet-20 for CIFAR with GroupNorm (8 groups) instead of BatchNorm."""
    return ResNet(blocks=3, num_outputs=num_outputs, conv_impl=conv_impl)
