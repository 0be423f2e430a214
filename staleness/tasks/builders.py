"""Tasks from the user's own pieces: `from_flax` (a flax model, a loss, arrays) and
`from_functions` (plain functions, for anything else).

    import flax.linen as nn, optax, staleness as st
    task = st.tasks.from_flax(nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(10)]), "cross_entropy",
                              (x, y), batch_size=32, num_workers=8, partition="dirichlet:0.5",
                              optimizer=optax.adamw(1e-3))
    st.simulate(task, st.policies.ssp(3), st.cluster.heterogeneous([1, 1, 2.6, 2.6]), num_updates=500)

Models are flax linen modules (`nn.Module`: `init`/`apply`) or nnx modules
(`nnx.Module` instances). Either way the task's params are a plain nested dict
of arrays (string keys; an nnx model's State is converted with its paths, and
merged back inside the loss), so optimizers, checkpoints and `Result.save`
see ordinary pytrees. Minibatches are training examples drawn by
`staleness.tasks.sampling` (the engine precomputes their index tables on the
host), partitioned per worker as `staleness.tasks.partitions` describes.

Mistakes are `staleness.tasks.errors.TaskError`s (ValueErrors) raised here, at
construction, after checking one batch with `jax.eval_shape`: a model of the
wrong kind, mutable model state (BatchNorm statistics), an unknown loss name,
a loss that is not a scalar, labels of the wrong shape or dtype for the loss,
data arrays of different lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from staleness.metrics import Metric
from staleness.tasks import data as _data
from staleness.tasks import partitions as _partitions
from staleness.tasks.base import PyTree, Task, check_common
from staleness.tasks.errors import DataError, LabelShapeError, LossError, ModelKindError, MutableStateError, TaskError

__all__ = ["LOSSES", "DEFAULT_METRICS", "from_flax", "from_functions", "model_kind"]

LOSSES = ("cross_entropy", "mse", "next_token")
"""Loss names `from_flax` knows (or pass a callable `loss(outputs, batch)`)."""

DEFAULT_METRICS = {
    "cross_entropy": ("loss", "accuracy"),
    "mse": ("mse",),
    "next_token": ("loss", "bits_per_byte"),
    None: ("loss",),          # a callable loss
}
"""Held-out metrics of each loss when `metrics` is not given."""

_BUILTIN_METRICS = {
    "cross_entropy": ("loss", "accuracy", "error"),
    "mse": ("loss", "mse", "mae"),
    "next_token": ("loss", "accuracy", "bits_per_byte", "perplexity"),
    None: ("loss",),
}

DEFAULT_TEST_FRACTION = 0.2
_SPLIT_STREAM = 0x7465


# ---------------------------------------------------------------------------
# Models: linen and nnx behind (init, apply) on plain-dict params


class _Model(NamedTuple):
    kind: str                                   # "linen" or "nnx"
    init: Callable[[jax.Array], PyTree]         # key -> params (plain nested dict)
    apply: Callable[[PyTree, jax.Array], Any]   # (params, inputs) -> outputs
    params_shape: Any                           # ShapeDtypeStructs of the params


def model_kind(model: Any) -> str:
    """'linen' for a flax.linen Module instance, 'nnx' for a flax.nnx Module instance;
    ModelKindError for anything else (a class, a function, another library's model)."""
    import flax.linen as nn
    from flax import nnx

    if isinstance(model, nnx.Module):
        return "nnx"
    if isinstance(model, nn.Module):
        return "linen"
    if isinstance(model, type) and issubclass(model, (nn.Module, nnx.Module)):
        kind = "nnx" if issubclass(model, nnx.Module) else "linen"
        example = "MyModel(rngs=nnx.Rngs(0))" if kind == "nnx" else "MyModel()"
        raise ModelKindError(f"model = {model.__name__} is a flax {kind} Module class; pass an instance, "
                             f"e.g. {example}.")
    raise ModelKindError(f"model = {model!r} (type {type(model).__name__}) is not a flax Module instance; pass a "
                         "flax.linen Module or a flax.nnx Module, or build the task with "
                         "staleness.tasks.from_functions(init, loss, sample, evaluate, ...).")


def _linen_model(model, example: jax.ShapeDtypeStruct, params, model_kwargs: dict) -> _Model:
    if model.scope is not None:
        raise ModelKindError(f"model = {type(model).__name__} is a bound linen module (from .bind or inside "
                             "another module's apply); pass the unbound module and its params= instead.")
    dummy = jnp.zeros((1, *example.shape[1:]), example.dtype)
    try:
        variables = jax.eval_shape(lambda k: model.init(k, dummy, **model_kwargs), jax.random.key(0))
    except Exception as e:  # noqa: BLE001 - the user's model: say where it failed
        raise TaskError(f"model {type(model).__name__}.init failed on inputs of shape {dummy.shape} "
                        f"({example.dtype}): {type(e).__name__}: {_first_line(e)}") from e
    extra = sorted(k for k in variables if k != "params")
    if extra:
        raise MutableStateError(
            f"model {type(model).__name__} has mutable collections {extra} besides 'params' (e.g. BatchNorm's "
            "'batch_stats'); a stale-synchronous task trains parameters only. Use a stateless normalisation "
            "(nn.LayerNorm, nn.GroupNorm) or build the task with from_functions.")
    if "params" not in variables or not jax.tree.leaves(variables["params"]):
        raise TaskError(f"model {type(model).__name__} has no parameters (init returned {list(variables)}).")
    shapes = variables["params"]
    if params is not None:
        given = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.asarray(a).dtype), params)
        if jax.tree.structure(given) != jax.tree.structure(shapes) or any(
                a.shape != b.shape for a, b in zip(jax.tree.leaves(given), jax.tree.leaves(shapes))):
            raise TaskError(f"params= do not match model {type(model).__name__}'s parameters: expected "
                            f"{_shapes(shapes)}, got {_shapes(given)}.")
        fixed = _plain(params)
        init = _fixed_init(fixed)
    else:
        init = jax.jit(lambda key: _plain(model.init(key, dummy, **model_kwargs)["params"]))

    def apply(p, inputs):
        return model.apply({"params": p}, inputs, **model_kwargs)

    return _Model("linen", init, apply, jax.eval_shape(init, jax.random.key(0)))


