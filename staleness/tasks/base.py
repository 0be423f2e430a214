"""The `Task` value: model + data + loss + metrics behind one small interface.

A task is what the engine and the runtime train: an immutable value whose methods are
pure, jittable functions (the example in `staleness.tasks`).

`Task` is also a pytree: its leaves are the arrays it reads (`data`, and `optimum`/`hessian` where
known); everything else is static metadata. Closing over a task inside `jit` embeds its data as
compile-time constants, which is fine for the small built-in data sets (< 1 MB) but slow to compile
for CIFAR (150 MB); passing the task as a `jit` argument instead makes the data ordinary
device inputs:

    step = jax.jit(lambda task, params, key, w, i: jax.grad(task.loss)(params, task.minibatch(key, w, i)))

The built-in tasks' `init_fn`, `sample_fn` and `eval_fn` are already jitted
(inside an outer `jit` they are inlined) and shared by tasks built with the same
configuration, so eager calls compile once per process, not once per task.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from staleness.tasks import data as _data
from staleness.tasks import partitions, sampling
from staleness.tasks.batches import Batch, PyTree


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """One training problem: model, data, loss and held-out metrics (build one with
    `staleness.tasks.get`, `from_flax` or `from_functions`).

    Attributes:
      name: registry name, e.g. "digits-mlp".
      batch_size: per-worker minibatch size μ (examples per gradient).
      num_workers: number of workers λ the data are partitioned for.
      partition: "iid", "shard", "dirichlet:ALPHA" or "sizes:F1,...,Fλ" (see `PARTITIONS`).
      metric_names: the keys `evaluate` returns, e.g. ("loss", "accuracy").
      train_size: number of training examples (0 for tasks without data).
      test_size: number of held-out examples `evaluate` averages over (0 if none).
      seed: the seed the task's data, split and shards were generated from.
      init_fn: key -> params; the pure function behind `init_params`.
      loss_fn: (params, batch) -> scalar; the pure function behind `loss`.
      sample_fn: (data, key, worker, iteration) -> batch; behind `minibatch`.
      eval_fn: (params, data) -> dict of scalars; behind `evaluate`.
      data: pytree of arrays read by `sample_fn`/`eval_fn` (training and test
        arrays, shard layout). Leaves of the Task pytree.
      optimum: params pytree of the known minimiser of the training loss
        (quadratic, linreg), else None. Pytree leaves.
      hessian: Hessian of the training loss where it is a constant matrix over
        the flattened params (quadratic), else None. Pytree leaf.
      metrics: the `staleness.tasks.metrics.Metric` of each name in metric_names
        (direction and range); default: known by name (loss, accuracy, mse, ...).
      gather_fn: (data, index [μ] int32, key, worker, iteration) -> batch, for tasks whose
        minibatches are training examples drawn by `staleness.tasks.sampling` (then `sample_fn` is
        the hash + gather_fn, and the engine reads precomputed index tables); None for tasks that
        sample otherwise (their `sample_fn` runs inside the replay).
      optimizer: the optimizer the task trains with when a run names none (an
        optimizer spec string or an optax transformation); None: 'sgd'.
      options: ((key, value), ...) the task-specific options a built-in task was
        built with (`tasks.get(name, **options)`), so a Result can rebuild it.
      holdout_fn: (task, fraction, seed) -> Task, the validation split of a task
        whose data are not x_train/y_train arrays (the language model's byte
        stream); None: `holdout` splits x_train/y_train itself.
    """

    name: str
    batch_size: int
    num_workers: int
    partition: str
    metric_names: tuple[str, ...]
    train_size: int
    test_size: int
    seed: int
    init_fn: Callable[[jax.Array], PyTree]
    loss_fn: Callable[[PyTree, Batch], jax.Array]
    sample_fn: Callable[[PyTree, jax.Array, Any, Any], Batch]
    eval_fn: Callable[[PyTree, PyTree], dict[str, jax.Array]]
    data: PyTree = None
    optimum: PyTree = None
    hessian: jax.Array | None = None
    metrics: tuple = ()
    gather_fn: Callable[[PyTree, jax.Array, jax.Array, Any, Any], Batch] | None = None
    optimizer: Any = None
    options: tuple = ()
    holdout_fn: Callable[["Task", float, int], "Task"] | None = None

    def __post_init__(self):
        # Directions of the metrics: declared (staleness.tasks.metrics.Metric values) or
        # known by name; a metric without a known direction is an error here, not
        # a wrong "time to target" later.
        from staleness.tasks import metrics as _metrics

        declared = _metrics.resolve(self.metric_names, self.metrics or None)
        if self.metrics and tuple(m.name for m in self.metrics) != tuple(self.metric_names):
            raise ValueError(f"task {self.name!r}: metrics {[m.name for m in self.metrics]} must match "
                             f"metric_names {list(self.metric_names)}")
        object.__setattr__(self, "metrics", declared)
        if self.train_size and self.batch_size > self.train_size:
            raise ValueError(f"task {self.name!r}: batch_size = {self.batch_size} is more than its {self.train_size} "
                             f"training examples; give a batch_size of at most {self.train_size}")
        if isinstance(self.optimizer, str):   # a spec string: a bad one is an error now, not at the first run
            from staleness.tasks import optim as _optim

            _optim.get(self.optimizer, f"task {self.name!r}: optimizer")

    def metric(self, name: str):
        """The `staleness.tasks.metrics.Metric` `name` of this task (ValueError naming the valid ones)."""
        from staleness.tasks import metrics

        return metrics.find(self.metrics, name, self.name)

    def config(self) -> dict:
        """What a Result's config records of its task: name, minibatch size, the seed of
        its data and partition, the partition and how non-IID it is, the metrics."""
        return {"task": self.name, "batch_size": self.batch_size, "task_seed": self.seed,
                "task_options": dict(self.options), **self.partition_info(), "metrics": self.metrics_config()}

    def metrics_config(self) -> dict:
        """{name: [goal, low, high]} of every metric (what a Result's config records)."""
        return {m.name: m.to_json() for m in self.metrics}

    @property
    def default_metric(self) -> str:
        """The metric comparisons report by default: accuracy where the task has it, else its first."""
        return "accuracy" if "accuracy" in self.metric_names else self.metric_names[0]

    def init_params(self, key: jax.Array) -> PyTree:
        """Initial parameters (a pytree of float32 arrays) from a PRNG key."""
        return self.init_fn(key)

    def loss(self, params: PyTree, batch: Batch) -> jax.Array:
        """Mean training loss of `params` over `batch`; pure and differentiable in params."""
        return self.loss_fn(params, batch)

    def minibatch(self, key: jax.Array, worker: Any, iteration: Any) -> Batch:
        """The minibatch worker `worker` uses for its iteration `iteration`.

        A pure function of (key, worker, iteration): the same triple always gives
        the same examples, so a schedule can be replayed and the examples of any gradient recovered.
        `worker` and `iteration` may be traced int32 scalars (inside `jit`, `vmap`, `scan`).

        Args:
          key: the run's data key; it is folded with the worker, then the iteration.
          worker: worker id in [0, num_workers). Checked when a Python int; a traced
            out-of-range id cannot raise and gives unspecified examples under `shard`.
          iteration: the worker's iteration (its clock when it pulled), >= 0.

        Returns:
          {"x": [μ, ...], "y": [μ], "index": [μ] int32}, fixed shapes (`staleness.tasks.batches`).
        """
        if isinstance(worker, (int, np.integer)) and not 0 <= worker < self.num_workers:
            raise ValueError(f"worker={worker} is out of range for task {self.name!r} with "
                             f"num_workers={self.num_workers}; valid workers are 0..{self.num_workers - 1}.")
        if isinstance(iteration, (int, np.integer)) and iteration < 0:
            raise ValueError(f"iteration={iteration} must be >= 0.")
        return self.sample_fn(self.data, key, worker, iteration)

    @property
    def indexed(self) -> bool:
        """Whether minibatches can come from precomputed index tables (`host_indices`)."""
        return self.gather_fn is not None

    @functools.cached_property
    def _layout(self):
        return None if self.partition == "iid" else sampling.layout_of(self.data)

    def host_indices(self, key, worker, iteration) -> np.ndarray:
        """[..., μ] int32 training indices of the minibatches of `worker`/`iteration`
        (NumPy arrays of one shape), computed on the host: exactly the indices
        `minibatch(key, worker, iteration)` draws. Only for `indexed` tasks. `key`: the
        data key, or its `jax.random.key_data` as NumPy (a caller drawing many blocks
        fetches it once)."""
        if not self.indexed:
            raise ValueError(f"task {self.name!r} draws its minibatches on the device (no gather_fn)")
        if not isinstance(key, np.ndarray):
            key = jax.random.key_data(key)
        bits = np.asarray(key, np.uint32).reshape(-1)[:2]
        return sampling.host_indices(bits, np.asarray(worker), np.asarray(iteration), self.batch_size,
                                     self.train_size, self._layout)

    def batch(self, index, key: jax.Array, worker, iteration) -> Batch:
        """The minibatch of training examples `index` ([μ] int32; jittable)."""
        return self.gather_fn(self.data, index, key, worker, iteration)

    def evaluate(self, params: PyTree) -> dict[str, jax.Array]:
        """Held-out metrics of `params`: {name: scalar} for name in `metric_names`. Jittable; large
        test sets are processed in fixed-size chunks so memory stays bounded."""
        return self.eval_fn(params, self.data)

    @functools.cached_property
    def param_count(self) -> int:
        """Number of scalar parameters (computed from shapes; no FLOPs)."""
        shapes = jax.eval_shape(self.init_fn, jax.random.key(0))
        return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes)))

    def shard_indices(self, worker: int) -> np.ndarray:
        """Training-set indices worker `worker` may draw from (all of them under iid)."""
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker={worker} is out of range; valid workers are 0..{self.num_workers - 1}.")
        if self.partition == "iid" or self.train_size == 0:
            return np.arange(self.train_size)
        order = np.asarray(self.data["order"])
        lo, hi = np.asarray(self.data["shard_bounds"])[[worker, worker + 1]]
        return order[lo:hi]

    def holdout(self, fraction: float = 0.1, seed: int = 0) -> "Task":
        """The task to tune hyper-parameters on: a `fraction` of the training examples
        (drawn with `seed`) becomes its held-out set, the rest its training set; the test
        set is not used at all. The task itself is returned for tasks without data
        (the quadratic: its objective is the held-out metric). Raises ValueError for
        tasks whose data layout has no such split; a task with its own `holdout_fn`
        (the language model: the tail of its training stream) splits itself."""
        if self.train_size == 0:
            return self
        if not (isinstance(fraction, float) and 0.0 < fraction < 1.0):
            raise ValueError(f"holdout: fraction = {fraction!r} must be a float in (0, 1)")
        if self.holdout_fn is not None:
            return self.holdout_fn(self, fraction, seed)
        d = self.data if isinstance(self.data, dict) else {}
        if not (self.indexed and {"x_train", "y_train", "x_test", "mask_test"} <= set(d)):
            raise ValueError(f"task {self.name!r} has no validation split (its data are not x_train/y_train "
                             "arrays); give a learning rate instead of tuning it")
        val, train = self.holdout_split(fraction, seed)
        x, y = np.asarray(d["x_train"]), np.asarray(d["y_train"])
        chunk = int(np.asarray(d["x_test"]).shape[1])
        new = {"x_train": x[train], "y_train": y[train],
               **_data.sampler_data(y[train], self.partition, self.num_workers, self.seed),
               **_data.chunked_test_data(x[val], y[val], chunk)}
        return dataclasses.replace(
            self, name=f"{self.name}[validation]", train_size=len(train), test_size=len(val),
            data=_data.device_data(new),
            sample_fn=_data.sample_fn_for(self.gather_fn, self.batch_size, self.partition, len(train)))

    def holdout_split(self, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(held-out, kept) sorted indices of the training examples for `holdout`: a
        `fraction` of them (at least one) drawn with `seed`; ValueError if fewer than
        `num_workers` would be left to train on."""
        n = self.train_size
        k = max(1, round(fraction * n))
        if n - k < self.num_workers:
            raise ValueError(f"holdout: {n} training examples are too few to hold out {k} for validation")
        perm = np.random.default_rng(seed).permutation(n)
        return np.sort(perm[:k]), np.sort(perm[k:])

    def partition_info(self) -> dict:
        """The partition and how non-IID it is (what a Result's config records): `partitions.info`."""
        return partitions.info(self.partition, self.num_workers, self.train_size, self._layout,
                               partitions.labels_of(self.data) if self.train_size else None)

    def __repr__(self) -> str:
        return (f"Task(name={self.name!r}, batch_size={self.batch_size}, num_workers={self.num_workers}, "
                f"partition={self.partition!r}, train_size={self.train_size}, test_size={self.test_size}, "
                f"metric_names={self.metric_names})")


jax.tree_util.register_dataclass(
    Task,
    data_fields=["data", "optimum", "hessian"],
    meta_fields=["name", "batch_size", "num_workers", "partition", "metric_names", "train_size", "test_size", "seed",
                 "init_fn", "loss_fn", "sample_fn", "eval_fn", "metrics", "gather_fn", "optimizer", "options",
                 "holdout_fn"],
)
