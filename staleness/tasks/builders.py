"""Tasks from the user's own pieces: `from_flax` (a flax model, a loss, arrays) and
`from_functions` (plain functions, for anything else).

    import flax.linen as nn, optax, staleness as st
    task = st.tasks.from_flax(nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(10)]), "cross_entropy",
                              (x, y), batch_size=32, num_workers=8, partition="dirichlet:0.5",
                              optimizer=optax.adamw(1e-3))
    st.simulate(task, st.policies.ssp(3), st.cluster.heterogeneous([1, 1, 2.6, 2.6]), num_updates=500)

Mistakes are `staleness.tasks.errors.TaskError`s raised here, at construction, after checking
one batch with `jax.eval_shape`. The models' (init, apply) pairs on plain-dict params live in
`staleness.tasks.flax_models`; the named losses, held-out metrics and their checks in
`staleness.tasks.losses`; the checks and the test split of the user's arrays in
`staleness.tasks.examples`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks import metrics as _metrics
from staleness.tasks.metrics import Metric
from staleness.tasks import data as _data
from staleness.tasks import partitions as _partitions
from staleness.tasks.base import Task
from staleness.tasks.batches import PyTree
from staleness.tasks.checks import check_common, check_name
from staleness.tasks.errors import DataError, LabelShapeError, LossError, TaskError
from staleness.tasks.examples import DEFAULT_TEST_FRACTION, Examples, split_examples
from staleness.tasks.flax_models import Model, first_line, linen_model, model_kind, nnx_model
from staleness.tasks.losses import (DEFAULT_METRICS, LOSSES, callable_per_example, check_labels, check_per_example,
                                    check_scalar_loss, metric_table, metrics_eval_fn, named_per_example)

__all__ = ["LOSSES", "DEFAULT_METRICS", "from_flax", "from_functions", "model_kind"]


# -- from_flax ---------------------------------------------------------------------------------


def from_flax(model: Any, loss: str | Callable[[Any, dict], jax.Array], data: Any, *, test: Any = None,
              test_fraction: float = DEFAULT_TEST_FRACTION, batch_size: int, num_workers: int = 1,
              partition: str = "iid", sizes: Sequence[float] | None = None, labels: Any = None, metrics: Any = None,
              optimizer: Any = None, name: str | None = None, seed: int = 0, params: PyTree = None,
              input_key: str = "x", model_kwargs: dict | None = None,
              eval_chunk: int = _data.DEFAULT_EVAL_CHUNK) -> Task:
    """A Task from a flax model (linen or nnx), a loss and in-memory arrays.

    Args:
      model: a flax.linen Module (params from `model.init(key, x)`, one set per run seed) or a
        flax.nnx Module instance (its current weights are the initial params of every run, whatever
        the seed). No mutable state besides parameters (no BatchNorm statistics); an nnx module's
        RNG streams are constants (every call sees the same stream: use deterministic layers).
        Called on batch[input_key] ([B, ...]; 'next_token': x[:, :-1]).
      loss: 'cross_entropy' (integer labels y: logits [B, C] with y [B], or sequence logits [B, T,
        C] with y [B, T]), 'mse' (y of the outputs' shape), 'next_token' (x holds token sequences
        [B, T + 1]: predict x[:, 1:] from x[:, :-1]; logits [B, T, vocab]), or a callable
        loss(outputs, batch) -> scalar or per-example [B] values (averaged), with batch the dict of
        fields. The held-out 'loss' of a callable returning a scalar is the mean of its value on
        each example alone: a loss that couples the examples of a batch (a sum, a contrastive loss)
        should return [B] values or come with its own metrics.
      data: training examples: (x, y), a dict {field: array} (fields of one leading
        length; the batch holds the same fields), or one array (x; e.g. tokens).
      test: held-out examples, in the same form; default: `test_fraction` of `data`
        split off (seeded by `seed`); test_fraction=0 evaluates on the training data.
      batch_size, num_workers: as `Task`'s (μ, λ).
      partition: 'iid', 'shard', 'dirichlet:ALPHA' or 'sizes:F1,...' (see
        `staleness.tasks.partitions`); sizes=[F1, ...] is the same as 'sizes:F1,...'.
      labels: the per-example labels label-skewed partitions split by: None (y when
        1-D), a field name of `data`, or an array with one entry per example of `data`.
      metrics: held-out metrics: None (cross_entropy: loss, accuracy; mse: mse; next_token: loss,
        bits_per_byte; callable loss: loss), a sequence of names (built in: loss, accuracy, error,
        mse, mae, bits_per_byte, perplexity, as the loss allows) or `staleness.tasks.metrics.Metric`
        values, or a dict {name or Metric: fn(outputs, batch) -> [B] per-example values, or None for
        the built-in}. A name without a known direction must be declared as a Metric.
      optimizer: the task's default optimizer (optax transformation or spec string).
      name: the task's name (default: the model's class name).
      seed: seed of the test split and of the partition layout.
      params: linen only: fixed initial params (instead of `model.init` per seed).
      input_key: the field the model reads (default 'x').
      model_kwargs: extra keyword arguments of every model call (e.g. {'train': False}).
      eval_chunk: test examples per step of the chunked evaluation loop.

    Returns:
      The `Task` (indexed: its minibatches come from host index tables).
    """
    partition = _sized_partition(partition, sizes)
    check_common(batch_size, num_workers, partition, seed)
    partition = _partitions.parse(partition).describe()
    if isinstance(eval_chunk, bool) or not isinstance(eval_chunk, int) or eval_chunk < 1:
        raise TaskError(f"eval_chunk must be an int >= 1 (test examples per evaluation step); got {eval_chunk!r}.")
    model_kwargs = dict(model_kwargs or {})
    kind = model_kind(model)
    loss_name = _loss_name(loss)
    ex = split_examples(data, test, test_fraction, labels, input_key, seed)
    example = _model_input(ex.train[input_key], loss_name, batch_size, input_key)
    m = linen_model(model, example, params, model_kwargs) if kind == "linen" else nnx_model(model, params,
                                                                                            model_kwargs)
    inputs_of = _inputs_of(input_key, loss_name == "next_token")
    outputs = _output_shape(model, m, example)
    batch_spec = {k: jax.ShapeDtypeStruct((batch_size, *a.shape[1:]), a.dtype) for k, a in ex.train.items()}
    per_example = _per_example(loss, loss_name, outputs, ex, input_key, batch_spec)
    loss_fn = _loss_fn(loss, loss_name, per_example, m.apply, inputs_of)
    check_scalar_loss(loss_fn, m.params_shape, {**batch_spec, "index": jax.ShapeDtypeStruct((batch_size,),
                                                                                            jnp.int32)},
                      f"the loss of task {name or type(model).__name__!r}")
    table = _checked_metrics(metrics, loss_name, per_example, input_key, m, inputs_of, ex.test, eval_chunk)
    task_name = check_name(name) if name is not None else type(model).__name__
    layout = _Layout(batch_size, num_workers, partition, seed, input_key, eval_chunk, m.apply, inputs_of, table)
    task_data, eval_fn, sample_fn = layout.pieces(ex.train, ex.test, ex.labels, repr(name or type(model).__name__))
    return Task(
        name=task_name, batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=tuple(mt.name for mt, _, _ in table), train_size=len(ex.train[input_key]),
        test_size=len(ex.test[input_key]), seed=seed, init_fn=m.init, loss_fn=loss_fn, sample_fn=sample_fn,
        gather_fn=_data.make_gather_fn(source=_data.EXAMPLES), eval_fn=eval_fn, data=task_data,
        metrics=tuple(mt for mt, _, _ in table), optimizer=optimizer,
        holdout_fn=_holdout_fn(layout, ex.train, ex.labels),
    )


def _sized_partition(partition: str, sizes: Sequence[float] | None) -> str:
    """The partition spec of `from_flax(partition=, sizes=)`: sizes=[F1, ...] is
    'sizes:F1,...'; giving both (a partition other than the default) is an error."""
    if sizes is None:
        return partition
    sizes_spec = _partitions.Partition("sizes", sizes=_partitions.check_sizes(sizes)).describe()
    if partition not in ("iid", sizes_spec):
        raise TaskError(f"give either sizes= or partition={partition!r}, not both.")
    return sizes_spec


def _loss_name(loss: Any) -> str | None:
    """The name of a named loss (one of `LOSSES`), None for a callable; LossError otherwise."""
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise LossError(f"loss = {loss!r} is not a known loss; valid: {', '.join(LOSSES)}, or a callable "
                            "loss(outputs, batch) -> scalar.")
        return loss
    if callable(loss):
        return None
    raise LossError(f"loss = {loss!r} must be one of {LOSSES} or a callable loss(outputs, batch) -> scalar.")


# -- The model on a batch: its inputs and the shape of its outputs -----------------------------


def _model_input(x: np.ndarray, loss_name: str | None, batch_size: int, input_key: str) -> jax.ShapeDtypeStruct:
    """The shape of the model's input batch for training inputs `x` ([N, ...]): [μ, ...],
    or the first T tokens of each [N, T + 1] sequence under 'next_token'."""
    if loss_name == "next_token":
        if x.ndim != 2 or x.shape[1] < 2 or not np.issubdtype(x.dtype, np.integer):
            raise LabelShapeError(f"loss 'next_token' needs integer token sequences [N, T + 1] (T >= 1) in field "
                                  f"{input_key!r}; got shape {x.shape} and dtype {x.dtype}.")
        return jax.ShapeDtypeStruct((batch_size, x.shape[1] - 1), x.dtype)
    return jax.ShapeDtypeStruct((batch_size, *x.shape[1:]), x.dtype)


def _inputs_of(input_key: str, next_token: bool) -> Callable[[dict], jax.Array]:
    """batch -> the model's inputs: field `input_key` (without its last token under 'next_token')."""

    def inputs_of(batch):
        v = batch[input_key]
        return v[:, :-1] if next_token else v

    return inputs_of