def _nnx_model(model, params, model_kwargs: dict) -> _Model:
    from flax import nnx

    if params is not None:
        raise ModelKindError("params= is for linen models; an nnx module carries its own weights (set them on "
                             "the module before building the task).")
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    stats, other = [], []
    for path, var in nnx.to_flat_state(rest):
        if isinstance(var, nnx.BatchStat):
            stats.append("/".join(map(str, path)))
        elif not isinstance(var, nnx.RngState):
            other.append(f"{'/'.join(map(str, path))} ({type(var).__name__})")
    if stats:
        raise MutableStateError(
            f"nnx model {type(model).__name__} has BatchStat variables {stats} (BatchNorm running statistics); "
            "a stale-synchronous task trains parameters only. Use nnx.LayerNorm or nnx.GroupNorm instead.")
    if other:
        raise MutableStateError(f"nnx model {type(model).__name__} has mutable non-parameter variables {other}; "
                                "only nnx.Param variables (and RNG streams) are supported.")
    flat = list(nnx.to_flat_state(state))
    if not flat:
        raise TaskError(f"nnx model {type(model).__name__} has no nnx.Param variables.")
    paths = [tuple(str(k) for k in path) for path, _ in flat]
    if len(set(paths)) != len(paths):
        raise TaskError(f"nnx model {type(model).__name__}: parameter paths collide when written as strings.")
    fixed = _nest({p: jnp.asarray(var.get_value()) for p, (_, var) in zip(paths, flat)})

    def to_state(p):
        return nnx.from_flat_state([(path, var.replace(_get(p, sp))) for sp, (path, var) in zip(paths, flat)])

    def apply(p, inputs):
        return nnx.merge(graphdef, to_state(p), rest)(inputs, **model_kwargs)

    init = _fixed_init(fixed)
    return _Model("nnx", init, apply, jax.eval_shape(init, jax.random.key(0)))


def _fixed_init(params):
    """init(key) -> fresh copies of fixed params (the engine donates its carry)."""
    def init(key):
        del key
        return jax.tree.map(jnp.array, params)

    return init


def _plain(tree):
    """A plain nested dict (str keys) of arrays from a params mapping (FrozenDict, State)."""
    if isinstance(tree, Mapping):
        return {str(k): _plain(v) for k, v in tree.items()}
    return tree


