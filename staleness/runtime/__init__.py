"""Real execution: the same policies on real devices and hosts, recording traces.

    import staleness as st
    result = st.runtime.run("digits-mlp", "ssp:3", "1*4,2.6*4", num_updates=500, time_scale=0.01)
    result.schedule            # the recorded trace (a Schedule)
    st.engine.replay(result.schedule, "digits-mlp", slot_mode="map", ...)   # same params, bitwise on CPU

One process: `run` (`local_run`), with `sync='collective'` (BSP's default: each
round one jitted `pmean` step over the devices) or `sync='server'` (a parameter
server). Several processes or hosts: `run_process` in each process of a
`jax.distributed` job, or `launch_local` for N processes on this machine
(`multiprocess`).

A run flows one way: `spec` (arguments, checked) -> `build` (one builder per
transport) -> `execute` (start, `serve`, stop) -> `result`. Parts they use:
`numerics`, `sharding`, `collective`, `dispatch`, `worker`, `transport`,
`coordination`, `checkpoint`, `progress`.
"""

import importlib

from staleness.runtime.errors import RunFailure, WorkerError, WorkerLostError

__all__ = ["run", "run_process", "launch_local", "replay_trace", "RunFailure", "WorkerError",
           "WorkerLostError", "ServerLink", "WorkerLink", "LocalTransport", "resolve_devices"]

# loaded on first use: the command line reads `runtime.spec` without JAX
_NAMES = {"run": "local_run", "resolve_devices": "local_run", "LocalTransport": "transport", "ServerLink": "transport",
          "WorkerLink": "transport", "run_process": "multiprocess", "launch_local": "multiprocess",
          "replay_trace": "replay"}


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(f"staleness.runtime.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'staleness.runtime' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
