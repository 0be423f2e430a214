"""Tests for staleness.tasks: the Task contract, built-in tasks, CIFAR loading."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness.tasks as tasks

DATA_TASKS = ["linreg", "digits-mlp", "digits-cnn", "mnist1d-mlp", "mnist1d-cnn"]
LOCAL_TASKS = ["quadratic", *DATA_TASKS]
WORKERS = 4
MU = 8

_cache: dict = {}


def make(name: str, partition: str = "iid", **options) -> tasks.Task:
    """Built-in tasks are cached per module: building one costs a few device ops."""
    key = (name, partition, tuple(sorted(options.items())))
    if key not in _cache:
        _cache[key] = tasks.get(name, batch_size=MU, partition=partition, num_workers=WORKERS, seed=0, **options)
    return _cache[key]


def tree_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and bool(jnp.array_equal(x, y, equal_nan=True))
        for x, y in zip(la, lb)
    )


def all_finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------
# Contract, for every built-in task that needs no files


def test_names():
    assert tasks.names() == [
        "quadratic", "linreg", "digits-mlp", "digits-cnn",
        "mnist1d-mlp", "mnist1d-cnn", "cifar10-resnet20", "cifar100-resnet20", "stdlib-lm",
        "rl-bandit", "rl-digits",
    ]


@pytest.mark.parametrize("name", LOCAL_TASKS)
def test_init_loss_grad_finite(name):
    task = make(name)
    assert (task.name, task.batch_size, task.num_workers, task.partition) == (name, MU, WORKERS, "iid")
    params = task.init_params(jax.random.key(0))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    assert task.param_count == sum(x.size for x in jax.tree.leaves(params)) > 0
    batch = task.minibatch(jax.random.key(1), 0, 0)
    loss, grads = jax.jit(jax.value_and_grad(task.loss))(params, batch)
    assert loss.shape == () and bool(jnp.isfinite(loss))
    assert jax.tree.structure(grads) == jax.tree.structure(params) and all_finite(grads)
    assert any(bool(jnp.any(g != 0)) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", LOCAL_TASKS)
def test_same_seed_same_task(name):
    a, b = make(name), tasks.get(name, batch_size=MU, partition="iid", num_workers=WORKERS, seed=0)
    assert tree_equal(a.init_params(jax.random.key(3)), b.init_params(jax.random.key(3)))
    assert tree_equal(a.minibatch(jax.random.key(4), 2, 7), b.minibatch(jax.random.key(4), 2, 7))
    assert not tree_equal(a.init_params(jax.random.key(3)), a.init_params(jax.random.key(5)))


@pytest.mark.parametrize("name", [*DATA_TASKS, "quadratic-noisy"])
def test_minibatch_pure_and_fixed_shape(name):
    # The deterministic quadratic has a dummy batch on purpose; its noisy variant has data.
    task = make("quadratic", noise_scale=1.0) if name == "quadratic-noisy" else make(name)
    key = jax.random.key(11)
    base = task.minibatch(key, 1, 3)
    assert set(base) == {"x", "y", "index"}
    assert base["x"].shape[0] == base["y"].shape[0] == base["index"].shape[0] == MU
    assert tree_equal(base, task.minibatch(key, 1, 3))
    for worker, iteration in [(2, 3), (1, 4), (0, 0)]:
        other = task.minibatch(key, worker, iteration)
        assert jax.tree.map(jnp.shape, other) == jax.tree.map(jnp.shape, base)
        assert not bool(jnp.array_equal(other["x"], base["x"]))
    assert not bool(jnp.array_equal(task.minibatch(jax.random.key(12), 1, 3)["x"], base["x"]))


@pytest.mark.parametrize("name", LOCAL_TASKS)
def test_minibatch_jit_vmap_and_shards(name):
    task = make(name, partition="shard")
    key = jax.random.key(5)
    traces = []

    @jax.jit
    def sample(w, i):
        traces.append(None)
        return task.minibatch(key, w, i)

    for w, i in [(0, 0), (3, 9), (1, 2)]:
        assert tree_equal(sample(jnp.int32(w), jnp.int32(i)), task.minibatch(key, w, i))
    assert len(traces) == 1, "minibatch recompiled for new worker/iteration values"

    # vmap over workers (outer) and iterations (inner): [W, 30, μ, ...]
    grid = jax.jit(jax.vmap(jax.vmap(task.minibatch, (None, None, 0)), (None, 0, None)))(
        key, jnp.arange(WORKERS), jnp.arange(30))
    for w, i in [(0, 0), (2, 17), (WORKERS - 1, 29)]:
        assert tree_equal(jax.tree.map(lambda a: a[w, i], grid), task.minibatch(key, w, i))
    if name == "quadratic":
        return  # no data to shard
    shards = [task.shard_indices(w) for w in range(WORKERS)]
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(task.train_size)), "shards must partition the data"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    index = np.asarray(grid["index"])
    for w in range(WORKERS):
        assert np.isin(index[w], shards[w]).all(), f"worker {w} drew outside its shard"
    if name != "linreg":  # sorted by label: 10 classes over 4 workers gives 3-4 classes each
        y = np.asarray(task.data["y_train"])
        assert all(len(np.unique(y[s])) <= 4 for s in shards)
    assert np.array_equal(make(name).shard_indices(0), np.arange(task.train_size))  # iid: everything


@pytest.mark.parametrize("name", LOCAL_TASKS)
def test_evaluate_returns_metric_names(name):
    task = make(name)
    params = task.init_params(jax.random.key(0))
    metrics = task.evaluate(params)  # evaluate is jitted; see test_task_as_jit_argument for an outer jit
    assert tuple(sorted(metrics)) == tuple(sorted(task.metric_names))
    assert all(m.shape == () and bool(jnp.isfinite(m)) for m in metrics.values())
    if "accuracy" in metrics:
        assert 0.0 <= float(metrics["accuracy"]) <= 1.0


def test_chunked_evaluation_masks_padding():
    # 360 test images in chunks of 7: 52 chunks, the last holds 3 real images and 4 padded ones.
    model = tasks.models.MLP(hidden=(16,), num_outputs=10)
    whole, chunked = (
        tasks.classification_task("d", model, tasks.data.digits(), batch_size=4, eval_chunk=c) for c in (1000, 7)
    )
    assert chunked.data["x_test"].shape[:2] == (52, 7) and int(chunked.data["mask_test"].sum()) == 360
    params = whole.init_params(jax.random.key(0))
    x, y = tasks.data.digits().x_test, tasks.data.digits().y_test
    logits = model.apply({"params": params}, x)
    expected = tasks.data.classification_metrics(logits, y)
    for task in (whole, chunked):
        got = task.evaluate(params)
        np.testing.assert_allclose(got["accuracy"], np.mean(expected["accuracy"]), atol=1e-6)
        np.testing.assert_allclose(got["loss"], np.mean(expected["loss"]), rtol=1e-5)


def test_concat_batches_is_large_batch_sgd():
    # One BSP round (λ workers, μ each, averaged) equals SGD on the concatenated λμ examples.
    task = make("digits-mlp")
    params = task.init_params(jax.random.key(0))
    key = jax.random.key(9)
    batches = [task.minibatch(key, w, 4) for w in range(WORKERS)]
    big = tasks.concat_batches(batches)
    assert big["x"].shape[0] == WORKERS * MU
    grad = jax.jit(jax.grad(task.loss))
    mean_grad = jax.tree.map(lambda *g: sum(g) / WORKERS, *[grad(params, b) for b in batches])
    # float32 sums in a different order: agree to rounding, not bitwise.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grad(params, big), mean_grad)
    with pytest.raises(ValueError, match="at least one"):
        tasks.concat_batches([])


def test_task_as_jit_argument_matches_closure():
    # Passing the task as a pytree argument keeps its data out of the compiled constants.
    task = make("mnist1d-mlp", partition="shard")
    f = jax.jit(lambda t, w, i: t.minibatch(jax.random.key(1), w, i))
    assert tree_equal(f(task, 2, 5), task.minibatch(jax.random.key(1), 2, 5))
    params = task.init_params(jax.random.key(0))
    assert tree_equal(jax.jit(lambda t, p: t.evaluate(p))(task, params), task.evaluate(params))
    assert len(jax.tree.leaves(task)) == len(jax.tree.leaves(task.data))


def test_digits_mlp_sgd_reaches_85_percent():
    # 300 steps of plain SGD, μ = 32, lr 0.5 (about 7 epochs of 1437 images).
    task = tasks.get("digits-mlp", batch_size=32, num_workers=1)
    key = jax.random.key(0)

    def step(params, i):
        grads = jax.grad(task.loss)(params, task.minibatch(key, 0, i))
        return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), None

    params, _ = jax.jit(lambda p: jax.lax.scan(step, p, jnp.arange(300)))(task.init_params(jax.random.key(1)))
    metrics = task.evaluate(params)
    assert float(metrics["accuracy"]) > 0.85, metrics


@pytest.mark.parametrize(
    ("shape", "kernel", "strides"),
    [((2, 9, 7, 4), (3, 3), (2, 2)), ((2, 11, 2), (5,), (3,))],  # odd sizes: asymmetric SAME padding
)
def test_conv_patches_equals_lax_conv(shape, kernel, strides):
    # Same params, same function; float32 sums in another order, so to rounding.
    x = jax.random.normal(jax.random.key(0), shape)
    patches = tasks.models.Conv(5, kernel, strides, impl="patches")
    params = patches.init(jax.random.key(1), x)
    lax = tasks.models.Conv(5, kernel, strides, impl="lax")
    assert tree_equal(params, lax.init(jax.random.key(1), x))
    @jax.jit
    def out_and_grad(params):
        return [(m.apply(params, x), jax.grad(lambda p: jnp.sum(m.apply(p, x) ** 2))(params)) for m in (patches, lax)]

    a, b = out_and_grad(params)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5), a, b)


# ---------------------------------------------------------------------------
# Tasks with known optima


def test_quadratic_gradient_is_exact():
    task = make("quadratic")
    a, theta_star = task.hessian, task.optimum["theta"]
    theta = task.init_params(jax.random.key(0))["theta"]
    grad = jax.jit(jax.grad(task.loss))({"theta": theta}, task.minibatch(jax.random.key(0), 0, 0))["theta"]
    # Bitwise: the gradient is defined as this float32 product.
    assert bool(jnp.array_equal(grad, jax.jit(lambda t: a @ (t - theta_star))(theta)))
    expected = np.asarray(a, np.float64) @ (np.asarray(theta, np.float64) - np.asarray(theta_star, np.float64))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)  # float32 vs float64 rounding
    # Deterministic: every worker/iteration gives the same gradient.
    other = jax.grad(task.loss)({"theta": theta}, task.minibatch(jax.random.key(7), 3, 11))["theta"]
    assert bool(jnp.array_equal(grad, other))
    assert float(task.loss(task.optimum, task.minibatch(jax.random.key(0), 0, 0))) == 0.0
    eig = np.linalg.eigvalsh(np.asarray(a, np.float64))
    assert np.allclose(a, a.T) and eig.min() > 0 and 9.5 < eig.max() / eig.min() < 10.5
    hess = jax.hessian(lambda t: task.loss({"theta": t}, None))(theta)
    np.testing.assert_allclose(hess, a, rtol=1e-6, atol=1e-6)
    # The delayed recurrence θ_{u+1} = θ_u − α A(θ_{u−τ} − θ*) converges for a small step.
    grad_fn = jax.jit(lambda t: jax.grad(task.loss)({"theta": t}, None)["theta"])
    hist = [theta]
    for u in range(200):  # staleness τ_u = min(u, 2)
        hist.append(hist[-1] - 0.05 * grad_fn(hist[max(0, u - 2)]))
    assert float(jnp.linalg.norm(hist[-1] - theta_star)) < 1e-2 * float(jnp.linalg.norm(theta - theta_star))


def test_quadratic_noise_is_unbiased():
    task = make("quadratic", noise_scale=1.0)
    params = {"theta": task.optimum["theta"]}
    grads = jax.vmap(lambda i: jax.grad(task.loss)(params, task.minibatch(jax.random.key(0), 0, i)))(jnp.arange(400))
    g = np.asarray(grads["theta"])  # at the optimum: pure noise, std 1/sqrt(μ) per coordinate
    assert abs(g.mean()) < 4 / np.sqrt(MU * g.size) and 0.8 < g.std() * np.sqrt(MU) < 1.2


def test_linreg_optimum_matches_lstsq():
    task = make("linreg")
    x = np.asarray(task.data["x_train"], np.float64)
    y = np.asarray(task.data["y_train"], np.float64)
    coef = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)[0]
    np.testing.assert_allclose(task.optimum["w"], coef[:-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(task.optimum["b"], coef[-1], rtol=1e-5, atol=1e-6)
    full = {"x": jnp.asarray(x, jnp.float32), "y": jnp.asarray(y, jnp.float32)}
    grad = jax.grad(task.loss)(task.optimum, full)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) < 1e-4  # float32 stationarity
    # Noise scale 0.1 => optimal test loss about 0.5 * 0.1^2.
    assert 0.002 < float(task.evaluate(task.optimum)["loss"]) < 0.01


# ---------------------------------------------------------------------------
# Argument checking


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "nope"}, ValueError, "digits-mlp"),
        ({"name": "linreg", "batch_size": 0}, ValueError, "batch_size"),
        ({"name": "linreg", "num_workers": 0}, ValueError, "num_workers"),
        ({"name": "linreg", "partition": "random"}, ValueError, "partition.*iid.*shard"),
        ({"name": "digits-mlp", "partition": "shard", "num_workers": 5000}, ValueError, "num_workers must be <= 1437"),
        ({"name": "linreg", "batch_size": 2.5}, TypeError, "batch_size"),
        ({"name": "linreg", "dimm": 3}, TypeError, "dim"),
        ({"name": "digits-cnn", "conv_impl": "fft"}, ValueError, "conv_impl"),
    ],
)
def test_get_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        tasks.get(**kwargs)


def test_minibatch_rejects_out_of_range_worker():
    with pytest.raises(ValueError, match="worker=4"):
        make("linreg").minibatch(jax.random.key(0), WORKERS, 0)


# ---------------------------------------------------------------------------
# CIFAR from tiny files in the standard pickle format


def _write_batch(path, images, labels, label_key):
    data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)  # channel-major rows, as CIFAR
    with open(path, "wb") as f:
        pickle.dump({b"data": data, label_key: list(map(int, labels)), b"batch_label": b"test"}, f)


@pytest.fixture
def cifar10_dir(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    images = rng.integers(0, 256, size=(110, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=110)
    for i in range(5):
        _write_batch(root / f"data_batch_{i + 1}", images[20 * i: 20 * i + 20], labels[20 * i: 20 * i + 20], b"labels")
    _write_batch(root / "test_batch", images[100:], labels[100:], b"labels")
    return tmp_path, images, labels


def test_cifar10_loads_and_resnet20_trains(cifar10_dir):
    root, images, labels = cifar10_dir
    # conv_impl="lax" (native convolutions; test_conv_patches_equals_lax_conv checks the
    # CPU default "patches" against it); the data path is the same.
    task = tasks.get("cifar10-resnet20", batch_size=2, num_workers=2, data_dir=root, eval_chunk=4, conv_impl="lax")
    assert (task.train_size, task.test_size) == (100, 10)
    assert np.array_equal(np.asarray(task.data["x_train"]), images[:100])  # HWC uint8, same order
    assert np.array_equal(np.asarray(task.data["y_train"]), labels[:100])
    assert task.data["x_test"].shape == (3, 4, 32, 32, 3)  # 10 test images in chunks of 4, padded
    batch = task.minibatch(jax.random.key(0), 1, 0)
    assert batch["x"].shape == (2, 32, 32, 3) and batch["x"].dtype == jnp.float32
    assert np.array_equal(batch["y"], labels[np.asarray(batch["index"])])
    # Shapes from the real init (traced, not compiled: the init costs ~2 s of CPU to
    # compile); values from NumPy, to exercise forward and grad.
    shapes = jax.eval_shape(task.init_params, jax.random.key(0))
    assert 260_000 < task.param_count < 280_000  # ResNet-20: about 0.27M
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(np.float32), shapes)
    loss, grads = jax.jit(jax.value_and_grad(task.loss))(params, batch)
    assert loss.shape == () and bool(jnp.isfinite(loss)) and all_finite(grads)
    assert jax.tree.structure(grads) == jax.tree.structure(shapes)
    metrics = jax.eval_shape(task.evaluate, params)
    assert {k: v.shape for k, v in metrics.items()} == {"loss": (), "accuracy": ()}


def test_cifar_augmentation_is_keyed_and_optional(cifar10_dir):
    root, images, _ = cifar10_dir
    plain = tasks.get("cifar10-resnet20", batch_size=4, num_workers=1, data_dir=root, augment=False)
    aug = tasks.get("cifar10-resnet20", batch_size=4, num_workers=1, data_dir=root)
    x = images[:100].astype(np.float64) / 255
    mean, std = x.mean((0, 1, 2)), x.std((0, 1, 2))
    b = plain.minibatch(jax.random.key(3), 0, 1)
    np.testing.assert_allclose(b["x"], (x[np.asarray(b["index"])] - mean) / std, rtol=1e-4, atol=1e-4)
    a1, a2 = aug.minibatch(jax.random.key(3), 0, 1), aug.minibatch(jax.random.key(3), 0, 1)
    assert tree_equal(a1, a2) and np.array_equal(a1["index"], b["index"])
    assert not np.allclose(a1["x"], b["x"])


def test_cifar100_from_env_var(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(30, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 100, size=30)
    _write_batch(tmp_path / "train", images[:20], labels[:20], b"fine_labels")
    _write_batch(tmp_path / "test", images[20:], labels[20:], b"fine_labels")
    monkeypatch.setenv("STALENESS_CIFAR_DIR", str(tmp_path))
    task = tasks.get("cifar100-resnet20", batch_size=2, num_workers=1)
    assert (task.train_size, task.test_size) == (20, 10)
    assert np.array_equal(np.asarray(task.data["y_train"]), labels[:20])
    out = jax.eval_shape(task.loss, jax.eval_shape(task.init_params, jax.random.key(0)), task.minibatch(jax.random.key(0), 0, 0))
    assert out.shape == ()


def test_cifar_missing_files_name_what_is_expected(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"data_batch_1.*data_batch_5, test_batch") as info:
        tasks.get("cifar10-resnet20", data_dir=tmp_path / "nowhere")
    assert "nowhere" in str(info.value) and "STALENESS_CIFAR_DIR" in str(info.value)
    monkeypatch.delenv("STALENESS_CIFAR_DIR", raising=False)
    with pytest.raises(ValueError, match="STALENESS_CIFAR_DIR.*train, test"):
        tasks.get("cifar100-resnet20")
