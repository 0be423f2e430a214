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

import sys as _sys

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
    "metrics": ("staleness.results.metrics", None),
    "stats": ("staleness.results.stats", None),
    "explorer": ("staleness.results.explorer", None),
    "rollouts": ("staleness.results.rollouts", None),
    "rl": ("staleness.results.planner", None),   # st.rl.plan: the asynchronous-RL staleness planner
    "tracking": ("staleness.results.tracking", None),
    "specs": ("staleness.infra.specs", None),
    "files": ("staleness.infra.files", None),
    "checks": ("staleness.infra.checks", None),
    "simulate": ("staleness.engine", "simulate"),
    "sweep": ("staleness.engine", "sweep"),
    "Result": ("staleness.results", "Result"),
}


# Modules that moved into the layer folders, importable by their old names too (`from
# staleness.compare import Comparison`, `import staleness.plots`): the same module objects.
_MOVED = {
    "staleness.compare": "staleness.results.compare", "staleness.stats": "staleness.results.stats",
    "staleness.metrics": "staleness.results.metrics", "staleness.plots": "staleness.results.plots",
    "staleness.explorer": "staleness.results.explorer", "staleness.tracking": "staleness.results.tracking",
    "staleness.rollouts": "staleness.results.rollouts", "staleness.files": "staleness.infra.files",
    "staleness.specs": "staleness.infra.specs", "staleness.checks": "staleness.infra.checks",
    "staleness.checkpoint": "staleness.infra.checkpoint", "staleness.procs": "staleness.infra.procs",
    "staleness.interrupts": "staleness.infra.interrupts", "staleness.sim_pool": "staleness.sim.pool",
    "staleness.inflight": "staleness.sim.inflight",
}


class _MovedModules:
    """Import hook: an old module name gives the module it moved to (sys.meta_path)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname not in _MOVED:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, _MovedModules)

    @staticmethod
    def create_module(spec):
        import importlib

        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__   # its own, which the import machinery replaces next
        return module

    @staticmethod
    def exec_module(module):   # give the module its own spec back
        if module.__spec__.name != module.__name__:
            module.__spec__ = module.__spec__.loader_state


if not any(f is _MovedModules or getattr(f, "__name__", None) == "_MovedModules" for f in _sys.meta_path):
    _sys.meta_path.append(_MovedModules)


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
