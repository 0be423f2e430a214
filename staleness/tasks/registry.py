"""Tasks by name: built-in, registered (`register`) or `package.module:factory`.

`get` builds any of them; `resolve` is what the engine and the runtime call; `names`, `options`.

A factory (registered or named as `module:factory`) is called with the keyword arguments a built-in
task gets (batch_size, num_workers, partition, seed, and data_dir), filtered by its signature (all of
them if it takes **kwargs), plus any task options, and must return a `Task`. The Task is renamed to
the name it was asked for, so a Result records that name and `staleness replay` can resolve it again.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from staleness.tasks import cifar, data, lm, models
from staleness.infra import specs
from staleness.tasks import partitions as _partitions
from staleness.tasks.base import Task
from staleness.tasks.checks import check_common, check_name
from staleness.tasks.classification import classification_task
from staleness.tasks.errors import FactoryError
from staleness.tasks.synthetic import linreg, quadratic


def _check_conv_impl(conv_impl: Any) -> None:
    if conv_impl not in models.CONV_IMPLS:
        raise ValueError(f"conv_impl must be one of {models.CONV_IMPLS}; got {conv_impl!r}.")


def _digits_mlp(batch_size: int, num_workers: int, partition: str, seed: int) -> Task:
    """digits-mlp: scikit-learn digits (1437 train / 360 test 8x8 images, fixed split); MLP 64-128-10."""
    model = models.MLP(hidden=(128,), num_outputs=10)
    return classification_task("digits-mlp", model, data.digits(), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _digits_cnn(batch_size: int, num_workers: int, partition: str, seed: int, *,
                conv_impl: str = "auto") -> Task:
    """digits-cnn: scikit-learn digits, two 3x3 convs (16, 32 channels) + 2x2 pool + linear."""
    _check_conv_impl(conv_impl)
    model = models.CNN2D(channels=(16, 32), num_outputs=10, conv_impl=conv_impl)
    return classification_task("digits-cnn", model, data.digits(), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _check_num_samples(num_samples: Any) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 10:
        raise ValueError(f"num_samples must be an int >= 10; got {num_samples!r}.")


def _mnist1d_mlp(batch_size: int, num_workers: int, partition: str, seed: int, *,
                 num_samples: int = 5000) -> Task:
    """mnist1d-mlp: MNIST-1D generated locally (4000 train / 1000 test by default); MLP 40-128-128-10."""
    _check_num_samples(num_samples)
    model = models.MLP(hidden=(128, 128), num_outputs=10)
    return classification_task("mnist1d-mlp", model, data.mnist1d(num_samples), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _mnist1d_cnn(batch_size: int, num_workers: int, partition: str, seed: int, *,
                 num_samples: int = 5000, conv_impl: str = "auto") -> Task:
    """mnist1d-cnn: MNIST-1D, three stride-2 1-D convs (32 channels; kernels 5, 3, 3) + linear."""
    _check_num_samples(num_samples)
    _check_conv_impl(conv_impl)
    model = models.CNN1D(num_outputs=10, conv_impl=conv_impl)
    return classification_task("mnist1d-cnn", model, data.mnist1d(num_samples), batch_size=batch_size,
                               num_workers=num_workers, partition=partition, seed=seed)


def _cifar(num_classes: int):
    name = f"cifar{num_classes}-resnet20"

    def build(batch_size: int, num_workers: int, partition: str, seed: int, *,
              data_dir: Any = None, augment: bool = True, eval_chunk: int = 500,
              conv_impl: str = "auto") -> Task:
        check_common(batch_size, num_workers, partition, seed)
        _check_conv_impl(conv_impl)
        arrays = cifar.load(data_dir, num_classes)
        train_tf, test_tf = cifar.make_transforms(*cifar.channel_stats(arrays.x_train), augment=bool(augment))
        return classification_task(
            name, models.resnet20(num_classes, conv_impl), arrays, batch_size=batch_size,
            num_workers=num_workers, partition=partition, seed=seed,
            train_transform=train_tf, test_transform=test_tf, eval_chunk=eval_chunk,
        )

    build.__doc__ = f"{name}: CIFAR-{num_classes} from a local directory (tasks.cifar), ResNet-20 + GroupNorm."
    return build


_BUILDERS: dict[str, Callable[..., Task]] = {
    "quadratic": quadratic, "linreg": linreg, "digits-mlp": _digits_mlp, "digits-cnn": _digits_cnn,
    "mnist1d-mlp": _mnist1d_mlp, "mnist1d-cnn": _mnist1d_cnn, "cifar10-resnet20": _cifar(10),
    "cifar100-resnet20": _cifar(100), "stdlib-lm": lm.stdlib_lm,
}

_NEEDS_DATA_DIR = ("cifar10-resnet20", "cifar100-resnet20")


_REGISTERED: dict[str, Callable[..., Task]] = {}
"""Tasks added with `register` (this process only)."""

_COMMON = ("batch_size", "num_workers", "partition", "seed", "data_dir")
GET_DEFAULTS = {"batch_size": 32, "partition": "iid", "seed": 0}   # `get`'s, where a factory has none


def register(name: str, factory: Callable[..., Task] | None = None, *, overwrite: bool = False):
    """Make `get(name, ...)` (and the CLI's --task NAME in this process) build tasks
    with `factory(**kwargs) -> Task`; kwargs as for `module:factory` names (see the
    module docstring). Returns the factory, so it also works as a decorator:
    `@register("my-task")`. A built-in name cannot be replaced; a registered one
    only with overwrite=True."""
    check_name(name)
    if ":" in name:
        raise ValueError(f"name = {name!r}: ':' is reserved for 'package.module:factory' names.")
    if factory is None:
        return lambda f: register(name, f, overwrite=overwrite)
    if not callable(factory):
        raise TypeError(f"factory = {factory!r} must be a callable returning a staleness.tasks.Task.")
    if name in _BUILDERS:
        raise ValueError(f"task {name!r} is built in; register yours under another name.")
    if name in _REGISTERED and not overwrite and _REGISTERED[name] is not factory:
        raise ValueError(f"task {name!r} is already registered; pass overwrite=True to replace it.")
    _REGISTERED[name] = factory
    return factory


def is_reference(name: Any) -> bool:
    """Whether `name` has the form 'package.module:factory'."""
    return isinstance(name, str) and ":" in name


def factory_of(name: str) -> Callable[..., Task]:
    """The factory behind a registered name or a 'package.module:factory' reference
    (importing the module); FactoryError (a ValueError) naming what is missing."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if not is_reference(name):
        raise ValueError(f"unknown task {name!r}; valid names are {', '.join(names())}, or a custom task as "
                         "'package.module:factory'.")
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr:
        raise FactoryError(f"task = {name!r} must have the form 'package.module:factory' (a module on the "
                           "Python path and a function in it that returns a Task).")
    module = specs.import_user_module(module_name, f"task = {name!r}", FactoryError, ".")
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FactoryError(f"task = {name!r}: module {module_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"task = {name!r}: {attr!r} in {module_name!r} is not callable (a factory "
                           "returning a Task is).")
    return obj


def _call_factory(name: str, factory: Callable[..., Task], common: dict, task_options: dict,
                  defaults: dict) -> Task:
    """Call `factory` with the `common` arguments it accepts (`defaults` for those not
    given, unless the factory has a default of its own) and `task_options`."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):   # builtins without a signature: give everything
        sig = None
    params = sig.parameters.values() if sig is not None else ()
    takes_all = sig is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {p.name: p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)}
    accepted = set(named)
    if not takes_all:
        unknown = sorted(set(task_options) - accepted)
        if unknown:
            raise TypeError(f"task {name!r} got unknown option(s) {unknown}; its options are "
                            f"{sorted(accepted - set(_COMMON)) or 'none'}.")
    given = {k: common[k] for k in _GIVEN if common.get(k) is not None}
    common = {k: v for k, v in common.items() if v is not None}   # a setting nobody gave is not passed
    for key, value in defaults.items():   # get's default only for a parameter the factory names without one
        if key not in common and key in named and named[key].default is inspect.Parameter.empty:
            common[key] = value
    kwargs = {k: v for k, v in {**common, **task_options}.items() if takes_all or k in accepted}
    if sig is not None:
        try:
            sig.bind(**kwargs)
        except TypeError as e:
            raise FactoryError(f"task = {name!r}: the factory cannot be called with the arguments staleness "
                               f"passes ({', '.join(sorted(kwargs)) or 'none'}): {e}; give its other "
                               "parameters defaults.") from None
    task = factory(**kwargs)
    from staleness.tasks import rl

    if not isinstance(task, (Task, rl.RLTask)):
        raise FactoryError(f"task = {name!r}: the factory returned {type(task).__name__}, not a "
                           "staleness.tasks.Task (build one with staleness.tasks.from_flax or from_functions) or an "
                           "RL task (staleness.tasks.rl.from_functions).")
    _check_honoured(name, task, {k: v for k, v in given.items() if k not in kwargs})
    # the options it was called with are recorded with the task (a replay calls it so again)
    have = dict(task.options or ())
    extra = {k: v for k, v in task_options.items() if k not in have and isinstance(v, (bool, int, float, str))}
    if extra:
        task = dataclasses.replace(task, options=tuple(sorted({**have, **extra}.items())))
    return task if task.name == name else dataclasses.replace(task, name=name)


_GIVEN = ("batch_size", "partition", "seed", "data_dir")   # settings a caller gives a factory by name


def _check_honoured(name: str, task: Task, dropped: dict) -> None:
    """A setting the caller gave that the factory does not take must already be the task's:
    otherwise it would be silently ignored (and recorded as if it had been used)."""
    for key, value in dropped.items():
        have = getattr(task, key, None)
        if key == "partition" and have is not None:
            same = _partitions.parse(str(value)).describe() == have
        else:
            same = have is not None and have == value
        if not same:
            raise FactoryError(f"task = {name!r}: its factory takes no {key}, so {key} = {value!r} cannot be "
                               f"honoured (the task has {have!r}); add a {key} parameter to the factory or leave "
                               "the setting out")


def _rl_task(name: str, batch_size, partition, num_workers: int, seed, options: dict):
    """A built-in RL task (`staleness.tasks.rl.get`): batch_size is its prompts per rollout;
    the objective and its parameters are options."""
    from staleness.tasks import rl

    if partition not in (None, "iid"):
        raise ValueError(f"partition = {partition!r}: RL task {name!r} has no data partition (every actor samples "
                         "the whole prompt set); leave it out")
    if batch_size is not None:
        options = {**options, "prompts_per_rollout": batch_size}
    return rl.get(name, num_workers=num_workers, seed=0 if seed is None else seed, **options)


def resolve(task: Any, num_workers: int, batch_size: int | None = None, data_dir: Any = None,
            partition: str | None = None) -> Task:
    """The Task a run trains: `task` itself (checked against the run's `num_workers`),
    or the task named `task` (built-in, registered or 'package.module:factory')
    built for `num_workers` workers with the given options (None: the default).
    What `staleness.engine.resolve_task` and the runtime call."""
    from staleness.tasks import rl

    if isinstance(task, rl.RLTask):
        if task.num_workers < num_workers:
            raise ValueError(f"RL task {task.name!r} is built for num_workers = {task.num_workers} actors but the "
                             f"schedule has {num_workers}; build it for num_workers={num_workers} (tasks.get)")
        return task
    if isinstance(task, str):
        given = (("batch_size", batch_size), ("data_dir", data_dir), ("partition", partition))
        return get(task, num_workers=num_workers, **{k: v for k, v in given if v is not None})
    if not isinstance(task, Task):
        raise ValueError(f"task = {task!r} must be a staleness.tasks.Task or a task name {names()} "
                         "(or 'package.module:factory')")
    if task.partition != "iid" and task.num_workers < num_workers:
        raise ValueError(f"task {task.name!r} is sharded for num_workers = {task.num_workers} but the schedule has "
                         f"{num_workers} workers; build it for num_workers={num_workers} (tasks.get, from_flax or "
                         "from_functions)")
    return task


def declared_optimizer(name: str):
    """The optimizer built-in or registered task `name` trains with by default (its
    factory's `optimizer` attribute; nothing is built, no data loaded), or None (sgd
    or unknown without building it)."""
    from staleness.tasks import rl

    builder = _BUILDERS.get(name) or _REGISTERED.get(name) or rl.builder(name)
    return getattr(builder, "optimizer", None) if builder is not None else None


def names() -> list[str]:
    """Names of the built-in tasks (the RL ones last), then the registered ones, for `get`."""
    from staleness.tasks import rl

    return list(_BUILDERS) + list(rl.NAMES) + [n for n in _REGISTERED if n not in _BUILDERS]


def options(name: str) -> dict[str, Any]:
    """Task-specific keyword options of task `name` and their defaults."""
    builder = _builder(name) if name in _BUILDERS else factory_of(name)
    return {p.name: p.default for p in inspect.signature(builder).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _COMMON}


def _builder(name: str) -> Callable[..., Task]:
    if name not in _BUILDERS:
        raise ValueError(f"unknown task {name!r}; valid names are {', '.join(names())}, or a custom task as "
                         "'package.module:factory'.")
    return _BUILDERS[name]


def get(name: str, batch_size: int | None = None, partition: str | None = None, num_workers: int = 8,
        data_dir: Any = None, seed: int | None = None, **task_options: Any) -> Task:
    """Build task `name`: built-in, registered, or 'package.module:factory'.

    batch_size, partition and seed left None take their defaults (32, "iid", 0), or a
    factory's own defaults where it declares them.

    Args:
      name: one of `names()`, or 'package.module:factory' (see the module docstring).
      batch_size, partition, num_workers: as `Task`'s (μ, `staleness.tasks.partitions`, λ).
      data_dir: directory with local data (CIFAR tasks only; default $STALENESS_CIFAR_DIR).
      seed: seed of generated data (quadratic, linreg) and of the shard permutation; fixed data
        (digits split, MNIST-1D generation) do not depend on it, nor do the initial params.
      **task_options: task-specific options; see `options(name)` (e.g. quadratic: dim,
        condition_number, noise_scale; mnist1d-*: num_samples; cifar*: augment, eval_chunk;
        conv models: conv_impl, see `models.Conv`).

    Returns:
      The `Task`.
    """
    from staleness.tasks import rl

    if name in rl.NAMES:
        return _rl_task(name, batch_size, partition, num_workers, seed, task_options)
    given = {k: v for k, v in (("batch_size", batch_size), ("partition", partition), ("seed", seed))
             if v is not None}
    check_common(given.get("batch_size", GET_DEFAULTS["batch_size"]), num_workers,
                 given.get("partition", GET_DEFAULTS["partition"]), given.get("seed", GET_DEFAULTS["seed"]))
    if name not in _BUILDERS:
        common = {"num_workers": num_workers, "data_dir": data_dir, **given}
        return _call_factory(name, factory_of(name), common, task_options, GET_DEFAULTS)
    batch_size, partition, seed = ({**GET_DEFAULTS, **given}[k] for k in ("batch_size", "partition", "seed"))
    builder = _builder(name)
    valid = options(name)
    unknown = sorted(set(task_options) - set(valid))
    if unknown:
        raise TypeError(f"task {name!r} got unknown option(s) {unknown}; its options are {sorted(valid) or 'none'}.")
    recorded = tuple(sorted((k, v) for k, v in task_options.items() if isinstance(v, (bool, int, float, str))))
    if name in _NEEDS_DATA_DIR:
        task_options["data_dir"] = data_dir
    task = builder(batch_size, num_workers, partition, seed, **task_options)
    return dataclasses.replace(task, options=recorded) if recorded else task