def _output_shape(model: Any, m: Model, example: jax.ShapeDtypeStruct) -> Any:
    """The shapes of the model's outputs on `example`; TaskError saying on what it failed."""
    try:
        return jax.eval_shape(m.apply, m.params_shape, example)
    except Exception as e:  # noqa: BLE001 - the user's model: say on what it failed
        hint = ""
        if m.kind == "nnx" and type(e).__name__ == "TraceContextError":
            hint = (" (an nnx module that draws random numbers, e.g. Dropout in training mode, cannot run "
                    "inside a compiled replay: call model.eval() first, or make those layers deterministic)")
        raise TaskError(f"model {type(model).__name__} failed on inputs of shape {example.shape} "
                        f"({example.dtype}): {type(e).__name__}: {first_line(e)}{hint}") from e


# -- Loss and held-out metrics -----------------------------------------------------------------


def _per_example(loss: Any, loss_name: str | None, outputs: Any, ex: Examples, input_key: str,
                 batch_spec: dict) -> Callable:
    """The per-example loss (outputs, batch) -> [B] of a named loss (labels checked
    against the outputs) or of a callable one."""
    if loss_name is None:
        return callable_per_example(loss, outputs, batch_spec)
    if not isinstance(outputs, jax.ShapeDtypeStruct):
        raise LabelShapeError(f"loss {loss_name!r} needs one output array from the model; got "
                              f"{jax.tree.structure(outputs)}.")
    check_labels(loss_name, outputs, ex.train, ex.test, input_key)
    return named_per_example(loss_name, input_key)


