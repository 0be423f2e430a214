"""Numerics of a Schedule in JAX: compiled replay, simulate, sweeps.

    result = staleness.engine.simulate(task, policy, cluster, num_updates=2000, seed=0)
    results = staleness.engine.sweep(task, [bsp(), asp()], cluster, seeds=range(4), num_updates=2000)

The names below and the submodules load on first use: the command line reads
`engine.settings` (its flags and their checks) without starting JAX.
"""

import importlib

__all__ = ["simulate", "sweep", "replay", "keys", "optimizer", "Optimizer", "OptimizerSpec", "Plan", "make_plan",
           "resolve_task", "scale_by_staleness", "server_update", "Settings"]

_NAMES = {"keys": ("core", "keys"), "Optimizer": ("tasks.optim", "Optimizer"),
          "OptimizerSpec": ("tasks.optim", "OptimizerSpec"), "optimizer": ("tasks.optim", "resolve"), "Plan": ("plan", "Plan"), "make_plan": ("plan", "make_plan"),
          "replay": ("run", "replay"), "resolve_task": ("run", "resolve_task"), "simulate": ("run", "simulate"),
          "sweep": ("run", "sweep"), "scale_by_staleness": ("update", "scale_by_staleness"),
          "server_update": ("update", "server_update"), "Settings": ("settings", "Settings")}

_MODULES = ("chunks", "core", "distributed", "grid", "local", "optim", "payload", "plan", "result", "rollout", "run",
            "runner", "settings", "sweeps", "update")


def _where(module: str) -> str:
    # the optimizers moved under the tasks (a task declares its own): `engine.optim` is that module
    return "tasks.optim" if module in ("optim", "tasks.optim") else f"engine.{module}"


def __getattr__(name):
    if name in _NAMES:
        module, attr = _NAMES[name]
        return getattr(importlib.import_module(f"staleness.{_where(module)}"), attr)
    if name in _MODULES:
        return importlib.import_module(f"staleness.{_where(name)}")
    raise AttributeError(f"module 'staleness.engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(__all__) | set(_MODULES))
