"""CIFAR-10/100 from a local directory in the standard python-pickle format.

Nothing is downloaded. Point `data_dir=` (or the environment variable `STALENESS_CIFAR_DIR`) at a
directory that holds the extracted archive, either the files themselves or the archive's own folder:

    CIFAR-10:  data_batch_1 .. data_batch_5, test_batch   (or cifar-10-batches-py/...)
    CIFAR-100: train, test                                 (or cifar-100-python/...)

Each file is a pickle of a dict with b"data" (uint8 [N, 3072], channel-major
32x32 RGB) and b"labels" (CIFAR-10) or b"fine_labels" (CIFAR-100).

Images stay uint8 in device memory ([N, 32, 32, 3], 150 MB for CIFAR-10) and are
converted per minibatch: scaled to [0, 1], normalised with the training set's
per-channel mean and standard deviation, and (with `augment=True`, the default) randomly cropped
from a 4-pixel zero-padded image and flipped horizontally, keyed by the minibatch's own (worker,
iteration) key so augmentation is as deterministic as the examples.
"""

from __future__ import annotations

import functools
import os
import pickle
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks.data import Arrays

ENV_VAR = "STALENESS_CIFAR_DIR"
CROP_PADDING = 4

_LAYOUT: dict[int, dict[str, Any]] = {
    10: {"subdir": "cifar-10-batches-py", "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
         "test": ("test_batch",), "label_key": b"labels"},
    100: {"subdir": "cifar-100-python", "train": ("train",), "test": ("test",), "label_key": b"fine_labels"},
}


def expected_files(num_classes: int) -> tuple[str, ...]:
    """File names a CIFAR-`num_classes` directory must contain."""
    layout = _LAYOUT[num_classes]
    return layout["train"] + layout["test"]


def find_dir(data_dir: str | os.PathLike | None, num_classes: int) -> Path:
    """The directory holding CIFAR-`num_classes`' files, or a ValueError saying where it looked."""
    layout = _LAYOUT[num_classes]
    files = expected_files(num_classes)
    source = "data_dir"
    if data_dir is None:
        data_dir = os.environ.get(ENV_VAR) or None
        source = f"${ENV_VAR}"
    if data_dir is None:
        raise ValueError(f"CIFAR-{num_classes} needs a local copy (nothing is downloaded): pass data_dir=... "
                         f"or set the environment variable {ENV_VAR} to a directory holding the python-pickle "
                         f"files {', '.join(files)} (directly or under {layout['subdir']}/).")
    root = Path(data_dir).expanduser()
    candidates = [root, root / layout["subdir"]]
    for cand in candidates:
        if all((cand / f).is_file() for f in files):
            return cand
    searched = " and ".join(str(c) for c in candidates)
    missing = [f for f in files if not (root / f).is_file()]
    raise ValueError(f"CIFAR-{num_classes} files not found: searched {searched} (from {source}) for the "
                     f"python-pickle files {', '.join(files)}; missing in {root}: {', '.join(missing)}. "
                     f"Extract the python version of the archive there, or pass data_dir=... / set {ENV_VAR} "
                     f"to the directory that holds these files.")


def _read(path: Path, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    try:
        data, labels = d[b"data"], d[label_key]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a CIFAR-{num_classes} python-pickle batch: expected a dict with keys "
                         f"b'data' and {label_key!r}.") from e
    data = np.asarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: b'data' must have shape [N, 3072]; got {data.shape}.")
    labels = np.asarray(labels, dtype=np.int32)
    if labels.shape != (data.shape[0],) or labels.min(initial=0) < 0 or labels.max(initial=0) >= num_classes:
        raise ValueError(f"{path}: {label_key!r} must be {data.shape[0]} labels in [0, {num_classes}); "
                         f"got shape {labels.shape}, range [{labels.min(initial=0)}, {labels.max(initial=0)}].")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # [N, 32, 32, 3]
    return np.ascontiguousarray(images), labels


def load(data_dir: str | os.PathLike | None, num_classes: int) -> Arrays:
    """Read CIFAR-10 (`num_classes=10`) or CIFAR-100 (100, fine labels).

    Returns uint8 images [N, 32, 32, 3] and int32 labels [N], train and test.
    """
    if num_classes not in _LAYOUT:
        raise ValueError(f"num_classes must be 10 or 100; got {num_classes}.")
    layout = _LAYOUT[num_classes]
    root = find_dir(data_dir, num_classes)
    parts = {split: [_read(root / f, layout["label_key"], num_classes) for f in layout[split]]
             for split in ("train", "test")}
    x_tr, y_tr = (np.concatenate(a) for a in zip(*parts["train"]))
    x_te, y_te = (np.concatenate(a) for a in zip(*parts["test"]))
    return Arrays(x_tr, y_tr, x_te, y_te)


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of uint8 images scaled to [0, 1]."""
    x = images.reshape(-1, images.shape[-1]).astype(np.float64) / 255.0
    return x.mean(0).astype(np.float32), np.maximum(x.std(0), 1e-6).astype(np.float32)


def make_transforms(mean: np.ndarray, std: np.ndarray, augment: bool):
    """(train_transform(key, x), test_transform(x)) on uint8 image batches.

    Cached on the statistics' values, so rebuilding a task on the same data
    reuses the same functions and therefore the compiled init/sample/eval code.
    """
    return _transforms(tuple(np.asarray(mean, np.float32).tolist()),
                       tuple(np.asarray(std, np.float32).tolist()), bool(augment))


@functools.lru_cache(maxsize=16)
def _transforms(mean: tuple[float, ...], std: tuple[float, ...], augment: bool):
    mean_c, std_c = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)

    def normalize(x: jax.Array) -> jax.Array:
        return (x.astype(jnp.float32) / 255.0 - mean_c) / std_c

    def crop_and_flip(key: jax.Array, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        # One draw of random bits for both crop offsets and the flip, not a split, a
        # randint and a bernoulli: each distinct random draw is a large threefry kernel
        # for XLA:CPU to compile inside every replay (three of them cost about 1.5 s of
        # the chunk's compile on 2 cores). `bits % 9` is uniform to within 2^-32 * 9.
        bits = jax.random.bits(key, (3, b), jnp.uint32)
        offsets = (bits[:2] % jnp.uint32(2 * CROP_PADDING + 1)).astype(jnp.int32).T   # [b, 2]
        flip = (bits[2] >> 31) == 1
        p = CROP_PADDING
        padded = jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
        crop = jax.vmap(lambda img, off: jax.lax.dynamic_slice(img, (off[0], off[1], 0), (h, w, c)))
        x = crop(padded, offsets)
        return jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)

    def train_transform(key: jax.Array, x: jax.Array) -> jax.Array:
        x = normalize(x)
        return crop_and_flip(key, x) if augment else x

    return train_transform, normalize
