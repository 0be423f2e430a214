"""Per-worker partitions of a training set: which examples each worker draws from.

A partition is named by a spec string (`Task.partition`, the CLI's `--partition`):

- "iid": every worker draws uniformly from the whole training set (no layout).
- "shard": label-skewed disjoint shards. A fixed permutation (from the seed) is
  stably sorted by label (by target value for regression) and cut into
  `num_workers` contiguous shards whose sizes differ by at most one.
- "dirichlet:ALPHA": the standard non-IID benchmark (Dirichlet label skew, as in Hsu et al. 2019 and
  the per-class form of NIID-Bench, Li et al. 2022): for every class c, proportions p_c ~ Dir(ALPHA
  · 1_λ) split the class's examples (in a seeded random order) among the λ workers. Small ALPHA
  (0.1) gives each worker a few classes; large ALPHA (100) approaches iid. Shards are disjoint and
  cover the training set. Draws are repeated (deterministically, from the seed) until every worker
  has an example; after `MAX_RESAMPLES` failed draws each empty worker takes one example from the
  largest worker.
- "sizes:F1,...,Fλ": unequal iid shards: a seeded permutation cut into
  disjoint contiguous pieces of the given fractions (> 0, summing to 1) of the
  training set (rounded by largest remainder, at least one example each).

Every partition except iid is a layout (order, bounds): `order` lists training
indices worker by worker and worker w owns order[bounds[w]:bounds[w + 1]]
(`staleness.tasks.sampling` draws uniformly from it, on the host and in JAX
alike). All layouts are pure functions of (labels, num_workers, seed). `info` summarises one
for a Result's config (`label_skew`: 0 for iid, 1 - 1/C for C balanced classes split one per worker).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["KINDS", "PARTITIONS", "Partition", "parse", "layout", "shard_layout", "dirichlet_layout",
           "sizes_layout", "label_skew", "worker_examples", "info", "labels_of"]

KINDS = ("iid", "shard", "dirichlet", "sizes")
PARTITIONS = ("iid", "shard", "dirichlet:ALPHA", "sizes:F1,...,Fλ")
"""Valid values of `partition` (also for error messages and help strings; see the module docstring)."""

MAX_RESAMPLES = 100
"""Dirichlet draws tried before empty workers are filled from the largest one."""

_DIRICHLET_STREAM = 0x6469  # a separate random stream from the shard permutation's
_SIZES_STREAM = 0x7369


@dataclasses.dataclass(frozen=True)
class Partition:
    """A parsed partition spec: `kind` in KINDS, `alpha` (dirichlet), `sizes` (fractions)."""

    kind: str
    alpha: float | None = None
    sizes: tuple[float, ...] | None = None

    def describe(self) -> str:
        """The canonical spec string (parseable by `parse`)."""
        if self.kind == "dirichlet":
            return f"dirichlet:{_num(self.alpha)}"
        if self.kind == "sizes":
            return "sizes:" + ",".join(_num(f) for f in self.sizes)
        return self.kind

    @property
    def needs_labels(self) -> bool:
        """Whether the layout is computed from per-example labels (shard, dirichlet)."""
        return self.kind in ("shard", "dirichlet")


def _num(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def parse(spec: Any) -> Partition:
    """The `Partition` of spec string `spec` (ValueError naming the valid specs)."""
    if isinstance(spec, Partition):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"partition must be one of {PARTITIONS}; got {spec!r} of type {type(spec).__name__}.")
    kind, sep, args = spec.partition(":")
    if kind in ("iid", "shard") and not sep:
        return Partition(kind)
    if kind == "dirichlet" and sep:
        try:
            alpha = float(args)
        except ValueError:
            alpha = math.nan
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"partition = {spec!r}: the Dirichlet concentration ALPHA must be a finite number "
                             "> 0, e.g. 'dirichlet:0.5' (smaller is more skewed).")
        return Partition("dirichlet", alpha=alpha)
    if kind == "sizes" and sep:
        try:
            sizes = tuple(float(f) for f in args.split(","))
        except ValueError:
            sizes = ()
        return Partition("sizes", sizes=check_sizes(sizes, f"partition = {spec!r}"))
    raise ValueError(f"partition must be one of {PARTITIONS}; got {spec!r}.")


def check_sizes(sizes, what: str = "sizes") -> tuple[float, ...]:
    """Fractions > 0 that sum to 1 (within 1e-6), as floats; ValueError otherwise."""
    try:
        out = tuple(float(f) for f in sizes)
    except (TypeError, ValueError):
        out = ()
    if not out or not all(math.isfinite(f) and f > 0 for f in out) or abs(sum(out) - 1.0) > 1e-6:
        raise ValueError(f"{what}: the worker fractions must be numbers > 0 that sum to 1, one per worker, "
                         f"e.g. 'sizes:0.5,0.3,0.2'; got {list(sizes) if sizes is not None else None}.")
    return out


def layout(partition: Any, labels: np.ndarray | None, num_workers: int, seed: int, train_size: int,
           *, name: str = "the task") -> tuple[np.ndarray, np.ndarray] | None:
    """The (order [N] int32, bounds [λ + 1] int32) layout of `partition`, or None (iid).

    `labels` [N] are the per-example labels of label-skewed partitions (shard:
    any sortable values; dirichlet: integer class ids); None where the data
    have none (then only iid and sizes are possible). Every worker gets at
    least one example; ValueError (naming `name`) where that is impossible.
    """
    p = parse(partition)
    if p.kind == "iid":
        return None
    if num_workers > train_size:
        raise ValueError(f"partition={p.describe()!r} gives each worker its own examples of the {train_size} "
                         f"training examples of {name}, so num_workers must be <= {train_size}; got "
                         f"{num_workers}. Use fewer workers or partition='iid'.")
    if p.needs_labels:
        if labels is None:
            raise ValueError(f"partition={p.describe()!r} skews the workers' labels, but {name} has no per-example "
                             "labels; pass labels=[N] (class or group ids), or use 'iid' or 'sizes:...'.")
        labels = np.asarray(labels)
        if labels.shape != (train_size,):
            raise ValueError(f"partition={p.describe()!r} needs one label per training example of {name}: shape "
                             f"({train_size},); got labels of shape {labels.shape}.")
    if p.kind == "shard":
        return shard_layout(labels, num_workers, seed)
    if p.kind == "dirichlet":
        if not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"partition={p.describe()!r} splits every class among the workers, so {name} needs "
                             f"integer class labels; got labels of dtype {labels.dtype} (use 'shard' to sort "
                             "by a real-valued target).")
        return dirichlet_layout(labels, num_workers, p.alpha, seed)
    if len(p.sizes) != num_workers:
        raise ValueError(f"partition={p.describe()!r} gives {len(p.sizes)} fractions for num_workers = "
                         f"{num_workers}; give one fraction per worker.")
    return sizes_layout(train_size, p.sizes, seed)


def shard_layout(labels: np.ndarray, num_workers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Label-sorted contiguous shards of sizes differing by at most one (see module docstring)."""
    n = len(labels)
    perm = np.random.default_rng(seed).permutation(n)
    order = perm[np.argsort(np.asarray(labels)[perm], kind="stable")]
    bounds = (np.arange(num_workers + 1) * n) // num_workers
    return order.astype(np.int32), bounds.astype(np.int32)


