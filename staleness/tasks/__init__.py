"""Tasks: models (flax) + data sets + loss/metrics behind one small `Task` interface.

    import staleness.tasks as tasks
    task = tasks.get("digits-mlp", batch_size=32, partition="iid", num_workers=8, seed=0)
    params = task.init_params(jax.random.key(0))
    batch = task.minibatch(data_key, worker, iteration)      # pure in (key, worker, iteration)
    grads = jax.grad(task.loss)(params, batch)
    task.evaluate(params)                                     # {"loss": ..., "accuracy": ...}

Built-in names: quadratic, linreg, digits-mlp, digits-cnn, mnist1d-mlp,
mnist1d-cnn, cifar10-resnet20, cifar100-resnet20 (see `names()`).
"""

from staleness.tasks import cifar, data, models
from staleness.tasks.base import NO_EXAMPLE, PARTITIONS, Task, concat_batches
from staleness.tasks.classification import classification_task
from staleness.tasks.registry import get, names, options

__all__ = [
    "NO_EXAMPLE",
    "PARTITIONS",
    "Task",
    "cifar",
    "classification_task",
    "concat_batches",
    "data",
    "get",
    "models",
    "names",
    "options",
]
