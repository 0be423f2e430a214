"""The second step of a run: a `RunSpec` -> everything the serve loop needs.

    spec = make_spec(...)                 # runtime.spec: arguments, checked
    built = build(spec, devices, ...)     # here: numerics, server state, workers, transport
    status = built.server.serve()         # runtime.serve: the one serve loop
    result = build_result(...)            # runtime.result

Two builders, one serve loop:

  - `sync='server'` (`_build_server`): the parameter server. Its parameters and
    optimizer state live on `server_devices`, sharded over them
    (`runtime.sharding`) when there are several and the policy applies one
    gradient per update; the update is `Numerics.update` (the engine's
    `server_update`, jitted). At the hardware's speed (no cluster) the serve
    loop's thread dispatches every worker's step (`runtime.dispatch`, no
    worker threads); with a cluster's injected delays a thread per worker runs
    `worker_loop` behind a `LocalTransport`.
  - `sync='collective'` (`_build_collective`): no worker threads; the
    transport and the update are a `CollectiveLink`, one `pmean` step per round.

A resumed run reads its checkpoint here, before anything is placed.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import jax

from staleness.engine import core
from staleness.runtime import checkpoint as _ckpt
from staleness.runtime.dispatch import DispatchTransport
from staleness.runtime.numerics import Numerics, zeros_like
from staleness.runtime.serve import Server
from staleness.engine.payload import payload_bytes
from staleness.runtime.sharding import ServerPlacement
from staleness.runtime.spec import RunSpec
from staleness.runtime.transport import LocalTransport
from staleness.runtime.worker import worker_loop

__all__ = ["Built", "build", "resolve_server_devices"]


@dataclasses.dataclass
class Built:
    """A run ready to serve.

    server: the serve loop (`runtime.serve.Server`), not started.
    state: the policy's SyncState to start from (a checkpoint's), or None.
    workers: [(worker, target, args)] of the worker threads to start once the
      server's clock runs (target(*args, delays) is the thread's body).
    config: the Result's config.
    evaluate: params -> metrics (history rows).
    """

    server: Server
    state: object
    workers: list
    config: dict
    evaluate: Callable


def resolve_server_devices(server_devices, devs, server_device, slots: int) -> list:
    """The devices the parameter server's state is sharded over.

    None: all of `devs` on accelerators when one gradient makes an update (ASP, SSP,
    DSSP: elementwise updates, bitwise the same sharded), else `server_device` alone;
    on CPU `server_device` alone (virtual CPU devices share the host's cores: a
    sharded update hands work to a thread per device and costs more than it saves).
    An int n: the first n of `devs`; a list: those devices."""
    if server_devices is None:
        if slots == 1 and devs[0].platform != "cpu" and len(devs) > 1:
            return list(devs)
        return [server_device]
    if isinstance(server_devices, int) and not isinstance(server_devices, bool):
        if not 1 <= server_devices <= len(devs):
            raise ValueError(f"server_devices = {server_devices} must be between 1 and the {len(devs)} devices")
        out = list(devs[:server_devices])
    else:
        try:
            out = list(server_devices)
        except TypeError:
            out = []
        if not out or not all(isinstance(d, jax.Device) for d in out):
            raise ValueError(f"server_devices = {server_devices!r} must be None, a number of devices or a list "
                             "of jax devices")
    if len(out) > 1 and slots != 1:
        raise ValueError(f"server_devices = {server_devices!r}: a sharded server applies one gradient per update "
                         f"(asp, ssp, dssp); this policy aggregates {slots} slots (use one server device)")
    return out


def build(spec: RunSpec, devs: list, server_device, *, server_devices=None, stop_event: threading.Event,
          progress=None) -> Built:
    """Build the run of `spec` on `devs` (this process's devices); see the module docstring."""
    if spec.sync == "collective":
        return _build_collective(spec, devs, stop_event=stop_event, progress=progress)
    return _build_server(spec, devs, server_device, server_devices=server_devices, stop_event=stop_event,
                         progress=progress)


def _evaluate(spec):
    return lambda p: core.evaluate(spec.task, p)


def _checkpointer(spec: RunSpec, config: dict, evaluate):
    if spec.checkpoint is None or spec.checkpoint_every is None:
        return None
    return lambda server: _ckpt.save(spec.checkpoint, server, config, evaluate)


def _server(spec, *, update, params, opt_state, zeros, link, config, evaluate, row_bytes, stop_event, progress):
    return Server(policy=spec.policy, num_workers=spec.num_workers, update=update, params=params,
                  opt_state=opt_state, zeros=zeros, link=link, num_updates=spec.num_updates,
                  max_time=spec.max_time, eval_every=spec.eval_every, worker_timeout=spec.worker_timeout,
                  on_worker_failure=spec.on_worker_failure, progress=progress,
                  on_checkpoint=_checkpointer(spec, config, evaluate), checkpoint_every=spec.checkpoint_every,
                  stop_event=stop_event, row_bytes=row_bytes)


def _build_server(spec, devs, server_device, *, server_devices, stop_event, progress) -> Built:
    worker_devices = [devs[w % len(devs)] for w in range(spec.num_workers)]
    shards = resolve_server_devices(server_devices, devs, server_device, spec.slots)
    placement = ServerPlacement(shards) if len(shards) > 1 else None
    threads = spec.cluster is not None   # injected delays: a thread per worker sleeps them
    config = spec.config(devices=[str(d) for d in dict.fromkeys(worker_devices)], server_device=str(server_device),
                         server_devices=[str(d) for d in shards], processes=1,
                         transport="local" if threads else "dispatch")
    meta = _ckpt.load(spec.checkpoint, config) if spec.resume else None
    put = placement.put if placement is not None else (lambda tree: jax.device_put(tree, server_device))

    init_key, data_key = core.keys(spec.seed)
    params = put(spec.task.init_params(init_key))
    numerics = Numerics(spec.task, spec.opt, spec.rule, spec.slots, data_key, spec.local, spec.inner,
                        spec.local_steps)
    numerics.place_inputs(placement.scalar if placement is not None else server_device)
    opt_state = put(numerics.init_state(params))
    numerics.warm_up(params, worker_devices, placement if placement is not None else server_device)
    pushed_to = placement.of(params) if placement is not None else server_device
    link = (LocalTransport(pushed_to, worker_devices) if threads
            else DispatchTransport(numerics, pushed_to, worker_devices))
    evaluate = _evaluate(spec)
    server = _server(spec, update=numerics.update, params=params, opt_state=opt_state, zeros=zeros_like(params),
                     link=link, config=config, evaluate=evaluate, row_bytes=payload_bytes(spec.task, spec.policy),
                     stop_event=stop_event, progress=progress)
    state = _ckpt.restore(server, meta, put) if meta is not None else None
    server.membership.extend(spec.membership(after=server.t_offset))
    workers = [(w, worker_loop, (w, link, numerics, worker_devices[w])) for w in range(spec.num_workers)
               if threads]
    return Built(server, state, workers, config, evaluate)


def _build_collective(spec, devs, *, stop_event, progress, coord=None, liveness_wait: float = 5.0) -> Built:
    """The collective builder; `coord` (a multi-process job's Coordination): `devs` are
    every process's devices and this process builds its part of the global mesh."""
    from staleness.runtime.collective import CollectiveLink, mesh_devices

    mesh = mesh_devices(spec.num_workers, devs)
    processes = len({d.process_index for d in mesh})
    across = processes > 1
    me = jax.process_index()
    names = [f"p{d.process_index}:{d}" if across else str(d) for d in mesh]
    config = spec.config(devices=names, server_device="collective", processes=processes, transport="collective")
    meta = _ckpt.load(spec.checkpoint, config) if spec.resume else None
    init_key, data_key = core.keys(spec.seed)
    params = spec.task.init_params(init_key)
    opt_state = spec.opt.init(params)
    link = CollectiveLink(spec.task, spec.opt.tx, spec.rule, spec.num_workers, mesh, data_key, opt_state,
                          worker_timeout=spec.worker_timeout, coord=coord, liveness_wait=liveness_wait)
    params = link.place(params)
    link.warm_up(params)
    params, opt_state = link.set_state(params, link.opt_state)
    evaluate = _evaluate(spec)
    # a round moves no parameters (each device holds a replica); each worker sends
    # its share of a ring all-reduce of the gradient: 2 (λ - 1) / λ of its bytes
    nbytes = payload_bytes(spec.task, spec.policy)[1]
    push = 2 * (spec.num_workers - 1) * nbytes // spec.num_workers
    here, stop_here = spec, stop_event
    if across:
        # every process stops after the same round: the one dispatched after a stop request
        # (any process's) or process 0's max_time carries the flag (`CollectiveLink`); only
        # process 0 checkpoints
        here = dataclasses.replace(spec, max_time=None, checkpoint_every=spec.checkpoint_every if me == 0 else None)
        stop_here = threading.Event()
    server = _server(here, update=link.update, params=params, opt_state=opt_state, zeros=None, link=link,
                     config=config, evaluate=evaluate, row_bytes=(0, push), stop_event=stop_here, progress=progress)
    if across:
        max_time = spec.max_time if me == 0 else None
        link.should_stop = lambda: ("stopped" if stop_event.is_set() else
                                    "complete" if max_time is not None and server.now() >= max_time else None)
    link.max_iteration = spec.num_updates   # BSP: round i makes update i + 1; none after the last is needed
    if spec.cluster is not None:   # injected delays: each round lasts as long as its slowest worker's
        link.delays = lambda: spec.delays(server.t0 - server.t_offset)
    # within one process and at the hardware's speed, the next round runs while the serve loop
    # handles this one (across processes every process must dispatch the same rounds)
    link.pipelined = not across and spec.cluster is None
    state = None
    if meta is not None:
        state = _ckpt.restore(server, meta, link.place)
        server.params, server.opt_state = link.set_state(server.params, server.opt_state)
    return Built(server, state, [], config, evaluate)
