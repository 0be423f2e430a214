"""Tasks: models (flax) + data sets + loss/metrics behind one small `Task` interface.

    import staleness.tasks as tasks
    task = tasks.get("digits-mlp", batch_size=32, partition="iid", num_workers=8, seed=0)
    params = task.init_params(jax.random.key(0))
    batch = task.minibatch(data_key, worker, iteration)      # pure in (key, worker, iteration)
    grads = jax.grad(task.loss)(params, batch)
    task.evaluate(params)                                     # {"loss": ..., "accuracy": ...}

Built-in names: quadratic, linreg, digits-mlp, digits-cnn, mnist1d-mlp,
mnist1d-cnn, cifar10-resnet20, cifar100-resnet20, and the RL tasks rl-bandit and
rl-digits (`rl`: asynchronous RL's actors and learner) (see `names()`).

Your own: `from_flax(model, loss, data, ...)` (a linen or nnx model, a loss name
or function, arrays), `from_functions(init, loss, sample, evaluate, ...)`;
`register(name, factory)` names a factory for `get` and the CLI, which also
accepts `--task package.module:factory`. Per-worker partitions: iid, shard,
dirichlet:ALPHA, sizes:F1,...,Fλ (`partitions`).
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