def _nest(flat: dict[tuple[str, ...], Any]) -> dict:
    root: dict = {}
    for path, value in flat.items():
        node = root
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
    return root


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _shapes(tree) -> str:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return "{" + ", ".join(f"{jax.tree_util.keystr(p)}: {tuple(a.shape)}" for p, a in flat) + "}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


# ---------------------------------------------------------------------------
# Data


def _arrays(value: Any, what: str) -> dict[str, np.ndarray]:
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


def _split(arrays: dict[str, np.ndarray], fraction: Any, seed: int):
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


# ---------------------------------------------------------------------------
# Losses and metrics (per example: [B] values)


def _mean_rest(v: jax.Array) -> jax.Array:
    """Mean over every axis but the first: [B, ...] -> [B]."""
    return jnp.mean(v.reshape(v.shape[0], -1), axis=1)


def _ce(logits, labels):
    return _mean_rest(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels))


def _hits(logits, labels):
    return _mean_rest((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))


def _targets(loss_name: str | None, batch) -> jax.Array | None:
    if loss_name == "next_token":
        return batch["x"][:, 1:]
    return batch.get("y")


def _named_per_example(loss_name: str):
    """(outputs, batch) -> [B] loss values of a named loss."""
    if loss_name == "mse":
        return lambda out, b: _mean_rest(jnp.square(out - b["y"]))
    return lambda out, b: _ce(out, _targets(loss_name, b))


def _builtin_metric(name: str, loss_name: str | None, per_example_loss):
    """(per-example fn, finalize) of built-in metric `name` for the loss."""
    ln2 = math.log(2.0)
    if name == "loss":
        return per_example_loss, None
    if name == "mse":
        return (lambda out, b: _mean_rest(jnp.square(out - b["y"]))), None
    if name == "mae":
        return (lambda out, b: _mean_rest(jnp.abs(out - b["y"]))), None
    if name == "accuracy":
        return (lambda out, b: _hits(out, _targets(loss_name, b))), None
    if name == "error":
        return (lambda out, b: 1.0 - _hits(out, _targets(loss_name, b))), None
    if name == "bits_per_byte":
        return (lambda out, b: per_example_loss(out, b) / ln2), None
    if name == "perplexity":   # exp of the mean token loss, not the mean of exps
        return per_example_loss, jnp.exp
    raise AssertionError(name)


def _metric_table(metrics, loss_name: str | None, per_example_loss):
    """[(Metric, per-example fn, finalize or None)] from `metrics` (see from_flax)."""
    from staleness import metrics as _metrics

    builtin = _BUILTIN_METRICS[loss_name]
    if metrics is None:
        metrics = DEFAULT_METRICS[loss_name]
    items = list(metrics.items()) if isinstance(metrics, Mapping) else [(m, None) for m in metrics]
    if not items:
        raise TaskError("metrics is empty; give at least one held-out metric.")
    out = []
    for key, fn in items:
        metric = key if isinstance(key, Metric) else None
        name = metric.name if metric is not None else key
        if not isinstance(name, str) or not name:
            raise TaskError(f"metrics: {key!r} must be a metric name or a staleness.metrics.Metric.")
        if metric is None:
            metric = _metrics.get(name)   # ValueError: no known direction (declare a Metric)
        metric.validate()
        if fn is None:
            if name not in builtin:
                what = f"loss {loss_name!r}" if loss_name else "a callable loss"
                raise TaskError(f"metric {name!r} has no built-in definition for {what} (built in: "
                                f"{', '.join(builtin)}); give its function: metrics={{{name!r}: fn}} with "
                                "fn(outputs, batch) -> [B] per-example values.")
            fn, finalize = _builtin_metric(name, loss_name, per_example_loss)
        elif callable(fn):
            finalize = None
        else:
            raise TaskError(f"metrics[{name!r}] = {fn!r} must be a function (outputs, batch) -> [B] values or None.")
        out.append((metric, fn, finalize))
    names = [m.name for m, _, _ in out]
    if len(set(names)) != len(names):
        raise TaskError(f"metrics {names} name one metric twice.")
    return out


