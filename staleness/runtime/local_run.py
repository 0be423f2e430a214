"""`run` (`staleness.runtime.run`): the same policies on the devices of one process, recording a trace.

Under `sync='server'` worker w computes on devices[w % len(devices)] and the serve
loop in the calling thread owns the parameters and optimizer state (sharded over
`server_devices`); without a cluster it dispatches every worker's step itself
(`runtime.dispatch`), with one a thread per worker sleeps its injected delays
(`runtime.worker`). Under `sync='collective'` each round is one jitted `pmean`
step over the devices (`runtime.collective`). The result is the simulator's `Result`.
"""

from __future__ import annotations

import dataclasses
import threading

import jax

from staleness.infra import settings as _infra_settings
from staleness.infra import tracking
from staleness.engine.result import DivergenceError, Result
from staleness.runtime.build import build
from staleness.runtime.execute import execute, make_progress
from staleness.runtime.spec import Settings, make_spec

__all__ = ["run", "resolve_devices"]


def resolve_devices(devices) -> list:
    """None: every local device; an int n: the first n local devices; or a list of devices."""
    local = jax.local_devices()
    if devices is None:
        return list(local)
    if isinstance(devices, int) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices = {devices} must be between 1 and the {len(local)} local devices")
        return list(local[:devices])
    try:
        out = list(devices)
    except TypeError:
        out = None
    if not out or not all(isinstance(d, jax.Device) for d in out):
        raise ValueError(f"devices = {devices!r} must be None, a number of local devices, or a list of jax devices")
    return out


def run(task, policy, cluster=None, *, settings: Settings | None = None, devices=None, server_device=None,
        server_devices=None, progress=False, stop_event: threading.Event | None = None, callbacks=None,
        **overrides) -> Result:
    """Train `task` with `policy` on real devices of this process; record the trace.

    Args:
      task: a `staleness.tasks.Task` or a built-in task name.
      policy: a `staleness.policies` policy or spec ('bsp', 'asp', 'ssp:3', 'dssp:3:12',
        'softsync:4', 'backup:1').
      cluster: None (workers run at the hardware's speed) or a `staleness.cluster`
        Cluster / spec: its compute times, network delays and failures are injected
        (compute: the iteration lasts max(real, compute_time · time_scale) seconds).
      settings: a `staleness.runtime.spec.Settings`, taken whole; its fields (num_updates,
        num_workers, seed, lr, lr_rule, optimizer, time_scale, max_time, checkpoint,
        checkpoint_every, resume, worker_timeout, on_worker_failure, ...: each described in
        its metadata, the help of its `staleness run` flag) may also be given by keyword,
        overriding it. Also:
      sync: 'collective' (each round one jitted pmean step over the devices; BSP only;
        a lost worker stops the run), 'server' (the parameter server; worker-level fault
        tolerance), or None (`spec.resolve_sync`). Recorded in the Result's config.
      eval_every / num_evals: history rows every this many updates (evaluated after
        the run from kept snapshots, so evaluation never stalls the server).
      devices: None (all local devices), a count, or a list; worker w runs on
        devices[w % len(devices)]. server_device: default devices[0].
      server_devices: sync='server': the devices the server's parameters and optimizer
        state are sharded over (None: all devices on accelerators for one-gradient
        policies, else server_device alone; an int: the first n devices; a list).
      progress: True for a live line on stderr, or a callable(dict).
      stop_event: a threading.Event; setting it stops the run (status 'stopped').
      callbacks: `staleness.infra.tracking` callbacks or specs ('tensorboard:DIR', 'wandb:PROJECT'),
        called with every history row when the run ends.

    Returns: a `Result` (status 'complete', or 'stopped' after Ctrl-C / stop_event).
    Raises: `WorkerError` (a worker raised; message names it), `WorkerLostError`,
    `DivergenceError`; each carries the Result recorded so far in `.result`.
    """
    devs = resolve_devices(devices)
    s = _infra_settings.merge(Settings, settings, overrides, "run", exclude=("processes",))
    if s.num_workers is None and cluster is None:
        s = dataclasses.replace(s, num_workers=len(devs))
    spec = make_spec(task, policy, cluster, settings=s)
    if server_device is None:
        server_device = devs[0]
    elif not isinstance(server_device, jax.Device):
        raise ValueError(f"server_device = {server_device!r} must be a jax device")
    callbacks = tracking.as_callbacks(callbacks)
    callback, close_progress = make_progress(progress, spec)
    stop_event = stop_event or threading.Event()
    built = build(spec, devs, server_device, server_devices=server_devices, stop_event=stop_event,
                  progress=callback)
    try:
        result = execute(built, spec, stop_event, close_progress)
    except DivergenceError as e:   # the evaluations up to the divergence are reported too
        tracking.report(callbacks, e.result)
        raise
    tracking.report(callbacks, result)
    return result
