"""Tasks: models (flax) + data sets + loss/metrics behind one small `Task` interface.

    import staleness.tasks as tasks
    task = tasks.get("digits-mlp", batch_size=32, partition="iid", num_workers=8, seed=0)
    params = task.init_params(jax.random.key(0))
    batch = task.minibatch(data_key, worker, iteration)      # pure in (key, worker, iteration)
    grads = jax.grad(task.loss)(params, batch)
    task.evaluate(params)                                     # {"loss": ..., "accuracy": ...}

Built-in names: `names()` (the RL tasks' in `rl`). Your own: `from_flax`, `from_functions`,
`register(name, factory)` or `--task package.module:factory` (`registry`). Per-worker
partitions: `partitions`.
"""

import importlib

_NAMES = {
    "Task": "base", "NO_EXAMPLE": "batches", "concat_batches": "batches", "from_flax": "builders",
    "from_functions": "builders", "classification_task": "classification", "DataError": "errors",
    "FactoryError": "errors", "LabelShapeError": "errors", "LossError": "errors", "ModelKindError": "errors",
    "MutableStateError": "errors", "TaskError": "errors", "load_into": "flax_models", "PARTITIONS": "partitions",
    "get": "registry", "names": "registry", "options": "registry", "register": "registry", "resolve": "registry",
}
"""Each public name and the module it lives in, loaded on first use: the metrics and the
optimizer specs (`metrics`, `optim`) load without the models, the data sets or JAX's models."""

_MODULES = ("cifar", "data", "metrics", "models", "optim", "partitions", "rl")

__all__ = sorted([*_NAMES, *_MODULES])


def __getattr__(name):
    if name in _NAMES:
        value = getattr(importlib.import_module(f"staleness.tasks.{_NAMES[name]}"), name)
    elif name in _MODULES:
        value = importlib.import_module(f"staleness.tasks.{name}")
    else:
        raise AttributeError(f"module 'staleness.tasks' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return list(__all__)