def _check_labels(loss_name: str, outputs: jax.ShapeDtypeStruct, train: dict, test: dict, input_key: str) -> None:
    """Labels (targets) that fit the loss and the model's outputs, with values in range."""
    b = outputs.shape[0]
    if loss_name == "next_token":
        x = train[input_key]
        if len(outputs.shape) != 3:
            raise LabelShapeError(f"loss 'next_token' needs sequence logits [B, T, vocab] from the model; got "
                                  f"outputs of shape {outputs.shape}.")
        labels = [train[input_key][:, 1:], test[input_key][:, 1:]]
        want = (b, x.shape[1] - 1)
        if outputs.shape[:2] != want:
            raise LabelShapeError(f"loss 'next_token' predicts x[:, 1:] from x[:, :-1]: logits must be "
                                  f"[B, T, vocab] = [{b}, {x.shape[1] - 1}, vocab]; got {outputs.shape}.")
    else:
        if "y" not in train:
            raise LabelShapeError(f"loss {loss_name!r} needs targets: give data as (x, y) or a dict with 'y'; "
                                  f"got fields {sorted(train)}.")
        y = train["y"]
        labels = [train["y"], test["y"]]
        if loss_name == "mse":
            if (b, *y.shape[1:]) != tuple(outputs.shape):
                hint = (" (reshape y to [N, 1], e.g. y[:, None])" if tuple(outputs.shape) == (b, 1) and y.ndim == 1
                        else "")
                raise LabelShapeError(f"loss 'mse' needs targets y of the outputs' shape: outputs are "
                                      f"{tuple(outputs.shape)}, y per batch is {(b, *y.shape[1:])}{hint}.")
            if not np.issubdtype(y.dtype, np.number):
                raise LabelShapeError(f"loss 'mse' needs numeric targets; got y of dtype {y.dtype}.")
            return
        if len(outputs.shape) < 2 or (b, *y.shape[1:]) != tuple(outputs.shape[:-1]):
            raise LabelShapeError(
                f"loss 'cross_entropy' needs integer labels of the logits' shape without the class axis: logits "
                f"{tuple(outputs.shape)} need labels {(b, *outputs.shape[1:-1])} per batch; got y of shape "
                f"{(b, *y.shape[1:])}" + (" (one-hot labels? pass y.argmax(-1))" if y.shape[1:] == outputs.shape[1:]
                                          else "") + ".")
    for arr in labels:
        if not np.issubdtype(arr.dtype, np.integer):
            raise LabelShapeError(f"loss {loss_name!r} needs integer class ids (token ids); got dtype {arr.dtype}.")
        vocab = outputs.shape[-1]
        if arr.size and (arr.min() < 0 or arr.max() >= vocab):
            raise LabelShapeError(f"loss {loss_name!r}: labels must lie in [0, {vocab}) for {vocab} logits; got "
                                  f"values in [{arr.min()}, {arr.max()}].")


def _check_scalar_loss(loss_fn, params_shape, batch, what: str) -> None:
    try:
        value = jax.eval_shape(loss_fn, params_shape, batch)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's loss: name it
        raise LossError(f"{what} failed on a batch of {_shape_text(batch)}: {type(e).__name__}: "
                        f"{_first_line(e)}") from e
    if not isinstance(value, jax.ShapeDtypeStruct) or value.shape != () or not jnp.issubdtype(value.dtype,
                                                                                              jnp.floating):
        got = (f"shape {value.shape} and dtype {value.dtype}" if isinstance(value, jax.ShapeDtypeStruct)
               else f"{type(value).__name__}")
        raise LossError(f"{what} must return a scalar float (the mean loss of the batch); got {got}.")


def _shape_text(batch) -> str:
    return "{" + ", ".join(f"{k!r}: {tuple(v.shape)} {v.dtype}" for k, v in batch.items()) + "}"


# ---------------------------------------------------------------------------
# from_flax


