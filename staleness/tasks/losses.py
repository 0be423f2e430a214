"""The named losses of `from_flax`, the held-out metrics of each loss, and the
construction-time checks of losses, labels and metrics.

A loss is 'cross_entropy', 'mse', 'next_token' (`LOSSES`) or a callable loss(outputs, batch); every
loss and metric is computed per example ([B] values), so held-out means over padded test chunks
ignore the padding. The checks run on shapes (`jax.eval_shape`) when the task is built and raise
`staleness.tasks.errors.TaskError`s: labels of the wrong shape, dtype or range for the loss, a loss
that is not a scalar, a metric that is not per example. Used by `staleness.tasks.builders`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from staleness.tasks.metrics import Metric
from staleness.tasks.batches import PyTree
from staleness.tasks.errors import LabelShapeError, LossError, TaskError
from staleness.tasks.flax_models import first_line

__all__ = ["LOSSES", "DEFAULT_METRICS", "callable_per_example", "check_labels", "check_per_example",
           "check_scalar_loss", "metric_table", "metrics_eval_fn", "named_per_example"]

LOSSES = ("cross_entropy", "mse", "next_token")
"""Loss names `from_flax` knows (or pass a callable `loss(outputs, batch)`)."""

DEFAULT_METRICS = {"cross_entropy": ("loss", "accuracy"), "mse": ("mse",), "next_token": ("loss", "bits_per_byte"),
                   None: ("loss",)}   # None: a callable loss
"""Held-out metrics of each loss when `metrics` is not given."""

_BUILTIN_METRICS = {"cross_entropy": ("loss", "accuracy", "error"), "mse": ("loss", "mse", "mae"),
                    "next_token": ("loss", "accuracy", "bits_per_byte", "perplexity"), None: ("loss",)}


# -- Losses and metrics (per example: [B] values) ----------------------------------------------


def _mean_rest(v: jax.Array) -> jax.Array:
    """Mean over every axis but the first: [B, ...] -> [B]."""
    return jnp.mean(v.reshape(v.shape[0], -1), axis=1)


def _ce(logits, labels):
    return _mean_rest(optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels))


def _hits(logits, labels):
    return _mean_rest((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))


def _targets(loss_name: str | None, batch, input_key: str = "x") -> jax.Array | None:
    if loss_name == "next_token":   # the model's own input field, one token ahead
        return batch[input_key][:, 1:]
    return batch.get("y")


def named_per_example(loss_name: str, input_key: str = "x"):
    """(outputs, batch) -> [B] loss values of a named loss (`input_key`: the field the
    model reads, which holds next_token's token sequences)."""
    if loss_name == "mse":
        return lambda out, b: _mean_rest(jnp.square(out - b["y"]))
    return lambda out, b: _ce(out, _targets(loss_name, b, input_key))


def _builtin_metric(name: str, loss_name: str | None, per_example_loss, input_key: str = "x"):
    """(per-example fn, finalize) of built-in metric `name` for the loss."""
    ln2 = math.log(2.0)
    if name == "loss":
        return per_example_loss, None
    if name == "mse":
        return (lambda out, b: _mean_rest(jnp.square(out - b["y"]))), None
    if name == "mae":
        return (lambda out, b: _mean_rest(jnp.abs(out - b["y"]))), None
    if name == "accuracy":
        return (lambda out, b: _hits(out, _targets(loss_name, b, input_key))), None
    if name == "error":
        return (lambda out, b: 1.0 - _hits(out, _targets(loss_name, b, input_key))), None
    if name == "bits_per_byte":
        return (lambda out, b: per_example_loss(out, b) / ln2), None
    if name == "perplexity":   # exp of the mean token loss, not the mean of exps
        return per_example_loss, jnp.exp
    raise AssertionError(name)


def metric_table(metrics, loss_name: str | None, per_example_loss, input_key: str = "x"):
    """[(Metric, per-example fn, finalize or None)] from `metrics` (see from_flax)."""
    from staleness.tasks import metrics as _metrics

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
            raise TaskError(f"metrics: {key!r} must be a metric name or a staleness.tasks.metrics.Metric.")
        if metric is None:
            metric = _metrics.get(name)   # ValueError: no known direction (declare a Metric)
        metric.validate()
        if fn is None:
            if name not in builtin:
                what = f"loss {loss_name!r}" if loss_name else "a callable loss"
                raise TaskError(f"metric {name!r} has no built-in definition for {what} (built in: "
                                f"{', '.join(builtin)}); give its function: metrics={{{name!r}: fn}} with "
                                "fn(outputs, batch) -> [B] per-example values.")
            fn, finalize = _builtin_metric(name, loss_name, per_example_loss, input_key)
        elif callable(fn):
            finalize = None
        else:
            raise TaskError(f"metrics[{name!r}] = {fn!r} must be a function (outputs, batch) -> [B] values or None.")
        out.append((metric, fn, finalize))
    names = [m.name for m, _, _ in out]
    if len(set(names)) != len(names):
        raise TaskError(f"metrics {names} name one metric twice.")
    return out


def check_labels(loss_name: str, outputs: jax.ShapeDtypeStruct, train: dict, test: dict, input_key: str) -> None:
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


def check_scalar_loss(loss_fn, params_shape, batch, what: str) -> None:
    try:
        value = jax.eval_shape(loss_fn, params_shape, batch)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's loss: name it
        raise LossError(f"{what} failed on a batch of {_shape_text(batch)}: {type(e).__name__}: "
                        f"{first_line(e)}") from e
    if not isinstance(value, jax.ShapeDtypeStruct) or value.shape != () or not jnp.issubdtype(value.dtype,
                                                                                              jnp.floating):
        got = (f"shape {value.shape} and dtype {value.dtype}" if isinstance(value, jax.ShapeDtypeStruct)
               else f"{type(value).__name__}")
        raise LossError(f"{what} must return a scalar float (the mean loss of the batch); got {got}.")


def _shape_text(batch) -> str:
    return "{" + ", ".join(f"{k!r}: {tuple(v.shape)} {v.dtype}" for k, v in batch.items()) + "}"


def callable_per_example(loss, outputs, batch_spec):
    """Per-example values of a callable loss: its own [B] values, or (scalar losses)
    the loss of each example alone (vmapped), so held-out means ignore padding."""
    b = next(iter(batch_spec.values())).shape[0]
    try:
        value = jax.eval_shape(loss, outputs, batch_spec)
    except Exception as e:  # noqa: BLE001 - the user's loss
        raise LossError(f"loss {getattr(loss, '__name__', loss)!r} failed on the model's outputs "
                        f"({jax.tree.map(lambda s: tuple(s.shape), outputs)}) and a batch of "
                        f"{_shape_text(batch_spec)}: {type(e).__name__}: {first_line(e)}") from e
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


def check_per_example(name, fn, apply, inputs_of, params_shape, test_spec) -> None:
    b = next(iter(test_spec.values())).shape[0]

    def run(p, batch):
        return fn(apply(p, inputs_of(batch)), batch)

    try:
        value = jax.eval_shape(run, params_shape, test_spec)
    except Exception as e:  # noqa: BLE001 - the user's metric
        raise TaskError(f"metric {name!r} failed on a test chunk of {_shape_text(test_spec)}: "
                        f"{type(e).__name__}: {first_line(e)}") from e
    if getattr(value, "shape", None) != (b,):
        raise TaskError(f"metric {name!r} must return per-example values [B] = [{b}]; got {value}.")


def metrics_eval_fn(apply, inputs_of, table, test_size: int):
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