def dirichlet_layout(labels: np.ndarray, num_workers: int, alpha: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Dirichlet(alpha) label proportions per worker (see module docstring)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, _DIRICHLET_STREAM])
    perm = rng.permutation(len(labels))
    classes = np.unique(labels)
    by_class = [perm[labels[perm] == c] for c in classes]                 # each class in a seeded order
    for _ in range(MAX_RESAMPLES):
        props = rng.dirichlet(np.full(num_workers, float(alpha)), size=len(classes))   # [C, λ]
        if not np.all(np.isfinite(props)):
            continue
        counts = np.stack([_split_counts(len(idx), p) for idx, p in zip(by_class, props)])  # [C, λ]
        if counts.sum(axis=0).min() >= 1:
            break
    else:
        counts = _fill_empty(counts)
    parts = [[] for _ in range(num_workers)]
    for idx, cnt in zip(by_class, counts):
        for w, piece in enumerate(np.split(idx, np.cumsum(cnt)[:-1])):
            parts[w].append(piece)
    order = np.concatenate([np.concatenate(p) for p in parts])
    bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
    return order.astype(np.int32), bounds.astype(np.int32)


def _split_counts(n: int, proportions: np.ndarray) -> np.ndarray:
    """[λ] counts summing to n: the cut points floor(cumsum(p) · n) (as the benchmarks cut)."""
    cuts = np.floor(np.cumsum(proportions)[:-1] * n).astype(np.int64)
    cuts = np.clip(cuts, 0, n)
    return np.diff(np.concatenate([[0], cuts, [n]]))