def from_flax(
    model: Any,
    loss: str | Callable[[Any, dict], jax.Array],
    data: Any,
    *,
    test: Any = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    batch_size: int,
    num_workers: int = 1,
    partition: str = "iid",
    sizes: Sequence[float] | None = None,
    labels: Any = None,
    metrics: Any = None,
    optimizer: Any = None,
    name: str | None = None,
    seed: int = 0,
    params: PyTree = None,
    input_key: str = "x",
    model_kwargs: dict | None = None,
    eval_chunk: int = _data.DEFAULT_EVAL_CHUNK,
) -> Task:
    """A Task from a flax model (linen or nnx), a loss and in-memory arrays.

    Args:
      model: a flax.linen Module (params from `model.init(key, x)`, one set per run
        seed) or a flax.nnx Module instance (its current weights are the initial
        params of every run, whatever the seed). No mutable state besides
        parameters (no BatchNorm statistics); an nnx module's RNG streams are
        constants (every call sees the same stream: use deterministic layers).
        Called on batch[input_key] ([B, ...]; 'next_token': x[:, :-1]).
      loss: 'cross_entropy' (integer labels y: logits [B, C] with y [B], or sequence
        logits [B, T, C] with y [B, T]), 'mse' (y of the outputs' shape),
        'next_token' (x holds token sequences [B, T + 1]: predict x[:, 1:] from
        x[:, :-1]; logits [B, T, vocab]), or a callable loss(outputs, batch) ->
        scalar or per-example [B] values (averaged), with batch the dict of fields.
      data: training examples: (x, y), a dict {field: array} (fields of one leading
        length; the batch holds the same fields), or one array (x; e.g. tokens).
      test: held-out examples, in the same form; default: `test_fraction` of `data`
        split off (seeded by `seed`); test_fraction=0 evaluates on the training data.
      batch_size: per-worker minibatch μ (examples per gradient).
      num_workers: workers λ the data are partitioned for.
      partition: 'iid', 'shard', 'dirichlet:ALPHA' or 'sizes:F1,...' (see
        `staleness.tasks.partitions`); sizes=[F1, ...] is the same as 'sizes:F1,...'.
      labels: the per-example labels label-skewed partitions split by: None (y when
        1-D), a field name of `data`, or an array with one entry per example of `data`.
      metrics: held-out metrics: None (cross_entropy: loss, accuracy; mse: mse;
        next_token: loss, bits_per_byte; callable loss: loss), a sequence of names
        (built in: loss, accuracy, error, mse, mae, bits_per_byte, perplexity, as the
        loss allows) or `staleness.metrics.Metric` values, or a dict {name or Metric:
        fn(outputs, batch) -> [B] per-example values, or None for the built-in}.
        A name without a known direction must be declared as a Metric.
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
    from staleness.tasks.registry import check_name

    sizes_spec = None if sizes is None else _partitions.Partition(
        "sizes", sizes=_partitions.check_sizes(sizes)).describe()
    if sizes_spec is not None:
        if partition not in ("iid", sizes_spec):
            raise TaskError(f"give either sizes= or partition={partition!r}, not both.")
        partition = sizes_spec
    check_common(batch_size, num_workers, partition, seed)
    partition = _partitions.parse(partition).describe()
    if isinstance(eval_chunk, bool) or not isinstance(eval_chunk, int) or eval_chunk < 1:
        raise TaskError(f"eval_chunk must be an int >= 1 (test examples per evaluation step); got {eval_chunk!r}.")
    model_kwargs = dict(model_kwargs or {})
    kind = model_kind(model)
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise LossError(f"loss = {loss!r} is not a known loss; valid: {', '.join(LOSSES)}, or a callable "
                            "loss(outputs, batch) -> scalar.")
        loss_name = loss
    elif callable(loss):
        loss_name = None
    else:
        raise LossError(f"loss = {loss!r} must be one of {LOSSES} or a callable loss(outputs, batch) -> scalar.")

    arrays = _arrays(data, "data")
    label_field = None
    if isinstance(labels, str):
        if labels not in arrays:
            raise DataError(f"labels = {labels!r} is not a field of data; fields: {sorted(arrays)}.")
        label_field = labels
    elif labels is not None:
        lab = np.asarray(labels)
        n = len(next(iter(arrays.values())))
        if lab.shape != (n,):
            raise DataError(f"labels must hold one entry per example of data: shape ({n},); got {lab.shape}.")
        label_field = "\0labels"
        arrays[label_field] = lab
    if input_key not in arrays:
        raise DataError(f"the model reads field {input_key!r} (input_key) but data has {sorted(arrays)}.")
    if test is None:
        train, test_arrays = _split(arrays, test_fraction, seed)
    else:
        train = arrays
        test_arrays = _arrays(test, "test")
        missing = sorted(set(train) - set(test_arrays) - {"\0labels"})
        if missing:
            raise DataError(f"test lacks the fields {missing} that data has.")
        test_arrays = {k: test_arrays[k] for k in train if k in test_arrays}
    part_labels = train.pop(label_field) if label_field == "\0labels" else (
        train[label_field] if label_field is not None else None)
    test_arrays.pop("\0labels", None)
    if part_labels is None and "y" in train and train["y"].ndim == 1:
        part_labels = train["y"]
    train_size, test_size = len(train[input_key]), len(test_arrays[input_key])

    x = train[input_key]
    if loss_name == "next_token":
        if x.ndim != 2 or x.shape[1] < 2 or not np.issubdtype(x.dtype, np.integer):
            raise LabelShapeError(f"loss 'next_token' needs integer token sequences [N, T + 1] (T >= 1) in field "
                                  f"{input_key!r}; got shape {x.shape} and dtype {x.dtype}.")
        example = jax.ShapeDtypeStruct((batch_size, x.shape[1] - 1), x.dtype)
    else:
        example = jax.ShapeDtypeStruct((batch_size, *x.shape[1:]), x.dtype)
    m = _linen_model(model, example, params, model_kwargs) if kind == "linen" else _nnx_model(model, params,
                                                                                             model_kwargs)
    apply = m.apply

    def inputs_of(batch):
        v = batch[input_key]
        return v[:, :-1] if loss_name == "next_token" else v

    batch_spec = {k: jax.ShapeDtypeStruct((batch_size, *a.shape[1:]), a.dtype) for k, a in train.items()}
    try:
        outputs = jax.eval_shape(apply, m.params_shape, example)
    except Exception as e:  # noqa: BLE001 - the user's model: say on what it failed
        raise TaskError(f"model {type(model).__name__} failed on inputs of shape {example.shape} "
                        f"({example.dtype}): {type(e).__name__}: {_first_line(e)}") from e
    if loss_name is not None:
        if not isinstance(outputs, jax.ShapeDtypeStruct):
            raise LabelShapeError(f"loss {loss_name!r} needs one output array from the model; got "
                                  f"{jax.tree.structure(outputs)}.")
        _check_labels(loss_name, outputs, train, test_arrays, input_key)
        per_example = _named_per_example(loss_name)
    else:
        per_example = _callable_per_example(loss, outputs, batch_spec)

    def loss_fn(p: PyTree, batch: dict) -> jax.Array:
        out = apply(p, inputs_of(batch))
        if loss_name is None:
            value = loss(out, batch)
            return jnp.mean(value)
        return jnp.mean(per_example(out, batch))

    _check_scalar_loss(loss_fn, m.params_shape, {**batch_spec, "index": jax.ShapeDtypeStruct((batch_size,),
                                                                                             jnp.int32)},
                       f"the loss of task {name or type(model).__name__!r}")
    table = _metric_table(metrics, loss_name, per_example)
    test_spec = {k: jax.ShapeDtypeStruct((min(eval_chunk, test_size), *a.shape[1:]), a.dtype)
                 for k, a in test_arrays.items()}
    for metric, fn, _ in table:
        _check_per_example(metric.name, fn, apply, inputs_of, m.params_shape, test_spec)

    chunks, mask = _data.chunked(test_arrays, eval_chunk)
    task_data = {
        _data.EXAMPLES: train,
        "test_examples": chunks,
        "mask_test": mask,
        **_data.sampler_data(part_labels, partition, num_workers, seed, train_size=train_size,
                             name=repr(name or type(model).__name__)),
    }
    if part_labels is not None and part_labels.ndim == 1 and np.issubdtype(part_labels.dtype, np.integer):
        task_data["labels"] = part_labels.astype(np.int32)
    task_name = check_name(name) if name is not None else type(model).__name__
    return Task(
        name=task_name,
        batch_size=batch_size,
        num_workers=num_workers,
        partition=partition,
        metric_names=tuple(mt.name for mt, _, _ in table),
        train_size=train_size,
        test_size=test_size,
        seed=seed,
        init_fn=m.init,
        loss_fn=loss_fn,
        sample_fn=_data.make_sample_fn(batch_size, partition, train_size, source=_data.EXAMPLES),
        gather_fn=_data.make_gather_fn(source=_data.EXAMPLES),
        eval_fn=_eval_fn(apply, inputs_of, tuple(table), test_size),
        data=jax.tree.map(jnp.asarray, task_data),
        metrics=tuple(mt for mt, _, _ in table),
        optimizer=optimizer,
    )


def _callable_per_example(loss, outputs, batch_spec):
    """Per-example values of a callable loss: its own [B] values, or (scalar losses)
    the loss of each example alone (vmapped), so held-out means ignore padding."""
    b = next(iter(batch_spec.values())).shape[0]
    try:
        value = jax.eval_shape(loss, outputs, batch_spec)
    except Exception as e:  # noqa: BLE001 - the user's loss
        raise LossError(f"loss {getattr(loss, '__name__', loss)!r} failed on the model's outputs "
                        f"({jax.tree.map(lambda s: tuple(s.shape), outputs)}) and a batch of "
                        f"{_shape_text(batch_spec)}: {type(e).__name__}: {_first_line(e)}") from e
    shape = getattr(value, "shape", None)
    if shape == (b,):
        return loss
    if shape == ():
        def one_by_one(out, batch):
            return jax.vmap(lambda o, bt: loss(jax.tree.map(lambda a: a[None], o),
                                               jax.tree.map(lambda a: a[None], bt)))(out, batch)

        return one_by_one
    raise LossError(f"loss {getattr(loss, '__name__', loss)!r} must return a scalar (the batch mean) or "
                    f"per-example values [B] = [{b}]; got {value}.")


def _check_per_example(name, fn, apply, inputs_of, params_shape, test_spec) -> None:
    b = next(iter(test_spec.values())).shape[0]

    def run(p, batch):
        return fn(apply(p, inputs_of(batch)), batch)

    try:
        value = jax.eval_shape(run, params_shape, test_spec)
    except Exception as e:  # noqa: BLE001 - the user's metric
        raise TaskError(f"metric {name!r} failed on a test chunk of {_shape_text(test_spec)}: "
                        f"{type(e).__name__}: {_first_line(e)}") from e
    if getattr(value, "shape", None) != (b,):
        raise TaskError(f"metric {name!r} must return per-example values [B] = [{b}]; got {value}.")


def _eval_fn(apply, inputs_of, table, test_size: int):
    """Jitted eval_fn(params, data): each metric's mean over the test set, chunk by chunk."""

    def eval_fn(params: PyTree, data: PyTree) -> dict[str, jax.Array]:
        def chunk_sums(args):
            batch, mask = args
            out = apply(params, inputs_of(batch))
            return [jnp.sum(jnp.where(mask, fn(out, batch).astype(jnp.float32), 0.0)) for _, fn, _ in table]

        sums = jax.lax.map(chunk_sums, (data["test_examples"], data["mask_test"]))
        result = {}
        for (metric, _, finalize), s in zip(table, sums):
            mean = jnp.sum(s) / test_size
            result[metric.name] = finalize(mean) if finalize is not None else mean
        return result

    return jax.jit(eval_fn)


