"""Built-in tasks by name: `names()`, `get(name, ...)`, `options(name)`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from staleness.tasks import cifar, data, models
from staleness.tasks.base import Task, check_common
from staleness.tasks.classification import classification_task
from staleness.tasks.synthetic import linreg, quadratic


def _check_conv_impl(conv_impl: Any) -> None:
    if conv_impl not in models.CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {models.CONV_IMPLS}; got {conv_impl!r}.")


def _digits_mlp(batch_size: int, num_workers: int, partition: str, seed: int) -> Task:
    """digits-mlp: scikit-learn digits (1437 train / 360 test 8x8 images, fixed split); MLP 64-128-10."""
    model = models.MLP(hidden=(128,), num_outputs=10)
    return classification_task("digits-mlp", model, data.digits(), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _digits_cnn(batch_size: int, num_workers: int, partition: str, seed: int, *,
                conv_impl: str = "auto") -> Task:
    """digits-cnn: scikit-learn digits, two 3x3 convs (16, 32 channels) + 2x2 pool + linear."""
    _check_conv_impl(conv_impl)
    model = models.CNN2D(channels=(16, 32), num_outputs=10, conv_impl=conv_impl)
    return classification_task("digits-cnn", model, data.digits(), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _check_num_samples(num_samples: Any) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 10:
        raise ValueError(f"num_samples must be an int >= 10; got {num_samples!r}.")


def _mnist1d_mlp(batch_size: int, num_workers: int, partition: str, seed: int, *,
                 num_samples: int = 5000) -> Task:
    """mnist1d-mlp: MNIST-1D generated locally (4000 train / 1000 test by default); MLP 40-128-128-10."""
    _check_num_samples(num_samples)
    model = models.MLP(hidden=(128, 128), num_outputs=10)
    return classification_task("mnist1d-mlp", model, data.mnist1d(num_samples), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _mnist1d_cnn(batch_size: int, num_workers: int, partition: str, seed: int, *,
                 num_samples: int = 5000, conv_impl: str = "auto") -> Task:
    """mnist1d-cnn: MNIST-1D, three stride-2 1-D convs (32 channels; kernels 5, 3, 3) + linear."""
    _check_num_samples(num_samples)
    _check_conv_impl(conv_impl)
    model = models.CNN1D(num_outputs=10, conv_impl=conv_impl)
    return classification_task("mnist1d-cnn", model, data.mnist1d(num_samples), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _cifar(num_classes: int):
    name = f"cifar{num_classes}-resnet20"

    def build(batch_size: int, num_workers: int, partition: str, seed: int, *,
              data_dir: Any = None, augment: bool = True, eval_chunk: int = 500,
              conv_impl: str = "auto") -> Task:
        check_common(batch_size, num_workers, partition, seed)
        _check_conv_impl(conv_impl)
        arrays = cifar.load(data_dir, num_classes)
        train_tf, test_tf = cifar.make_transforms(*cifar.channel_stats(arrays.x_train), augment=bool(augment))
        return classification_task(
            name, models.resnet20(num_classes, conv_impl), arrays, batch_size=batch_size,
            num_workers=num_workers, partition=partition, seed=seed,
            train_transform=train_tf, test_transform=test_tf, eval_chunk=eval_chunk,
        )

    build.__doc__ = f"{name}: CIFAR-{num_classes} from a local directory (staleness.tasks.cifar), ResNet-20 + GroupNorm."
    return build


_BUILDERS: dict[str, Callable[..., Task]] = {
    "quadratic": quadratic,
    "linreg": linreg,
    "digits-mlp": _digits_mlp,
    "digits-cnn": _digits_cnn,
    "mnist1d-mlp": _mnist1d_mlp,
    "mnist1d-cnn": _mnist1d_cnn,
    "cifar10-resnet20": _cifar(10),
    "cifar100-resnet20": _cifar(100),
}

_NEEDS_DATA_DIR = ("cifar10-resnet20", "cifar100-resnet20")


def declared_optimizer(name: str):
    """The optimizer built-in task `name` trains with by default (without building
    it: no data is loaded), or None (sgd). Not a built-in name: None."""
    builder = _BUILDERS.get(name)
    return getattr(builder, "optimizer", None) if builder is not None else None


def names() -> list[str]:
    """Names of the built-in tasks, for `get`."""
    return list(_BUILDERS)


def options(name: str) -> dict[str, Any]:
    """Task-specific keyword options of built-in task `name` and their defaults."""
    builder = _builder(name)
    return {p.name: p.default for p in inspect.signature(builder).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "data_dir"}


def _builder(name: str) -> Callable[..., Task]:
    if name not in _BUILDERS:
        raise ValueError(f"unknown task {name!r}; valid names are {', '.join(_BUILDERS)}.")
    return _BUILDERS[name]


def get(name: str, batch_size: int = 32, partition: str = "iid", num_workers: int = 8,
        data_dir: Any = None, seed: int = 0, **task_options: Any) -> Task:
    """Build built-in task `name`.

    Args:
      name: one of `names()`.
      batch_size: per-worker minibatch size μ (examples per gradient).
      partition: "iid" (every worker samples the whole training set) or "shard"
        (disjoint label-skewed shards, one per worker).
      num_workers: number of workers λ the data are partitioned for.
      data_dir: directory with local data (CIFAR tasks; ignored by the others,
        whose data ship with a package or are generated). Defaults to
        $STALENESS_CIFAR_DIR.
      seed: seed of generated data (quadratic, linreg) and of the shard
        permutation. Fixed data (digits split, MNIST-1D generation) do not
        depend on it. Initial params come from the key given to `init_params`.
      **task_options: task-specific options; see `options(name)` (e.g.
        quadratic: dim, condition_number, noise_scale; mnist1d-*: num_samples;
        cifar*: augment, eval_chunk; conv models: conv_impl, see
        `models.Conv`).

    Returns:
      The `Task`.
    """
    builder = _builder(name)
    check_common(batch_size, num_workers, partition, seed)
    valid = options(name)
    unknown = sorted(set(task_options) - set(valid))
    if unknown:
        raise TypeError(
            f"task {name!r} got unknown option(s) {unknown}; its options are "
            f"{sorted(valid) or 'none'}."
        )
    if name in _NEEDS_DATA_DIR:
        task_options["data_dir"] = data_dir
    return builder(batch_size, num_workers, partition, seed, **task_options)
