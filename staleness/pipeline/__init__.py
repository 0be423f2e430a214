"""Layer-wise staleness in pipelines: DSP, with GPipe, DDG and backprop baselines.

A model is split into K stages (`model.split`, or a built-in task from
`staleness.pipeline.tasks`); a schedule (`gpipe`, `dsp`, `ddg`, `backprop`)
becomes tick tables (`make_plan`) that one per-stage algorithm
(`staleness.pipeline.stage`) runs either on one device (`simulate`) or on K
devices (`run_devices`), with simulated time from the cluster models
(`simulate_timing`):

    import staleness.pipeline as pp
    ptask  = pp.tasks.get("digits-resmlp", num_stages=3, batch_size=32)
    result = pp.simulate(ptask, pp.dsp((1, 1, 0)), num_batches=500, lr=0.005)   # 0.91 test accuracy
    result = pp.run_devices(ptask, pp.gpipe(4), num_batches=500)      # needs 3 devices
    tl     = pp.simulate_timing(pp.make_plan(pp.dsp((1, 1, 0)), 3, 500), st.cluster.heterogeneous([1, 2, 1]))
    tl.throughput                                                    # batches per simulated second

Each module's docstring says what it holds; `multiprocess` runs one stage per process, `sweep` a grid of
lr × seed runs in one program.
"""

import importlib

__all__ = [
    "IDLE", "PipelineSchedule", "Staged", "TickPlan", "Timeline", "backprop", "ddg", "dsp", "gpipe",
    "join_params", "make_plan", "model", "multiprocess", "parse", "run_devices", "simulate", "simulate_timing",
    "split", "stage_params", "sweep", "tasks", "train",
]

# The names load on first use: the command line reads `pipeline.settings` (its flags and
# their checks) without starting JAX.
_NAMES = {"Staged": "model", "join_params": "model", "split": "model", "stage_params": "model", "IDLE": "plan",
          "TickPlan": "plan", "make_plan": "plan", "run_devices": "run", "simulate": "run", "train": "run",
          "PipelineSchedule": "schedules", "backprop": "schedules", "ddg": "schedules", "dsp": "schedules",
          "gpipe": "schedules", "parse": "schedules", "Timeline": "timing", "simulate_timing": "timing"}

_MODULES = ("devices", "model", "multiprocess", "packing", "plan", "run", "schedules", "settings", "sim", "stage",
            "sweep", "tasks", "timing", "training")


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(f"staleness.pipeline.{_NAMES[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"staleness.pipeline.{name}")
    # `Plan`, this package's name for `TickPlan` until the engine's `Plan` (a schedule's
    # per-update gradient slots) took it: one name per meaning.
    if name == "Plan":
        import warnings

        warnings.warn("staleness.pipeline.Plan is now staleness.pipeline.TickPlan (staleness.engine.Plan is the "
                      "replay's plan of a schedule)", DeprecationWarning, stacklevel=2)
        return __getattr__("TickPlan")
    raise AttributeError(f"module 'staleness.pipeline' has no attribute {name!r}")


def __dir__():
    return sorted(set(__all__) | set(_MODULES))