# ---------------------------------------------------------------------------
# from_functions


def from_functions(
    init: Callable[[jax.Array], PyTree],
    loss: Callable[[PyTree, Any], jax.Array],
    sample: Callable[..., Any],
    evaluate: Callable[..., dict],
    *,
    batch_size: int,
    num_workers: int = 1,
    metrics: Sequence[str | Metric],
    data: PyTree = None,
    name: str = "custom",
    partition: str = "iid",
    seed: int = 0,
    optimizer: Any = None,
    train_size: int = 0,
    test_size: int = 0,
) -> Task:
    """A Task from plain functions, for anything `from_flax` does not cover.

    Args:
      init: key -> params (a pytree of float arrays).
      loss: (params, batch) -> scalar mean loss of the batch; differentiable in params.
      sample: the minibatch of a worker's iteration, a pure function of its
        arguments: sample(key, worker, iteration) -> batch, or, with `data`,
        sample(data, key, worker, iteration). `worker` and `iteration` may be
        traced int32 scalars (it runs inside the compiled replay).
      evaluate: held-out metrics: evaluate(params) -> {name: scalar}, or, with
        `data`, evaluate(params, data); the names are exactly `metrics`.
      batch_size: per-worker minibatch μ (recorded; `sample` decides the batch).
      num_workers: workers λ.
      metrics: the metric names `evaluate` returns, or `staleness.metrics.Metric`
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
    from staleness.tasks.registry import check_name

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
    from staleness import metrics as _metrics

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
    _check_scalar_loss(loss, params_shape, batch, f"loss of task {name!r}")
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
                        f"{_first_line(e)}") from e
