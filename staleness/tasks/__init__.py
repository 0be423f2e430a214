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

from staleness.tasks import cifar, data, models, partitions, rl
from staleness.tasks.base import Task
from staleness.tasks.batches import NO_EXAMPLE, concat_batches
from staleness.tasks.builders import from_flax, from_functions
from staleness.tasks.classification import classification_task
from staleness.tasks.errors import (DataError, FactoryError, LabelShapeError, LossError, ModelKindError,
                                    MutableStateError, TaskError)
from staleness.tasks.flax_models import load_into
from staleness.tasks.partitions import PARTITIONS
from staleness.tasks.registry import get, names, options, register, resolve

__all__ = [
    "NO_EXAMPLE",
    "PARTITIONS",
    "DataError",
    "FactoryError",
    "LabelShapeError",
    "LossError",
    "ModelKindError",
    "MutableStateError",
    "Task",
    "TaskError",
    "cifar",
    "classification_task",
    "concat_batches",
    "data",
    "from_flax",
    "from_functions",
    "get",
    "load_into",
    "models",
    "names",
    "options",
    "partitions",
    "register",
    "resolve",
    "rl",
]
