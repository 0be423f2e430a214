"""staleness: stale-synchronous distributed training in JAX.

    import staleness as st
    policy = st.policies.ssp(staleness=3)
    cluster = st.cluster.heterogeneous([1.0, 1.0, 2.6, 2.6])
    sched = st.simulate_schedule(policy, cluster, num_updates=2000, seed=0)
    result = st.simulate(st.tasks.get("digits-mlp"), policy, cluster, num_updates=2000, seed=0)

The control plane (`policies`, `lr`, `cluster`, `sim`) imports no JAX; the
numeric modules are imported lazily on first use so that `staleness schedule`
starts fast.
"""

from staleness import cluster, lr, policies
from staleness.schedule import Schedule
from staleness.sim.scheduler import simulate_schedule

__version__ = "0.1.0"

__all__ = [
    "policies", "lr", "cluster", "tasks", "engine", "runtime", "results",
    "pipeline", "plots", "compare", "metrics", "specs", "files", "Schedule", "simulate_schedule", "simulate",
    "sweep", "Result", "rollouts", "tracking", "stats", "explorer", "checks", "sim", "rl",
]

_LAZY = {
    "tasks": ("staleness.tasks", None),
    "engine": ("staleness.engine", None),
    "runtime": ("staleness.runtime", None),
    "pipeline": ("staleness.pipeline", None),
    "results": ("staleness.results", None),
    "plots": ("staleness.results.plots", None),
    "compare": ("staleness.results.compare", None),
    "metrics": ("staleness.tasks.metrics", None),
    "stats": ("staleness.results.stats", None),
    "explorer": ("staleness.results.explorer", None),
    "rollouts": ("staleness.results.rollouts", None),
    "rl": ("staleness.results.planner", None),   # st.rl.plan: the asynchronous-RL staleness planner
    "tracking": ("staleness.infra.tracking", None),
    "specs": ("staleness.infra.specs", None),
    "files": ("staleness.infra.files", None),
    "checks": ("staleness.infra.checks", None),
    "simulate": ("staleness.engine", "simulate"),
    "sweep": ("staleness.engine", "sweep"),
    "Result": ("staleness.results", "Result"),
}


def __dir__():
    """The public names, the lazily loaded ones included."""
    return sorted([*__all__, "__version__"])


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'staleness' has no attribute {name!r}")
