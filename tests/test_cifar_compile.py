"""ResNet-20 on CIFAR: the compile-time-friendly forms compute the same function.

`models.Conv(impl="patches")` builds its patches as a fused sum of padded
slices (not a concatenation) and ResNet-20's initialisers draw every
parameter's random numbers at one shape (`models.block_variance_scaling`);
both exist only to cut XLA:CPU compile time (benchmarks/cifar_compile.py), so
these tests pin that the values did not change: patches == lax convolution,
block draws == flax's initialisers, and the model's size and tree. The CIFAR
augmentation draws its crops and flips from one random draw (one threefry
kernel instead of three): checked to crop and flip as specified.
"""

import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
from staleness import tasks
from staleness.tasks import cifar, models

# float32 sums in another order (patches matmul vs native convolution): a few ulps
# of the largest partial sums, which are O(1) here.
TOL = dict(rtol=2e-5, atol=2e-5)


def _lax_conv(x, kernel, strides):
    spatial = "HWD"[: kernel.ndim - 2]
    dims = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
    return jax.lax.conv_general_dilated(x, kernel, strides, "SAME", dimension_numbers=dims)


def _concat_patches(x, kernel, strides):
    """The previous patches form (a concatenation of the offset slices): the reference."""
    ks, spatial = kernel.shape[:-2], x.shape[1:-1]
    out = [-(-n // s) for n, s in zip(spatial, strides)]
    pads = [max((o - 1) * s + k - n, 0) for o, s, k, n in zip(out, strides, ks, spatial)]
    x = jnp.pad(x, ((0, 0), *((p // 2, p - p // 2) for p in pads), (0, 0)))
    cols = []
    for offset in np.ndindex(*ks):
        stop = [first + (n - 1) * s + 1 for first, n, s in zip(offset, out, strides)]
        cols.append(jax.lax.slice(x, (0, *offset, 0), (x.shape[0], *stop, x.shape[-1]), (1, *strides, 1)))
    return jnp.concatenate(cols, axis=-1) @ kernel.reshape(-1, kernel.shape[-1])


CASES = [
    ((2, 8, 8, 3), (3, 3), (1, 1)),     # the stem: 3 input channels
    ((2, 8, 8, 16), (3, 3), (2, 2)),    # a downsampling block's first conv
    ((2, 9, 7, 4), (3, 3), (2, 2)),     # odd sizes: asymmetric SAME padding
    ((2, 5, 6, 2), (2, 3), (1, 2)),     # even kernel, mixed strides
    ((3, 16, 5), (5,), (2,)),           # CNN1D's layers
    ((2, 11, 2), (3,), (3,)),
]


@pytest.mark.parametrize(("shape", "kernel_size", "strides"), CASES)
def test_patches_conv_equals_native_conv_and_concat_form(shape, kernel_size, strides):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, shape)
    kernel = jax.random.normal(kw, (*kernel_size, shape[-1], 6))

    @jax.jit
    def outs(x, kernel):
        return [f(x, kernel, strides) for f in (models._conv_patches, _lax_conv, _concat_patches)]

    patches, native, concat = outs(x, kernel)
    np.testing.assert_allclose(patches, native, **TOL)
    # Each entry of the summed patches has one non-zero term, so the patches are the
    # concatenation's exactly and so is the matmul on them.
    np.testing.assert_array_equal(patches, concat)
    # Gradients (the transposed sum: shifted slices of the cotangent).
    ct = jax.random.normal(kg, patches.shape)

    @jax.jit
    def grads(x, kernel):
        return [jax.grad(lambda a, b, f=f: jnp.vdot(f(a, b, strides), ct), argnums=(0, 1))(x, kernel)
                for f in (models._conv_patches, _lax_conv)]

    g_patches, g_native = grads(x, kernel)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, **TOL), g_patches, g_native)


def test_patches_conv_lowers_without_concatenate():
    # The point of the summed form: XLA:CPU compiles a concatenation of k slices as
    # k + 1 kernels (each its own LLVM module); the sum fuses into one.
    x, kernel = jnp.zeros((2, 8, 8, 16)), jnp.zeros((3, 3, 16, 16))
    for fn in (lambda x, w: models._conv_patches(x, w, (1, 1)),
               jax.grad(lambda x, w: jnp.sum(models._conv_patches(x, w, (1, 1))), argnums=(0, 1))):
        text = jax.jit(fn).lower(x, kernel).as_text()
        assert "concatenate" not in text


@pytest.mark.parametrize(
    ("args", "shape"),
    [((2.0, "fan_out", "normal"), (3, 3, 16, 32)),
     ((2.0, "fan_out", "normal"), (3, 3, 64, 64)),        # exactly the block: no slicing
     ((1.0, "fan_in", "truncated_normal"), (64, 10)),     # the head's LeCun normal
     ((1.0, "fan_avg", "normal"), (5, 4, 7))],
)
def test_block_initialiser_draws_what_variance_scaling_draws(args, shape):
    # With jax_threefry_partitionable (set in conftest; JAX's default) element i of a
    # draw does not depend on its shape, so a prefix of the [block] draw is the draw
    # at the parameter's shape; the scaling may round differently by 1 ulp.
    key = jax.random.key(5)
    block = models.block_variance_scaling(*args, 9 * 64 * 64)
    want = nn.initializers.variance_scaling(*args)(key, shape)
    got = block(key, shape)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)
    # A parameter larger than the block is drawn at its own shape.
    np.testing.assert_allclose(models.block_variance_scaling(*args, 8)(key, shape), want, rtol=3e-7, atol=0)


def test_block_initialiser_checks_its_arguments():
    with pytest.raises(ValueError, match="distribution"):
        models.block_variance_scaling(1.0, "fan_in", "uniform", 16)
    with pytest.raises(ValueError, match="mode"):
        models.block_variance_scaling(1.0, "fan_sum", "normal", 16)


def test_resnet20_size_tree_and_init_values(monkeypatch):
    x = jnp.zeros((1, 32, 32, 3))
    model = models.resnet20(10, "patches")
    params = jax.jit(lambda k: model.init(k, x)["params"])(jax.random.key(3))
    assert 260_000 < sum(a.size for a in jax.tree.leaves(params)) < 280_000   # ResNet-20: about 0.27M
    assert sorted(params) == ["BasicBlock_0", "BasicBlock_1", "BasicBlock_2", "BasicBlock_3", "BasicBlock_4",
                              "BasicBlock_5", "BasicBlock_6", "BasicBlock_7", "BasicBlock_8", "Conv_0", "Dense_0",
                              "GroupNorm_0"]
    assert params["BasicBlock_3"]["Conv_0"]["kernel"].shape == (3, 3, 16, 32)
    # The reference: flax's own initialisers (what ResNet-20 used before drawing at
    # one shape); same tree, values to the rounding of the scaling.
    def flax_init(scale, mode, distribution, block):
        return nn.initializers.variance_scaling(scale, mode, distribution)

    monkeypatch.setattr(models, "block_variance_scaling", flax_init)
    ref = jax.jit(lambda k: models.resnet20(10, "lax").init(k, x)["params"])(jax.random.key(3))
    assert jax.tree.structure(ref) == jax.tree.structure(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=3e-7, atol=0), params, ref)


@pytest.mark.slow
def test_resnet20_patches_equals_lax_forward_and_grad():
    # Whole model: 19 convolutions, GroupNorm, the option-A shortcuts.
    model_p, model_l = models.resnet20(10, "patches"), models.resnet20(10, "lax")
    x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    params = jax.jit(lambda k: model_p.init(k, x[:1])["params"])(jax.random.key(0))

    @jax.jit
    def both(params):
        def loss(m, p):
            return jnp.sum(jnp.sin(m.apply({"params": p}, x)))
        return [(m.apply({"params": params}, x), jax.grad(lambda p, m=m: loss(m, p))(params))
                for m in (model_p, model_l)]

    (yp, gp), (yl, gl) = both(params)
    np.testing.assert_allclose(yp, yl, rtol=1e-4, atol=1e-4)  # 20 layers of float32 reordering
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), gp, gl)


