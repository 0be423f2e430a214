"""Numerics of a Schedule in JAX: compiled replay, simulate, sweeps.

    result = staleness.engine.simulate(task, policy, cluster, num_updates=2000, seed=0)
    results = staleness.engine.sweep(task, [bsp(), asp()], cluster, seeds=range(4), num_updates=2000)
"""

from staleness.engine.core import keys
from staleness.engine.optim import Optimizer, OptimizerSpec
from staleness.engine.optim import resolve as optimizer
from staleness.engine.plan import Plan, make_plan
from staleness.engine.run import replay, resolve_task, simulate, sweep
from staleness.engine.update import scale_by_staleness, server_update

__all__ = ["simulate", "sweep", "replay", "keys", "optimizer", "Optimizer", "OptimizerSpec", "Plan", "make_plan",
           "resolve_task", "scale_by_staleness", "server_update"]