def _loss_fn(loss: Any, loss_name: str | None, per_example: Callable, apply: Callable,
             inputs_of: Callable) -> Callable[[PyTree, dict], jax.Array]:
    """The task's loss_fn(params, batch): the mean of the loss over the batch."""

    def loss_fn(p: PyTree, batch: dict) -> jax.Array:
        out = apply(p, inputs_of(batch))
        return jnp.mean(loss(out, batch) if loss_name is None else per_example(out, batch))

    return loss_fn


def _checked_metrics(metrics: Any, loss_name: str | None, per_example: Callable, input_key: str, m: Model,
                     inputs_of: Callable, test: dict[str, np.ndarray], eval_chunk: int) -> tuple:
    """The held-out metrics table [(Metric, per-example fn, finalize)] of `metrics`, each
    checked on one chunk of the test examples."""
    table = tuple(metric_table(metrics, loss_name, per_example, input_key))
    chunk = min(eval_chunk, len(test[input_key]))
    test_spec = {k: jax.ShapeDtypeStruct((chunk, *a.shape[1:]), a.dtype) for k, a in test.items()}
    for metric, fn, _ in table:
        check_per_example(metric.name, fn, m.apply, inputs_of, m.params_shape, test_spec)
    return table


# -- Data layout and the validation split ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How a from_flax task lays out (training, held-out) examples as its data, eval_fn
    and sample_fn: one recipe for the task and for its `holdout` split."""

    batch_size: int
    num_workers: int
    partition: str
    seed: int
    input_key: str
    eval_chunk: int
    apply: Callable
    inputs_of: Callable
    table: tuple

    def pieces(self, train: dict, held_out: dict, labels: np.ndarray | None, label_name: str):
        """The task's data, eval_fn and sample_fn for these training and held-out examples."""
        n = len(train[self.input_key])
        chunks, mask = _data.chunked(held_out, self.eval_chunk)
        out = {_data.EXAMPLES: train, "test_examples": chunks, "mask_test": mask,
               **_data.sampler_data(labels, self.partition, self.num_workers, self.seed, train_size=n,
                                    name=label_name)}
        if labels is not None and labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer):
            out["labels"] = labels.astype(np.int32)
        return (jax.tree.map(jnp.asarray, out),
                metrics_eval_fn(self.apply, self.inputs_of, self.table, len(held_out[self.input_key])),
                _data.make_sample_fn(self.batch_size, self.partition, n, source=_data.EXAMPLES))