def test_crop_and_flip_from_one_draw():
    # Random images, so the crop offset and flip of every output can be read back.
    b, p = 512, cifar.CROP_PADDING
    x = np.random.default_rng(0).integers(1, 256, size=(b, 8, 8, 3), dtype=np.uint8)
    train_tf, _ = cifar.make_transforms(np.zeros(3, np.float32), np.ones(3, np.float32), augment=True)
    key = jax.random.key(0)
    out = np.asarray(jax.jit(train_tf)(key, jnp.asarray(x)))
    assert np.array_equal(out, np.asarray(jax.jit(train_tf)(key, jnp.asarray(x))))  # keyed
    padded = np.pad(x.astype(np.float32) / np.float32(255.0), ((0, 0), (p, p), (p, p), (0, 0)))
    seen, flips = set(), 0
    for i in range(b):
        found = [(dy, dx, f) for dy in range(2 * p + 1) for dx in range(2 * p + 1) for f in (False, True)
                 if np.allclose(out[i], (lambda c: c[:, ::-1] if f else c)(padded[i, dy:dy + 8, dx:dx + 8]),
                                rtol=0, atol=1e-6)]   # x / 255 compiles to x * (1 / 255): 1 ulp
        assert found, f"example {i} is not a flipped or plain crop of its padded image"
        dy, dx, f = found[0]
        seen.add((dy, dx))
        flips += f
    assert len(seen) == (2 * p + 1) ** 2          # every offset pair occurs (81 of them in 512 draws)
    assert 0.4 < flips / b < 0.6                  # fair coin: 5 sigma is +-0.11


def _write_batch(path, images, labels):
    data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": list(map(int, labels))}, f)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["asp", "bsp"])
def test_simulate_resnet20_on_tiny_cifar(tmp_path, policy):
    # The whole replay with the CPU default ("patches"): init, chunk and evaluation
    # compile and train (benchmarks/cifar_compile.py times it at batch 32, 4 workers).
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(48, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=48)
    for i in range(5):
        _write_batch(tmp_path / f"data_batch_{i + 1}", images[8 * i: 8 * i + 8], labels[8 * i: 8 * i + 8])
    _write_batch(tmp_path / "test_batch", images[40:], labels[40:])
    task = tasks.get("cifar10-resnet20", batch_size=2, num_workers=2, data_dir=tmp_path, eval_chunk=4)
    result = st.simulate(task, policy, st.cluster.heterogeneous([1.0, 2.0]), num_updates=4, eval_every=2, seed=0)
    assert list(result.history["update"]) == [0, 2, 4]
    assert np.isfinite(result.history[["loss", "accuracy"]].to_numpy()).all()
    assert np.isfinite(result.train_loss).all()