def _fill_empty(counts: np.ndarray) -> np.ndarray:
    """Give each worker without examples one example of the largest worker's largest class."""
    counts = counts.copy()
    for w in np.flatnonzero(counts.sum(axis=0) == 0):
        donor = int(np.argmax(counts.sum(axis=0)))
        c = int(np.argmax(counts[:, donor]))
        counts[c, donor] -= 1
        counts[c, w] += 1
    return counts


def sizes_layout(train_size: int, fractions, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded permutation cut into pieces of `fractions` of the set (largest remainder, >= 1 each)."""
    fractions = np.asarray(fractions, np.float64)
    k = len(fractions)
    if k > train_size:
        raise ValueError(f"sizes: {k} workers need at least {k} training examples; got {train_size}.")
    quota = fractions / fractions.sum() * train_size
    counts = np.floor(quota).astype(np.int64)
    rest = train_size - counts.sum()
    counts[np.argsort(-(quota - counts), kind="stable")[:rest]] += 1
    for w in np.flatnonzero(counts == 0):      # tiny fractions: one example, from the largest
        counts[np.argmax(counts)] -= 1
        counts[w] = 1
    order = np.random.default_rng([seed, _SIZES_STREAM]).permutation(train_size)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return order.astype(np.int32), bounds.astype(np.int32)


# -- Measures ----------------------------------------------------------------------------------


def worker_examples(layout_: tuple[np.ndarray, np.ndarray] | None, num_workers: int, train_size: int) -> list[int]:
    """Examples each worker may draw from (all of them under iid)."""
    if layout_ is None:
        return [int(train_size)] * num_workers
    bounds = np.asarray(layout_[1])
    return [int(b) for b in np.diff(bounds)]


def label_skew(labels: np.ndarray, layout_: tuple[np.ndarray, np.ndarray] | None) -> float:
    """Mean over workers of the total-variation distance between the worker's label
    distribution and the training set's: 0.5 · Σ_c |p_w(c) − p(c)|, averaged over w.
    0 under iid (every worker draws from the whole set)."""
    if layout_ is None:
        return 0.0
    labels = np.asarray(labels)
    _, codes = np.unique(labels, return_inverse=True)
    codes = codes.reshape(-1)
    num_classes = int(codes.max()) + 1 if codes.size else 0
    total = np.bincount(codes, minlength=num_classes) / max(len(codes), 1)
    order, bounds = layout_
    tv = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        counts = np.bincount(codes[order[lo:hi]], minlength=num_classes)
        tv.append(0.5 * np.abs(counts / max(hi - lo, 1) - total).sum())
    return float(np.mean(tv)) if tv else 0.0


def labels_of(data) -> np.ndarray | None:
    """The integer per-example class labels of a task's data (data['labels'], else
    data['y_train'] when 1-D integer), or None."""
    if not isinstance(data, dict):
        return None
    for key in ("labels", "y_train"):
        if key in data:
            y = np.asarray(data[key])
            if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
                return y
    return None


def info(partition: str, num_workers: int, train_size: int, layout_, labels) -> dict:
    """What a Result's config records about a partition: {"partition", "worker_examples",
    "label_skew"} (label_skew None when the data have no integer class labels)."""
    return {
        "partition": parse(partition).describe(),
        "worker_examples": worker_examples(layout_, num_workers, train_size),
        "label_skew": None if labels is None else label_skew(labels, layout_),
    }
