"""Flax models behind one interface: `linen_model` and `nnx_model` turn a linen
module or an nnx module into a `Model`, an (init, apply) pair on plain-dict params.

Either way the params are a plain nested dict of arrays (string keys; an nnx model's State is
converted with its paths, and merged back inside `apply`), so optimizers, checkpoints and
`Result.save` see ordinary pytrees. `model_kind` says which kind a model is (ModelKindError for
anything else); both builders refuse models with mutable state besides their parameters (BatchNorm
statistics), since a stale-synchronous task trains parameters only. Used by
`staleness.tasks.builders.from_flax` (and `model_kind` by `classification_task`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks.batches import PyTree
from staleness.tasks.errors import ModelKindError, MutableStateError, TaskError

__all__ = ["Model", "first_line", "linen_model", "model_kind", "nnx_model", "load_into"]


# -- Models: linen and nnx behind (init, apply) on plain-dict params ---------------------------


class Model(NamedTuple):
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


def linen_model(model, example: jax.ShapeDtypeStruct, params, model_kwargs: dict) -> Model:
    if model.scope is not None:
        raise ModelKindError(f"model = {type(model).__name__} is a bound linen module (from .bind or inside "
                             "another module's apply); pass the unbound module and its params= instead.")
    dummy = jnp.zeros((1, *example.shape[1:]), example.dtype)
    try:
        variables = jax.eval_shape(lambda k: model.init(k, dummy, **model_kwargs), jax.random.key(0))
    except Exception as e:  # noqa: BLE001 - the user's model: say where it failed
        raise TaskError(f"model {type(model).__name__}.init failed on inputs of shape {dummy.shape} "
                        f"({example.dtype}): {type(e).__name__}: {first_line(e)}") from e
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

    return Model("linen", init, apply, jax.eval_shape(init, jax.random.key(0)))


def nnx_model(model, params, model_kwargs: dict) -> Model:
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
    return Model("nnx", init, apply, jax.eval_shape(init, jax.random.key(0)))


def load_into(module, params):
    """Write trained `params` (a Result's `params`, or its orbax checkpoint restored: a
    nested dict keyed by the parameters' path names) into the nnx `module` in place, and
    return it. For a linen model nothing is needed: `model.apply({"params": params}, x)`.
    Raises ValueError naming the first path whose name or shape does not match."""
    from flax import nnx

    if model_kind(module) != "nnx":
        raise TypeError(f"load_into: module = {type(module).__name__} is not an nnx module; for a linen model "
                        "call model.apply({'params': params}, x)")
    state = nnx.state(module, nnx.Param)
    flat = []
    for path, var in nnx.to_flat_state(state):
        key = tuple(str(k) for k in path)
        try:
            value = _get(params, key)
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"load_into: params has no {'/'.join(key)} (the module's parameters: "
                             f"{_shapes(state)})") from None
        if tuple(np.shape(value)) != tuple(var.get_value().shape):
            raise ValueError(f"load_into: params {'/'.join(key)} has shape {tuple(np.shape(value))}, the module's "
                             f"{tuple(var.get_value().shape)}")
        flat.append((path, var.replace(jnp.asarray(value, var.get_value().dtype))))
    nnx.update(module, nnx.from_flat_state(flat))
    return module


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


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, for one-line errors that quote it."""
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