def _holdout_fn(layout: _Layout, train: dict, labels: np.ndarray | None) -> Callable[[Task, float, int], Task]:
    """The `holdout_fn` of a from_flax task trained on `train` (partitioned by `labels`)."""

    def holdout(task, fraction, split_seed):
        """`Task.holdout`: `fraction` of the training examples (drawn with `split_seed`)
        become the held-out set, the rest the training set (partitioned again); the test
        set is not used."""
        val, keep = task.holdout_split(fraction, split_seed)
        kept_labels = None if labels is None else labels[keep]
        data, eval_fn, sample_fn = layout.pieces({f: a[keep] for f, a in train.items()},
                                                 {f: a[val] for f, a in train.items()}, kept_labels,
                                                 repr(f"{task.name}[validation]"))
        return dataclasses.replace(task, name=f"{task.name}[validation]", train_size=len(keep), test_size=len(val),
                                   data=data, eval_fn=eval_fn, sample_fn=sample_fn)

    return holdout


# -- from_functions ----------------------------------------------------------------------------


def from_functions(init: Callable[[jax.Array], PyTree], loss: Callable[[PyTree, Any], jax.Array],
                   sample: Callable[..., Any], evaluate: Callable[..., dict], *, batch_size: int, num_workers: int = 1,
                   metrics: Sequence[str | Metric], data: PyTree = None, name: str = "custom",
                   partition: str = "iid", seed: int = 0, optimizer: Any = None, train_size: int = 0,
                   test_size: int = 0) -> Task:
    """A Task from plain functions, for anything `from_flax` does not cover.

    Args:
      init: key -> params (a pytree of float arrays).
      loss: (params, batch) -> scalar mean loss of the batch; differentiable in params.
      sample: the minibatch of a worker's iteration, a pure function of its arguments: sample(key,
        worker, iteration) -> batch, or, with `data`, sample(data, key, worker, iteration). `worker`
        and `iteration` may be traced int32 scalars (it runs inside the compiled replay).
      evaluate: held-out metrics: evaluate(params) -> {name: scalar}, or, with
        `data`, evaluate(params, data); the names are exactly `metrics`.
      batch_size: per-worker minibatch μ (recorded; `sample` decides the batch).
      num_workers: workers λ.
      metrics: the metric names `evaluate` returns, or `staleness.tasks.metrics.Metric`
        values (names without a known direction must be declared so).
      data: optional pytree of arrays the functions read, passed to them as jit
        arguments (not compile-time constants), e.g. training and test arrays.
      name, seed, optimizer, train_size, test_size: recorded on the Task
        (optimizer: its default optimizer).
      partition: 'iid', or a layout partition when `data` holds "order" and
        "shard_bounds" (see `staleness.tasks.partitions`).

    Returns:
      The `Task` (its minibatches are drawn by `sample` inside the replay).
    """
    check_common(batch_size, num_workers, partition, seed)
    partition = _partitions.parse(partition).describe()
    for arg, fn in (("init", init), ("loss", loss), ("sample", sample), ("evaluate", evaluate)):
        if not callable(fn):
            raise TaskError(f"{arg} = {fn!r} must be a function.")
    if partition != "iid" and not (isinstance(data, dict) and "order" in data and "shard_bounds" in data):
        raise DataError(f"partition = {partition!r} needs its layout in data['order'], data['shard_bounds'] "
                        "(see staleness.tasks.partitions.layout); `sample` decides what each worker draws.")
    for arg, v in (("train_size", train_size), ("test_size", test_size)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise TaskError(f"{arg} must be an int >= 0; got {v!r}.")
    if isinstance(metrics, (str, Metric)):
        metrics = [metrics]
    declared = tuple(m if isinstance(m, Metric) else None for m in metrics)
    names = tuple(m.name if isinstance(m, Metric) else m for m in metrics)
    if not names:
        raise TaskError("metrics is empty; name the metrics `evaluate` returns.")
    resolved = tuple(d if d is not None else _metrics.get(n) for d, n in zip(declared, names))
    if data is None:
        def sample_fn(d, key, worker, iteration):
            del d
            return sample(key, worker, iteration)

        def eval_fn(params, d):
            del d
            return evaluate(params)
    else:
        sample_fn, eval_fn = sample, evaluate
    task_data = jax.tree.map(jnp.asarray, data) if data is not None else {}

    key = jax.random.key(0)
    params_shape = _eval_shape_named("init", init, key)
    batch = _eval_shape_named("sample", sample_fn, task_data, key, jnp.int32(0), jnp.int32(0))
    check_scalar_loss(loss, params_shape, batch, f"loss of task {name!r}")
    values = _eval_shape_named("evaluate", eval_fn, params_shape, task_data)
    if not isinstance(values, Mapping) or set(values) != set(names):
        raise TaskError(f"evaluate must return a dict with exactly the metrics {list(names)}; got "
                        f"{sorted(values) if isinstance(values, Mapping) else type(values).__name__}.")
    bad = [k for k, v in values.items() if getattr(v, "shape", None) != ()]
    if bad:
        raise TaskError(f"evaluate must return scalars; {bad} are not.")
    return Task(
        name=check_name(name), batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=names, train_size=int(train_size), test_size=int(test_size), seed=seed,
        init_fn=jax.jit(init), loss_fn=loss, sample_fn=jax.jit(sample_fn), eval_fn=jax.jit(eval_fn),
        data=task_data, metrics=resolved, optimizer=optimizer,
    )


def _eval_shape_named(what: str, fn, *args):
    try:
        return jax.eval_shape(fn, *args)
    except Exception as e:  # noqa: BLE001 - the user's function: name it
        raise TaskError(f"{what} failed when called on example arguments: {type(e).__name__}: "
                        f"{first_line(e)}") from e
