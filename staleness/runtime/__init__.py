"""Real execution: the same policies on real devices and hosts, recording traces.

    import staleness as st
    result = st.runtime.run("digits-mlp", "ssp:3", "1*4,2.6*4", num_updates=500, time_scale=0.01)
    result.schedule            # the recorded trace (a Schedule)
    st.engine.replay(result.schedule, "digits-mlp", slot_mode="map", ...)   # same params, bitwise on CPU

One process: `run`, with `sync='collective'` (BSP's default: each round one
jitted `pmean` step over the devices) or `sync='server'` (a parameter server
sharded over `server_devices`; its workers, one device each, are dispatched from
the serve loop's thread at the hardware's speed, `dispatch`, or run a thread
each to sleep a cluster's injected delays, `worker`).
Several processes or hosts: `run_process` in each process of a
`jax.distributed` job (the CLI's `staleness run --coordinator ...`), or
`launch_local` for N processes on this machine (parameter server).

A run flows one way: `spec` (arguments, checked) -> `build` (numerics, server
state, workers, transport: one builder per transport, `build.server`,
`build.collective`, `build.distributed`) -> `execute` (start, serve, stop) with
`serve` (the one serve loop: the driver step of `staleness.driver` with real
updates and faults) -> `result`. `run` is `local_run.run`. Parts they use:
`numerics` (the jitted functions), `sharding` (the server's layout),
`collective` (the pmean step and its transport), `dispatch` (workers
dispatched from the serve loop's thread), `worker` (worker loop, injected
delays), `transport` (the Transport interface and the in-process
transport), `coordination` (the multi-process transport: the coordination
service and `jax.experimental.transfer`), `checkpoint`, `progress`,
`multiprocess`.
"""

from staleness.runtime.errors import RunFailure, WorkerError, WorkerLostError

__all__ = ["run", "run_process", "launch_local", "replay_trace", "RunFailure", "WorkerError",
           "WorkerLostError", "ServerLink", "WorkerLink", "LocalTransport", "resolve_devices"]


def __getattr__(name):   # loaded on first use: the command line reads `runtime.spec` without JAX
    if name in ("run", "resolve_devices"):
        from staleness.runtime import local_run

        return getattr(local_run, name)
    if name in ("LocalTransport", "ServerLink", "WorkerLink"):
        from staleness.runtime import transport

        return getattr(transport, name)
    if name in ("run_process", "launch_local"):
        from staleness.runtime import multiprocess

        return getattr(multiprocess, name)
    if name == "replay_trace":
        from staleness.runtime.replay import replay_trace

        return replay_trace
    raise AttributeError(f"module 'staleness.runtime' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
