"""The user's in-memory examples for `staleness.tasks.builders.from_flax`.

`split_examples` turns what the user passes (`data=`, `test=`, `labels=`) into `Examples`, NumPy
arrays of one length each (float64 -> float32, int64 -> int32). Mistakes are `DataError`s that
name the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from staleness.tasks.errors import DataError

DEFAULT_TEST_FRACTION = 0.2
"""The fraction of `data` held out for evaluation when no `test=` is given."""

_SPLIT_STREAM = 0x7465   # the test split's random stream, apart from the partition's
_LABELS = "\0labels"     # the field that carries labels given as an array until they are split off


class Examples(NamedTuple):
    """A task's examples: {field: [N, ...]} to train on, {field: [M, ...]} held out, and
    the [N] labels the label-skewed partitions split by (None: no labels)."""

    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    labels: np.ndarray | None


def as_arrays(value: Any, what: str) -> dict[str, np.ndarray]:
    """(x, y) / {field: array} / a single array (-> {"x": it}) as NumPy arrays of one length."""
    if isinstance(value, Mapping):
        out = {str(k): v for k, v in value.items()}
    elif isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise DataError(f"{what} must be (x, y), a dict of arrays, or one array; got a sequence of "
                            f"{len(value)} items.")
        out = {"x": value[0], "y": value[1]}
    else:
        out = {"x": value}
    if not out:
        raise DataError(f"{what} has no arrays.")
    arrays = {}
    for k, v in out.items():
        a = np.asarray(v)
        if a.dtype == object or a.ndim == 0:
            raise DataError(f"{what}[{k!r}] must be an array with a leading example axis; got "
                            f"{type(v).__name__} of shape {a.shape} and dtype {a.dtype}.")
        if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
            bad = np.flatnonzero(~np.isfinite(a).reshape(len(a), -1).all(axis=1))
            raise DataError(f"{what}[{k!r}] holds NaN or inf in {len(bad)} example(s), the first at row "
                            f"{int(bad[0])}; clean or drop them (a non-finite input makes every loss NaN).")
        if a.dtype == np.float64:
            a = a.astype(np.float32)
        elif a.dtype == np.int64:
            a = a.astype(np.int32)
        arrays[k] = a
    if "index" in arrays:
        raise DataError(f"{what} has a field 'index'; the name is reserved (every batch carries the examples' "
                        "training-set positions under it). Rename the field.")
    lengths = {k: len(a) for k, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise DataError(f"the arrays of {what} must have the same leading length (one row per example); got "
                        + ", ".join(f"{k}: {n}" for k, n in lengths.items()) + ".")
    if next(iter(lengths.values())) == 0:
        raise DataError(f"{what} has no examples.")
    return arrays


def split(arrays: dict[str, np.ndarray], fraction: Any, seed: int):
    """(train, test): a `fraction` of the examples (at least one, drawn with `seed`) held
    out; fraction 0 evaluates on the training examples themselves (the same dict)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise DataError(f"test_fraction must be a number in [0, 1) (0: evaluate on the training data); "
                        f"got {fraction!r}.")
    n = len(next(iter(arrays.values())))
    if fraction == 0:
        return arrays, arrays
    m = max(1, int(round(fraction * n)))
    if m >= n:
        raise DataError(f"test_fraction = {fraction} leaves no training examples of {n}; give more data or "
                        "a smaller test_fraction.")
    perm = np.random.default_rng([seed, _SPLIT_STREAM]).permutation(n)
    test_idx, train_idx = np.sort(perm[:m]), np.sort(perm[m:])
    return ({k: a[train_idx] for k, a in arrays.items()}, {k: a[test_idx] for k, a in arrays.items()})


def split_examples(data: Any, test: Any, test_fraction: Any, labels: Any, input_key: str, seed: int) -> Examples:
    """The `Examples` of `from_flax(data=, test=, test_fraction=, labels=, input_key=, seed=)`.

    `labels`: None (y when 1-D), a field name of `data`, or an array with one entry
    per example of `data` (carried through the split, then taken out of the fields).
    """
    arrays = as_arrays(data, "data")
    label_field = _label_field(arrays, labels)
    if input_key not in arrays:
        raise DataError(f"the model reads field {input_key!r} (input_key) but data has {sorted(arrays)}.")
    if test is None:
        train, test_arrays = split(arrays, test_fraction, seed)
    else:
        train, test_arrays = arrays, _test_arrays(arrays, test)
    part_labels = train.pop(label_field) if label_field == _LABELS else (
        train[label_field] if label_field is not None else None)
    test_arrays.pop(_LABELS, None)
    if part_labels is None and "y" in train and train["y"].ndim == 1:
        part_labels = train["y"]
    return Examples(train, test_arrays, part_labels)


def _label_field(arrays: dict[str, np.ndarray], labels: Any) -> str | None:
    """The field of `arrays` holding the partition labels (adding `labels` given as an
    array under a reserved field), or None."""
    if isinstance(labels, str):
        if labels not in arrays:
            raise DataError(f"labels = {labels!r} is not a field of data; fields: {sorted(arrays)}.")
        return labels
    if labels is None:
        return None
    lab = np.asarray(labels)
    n = len(next(iter(arrays.values())))
    if lab.shape != (n,):
        raise DataError(f"labels must hold one entry per example of data: shape ({n},); got {lab.shape}.")
    arrays[_LABELS] = lab
    return _LABELS


def _test_arrays(train: dict[str, np.ndarray], test: Any) -> dict[str, np.ndarray]:
    """The given held-out examples: every field of `train` (in its order), no others."""
    test_arrays = as_arrays(test, "test")
    missing = sorted(set(train) - set(test_arrays) - {_LABELS})
    if missing:
        raise DataError(f"test lacks the fields {missing} that data has.")
    return {k: test_arrays[k] for k in train if k in test_arrays}
