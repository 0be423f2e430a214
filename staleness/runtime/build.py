"""The second step of a run (`staleness.runtime`): a `RunSpec` -> a `Built`, everything the serve loop needs.

One builder per transport, one serve loop (`runtime.serve.Server`, made here only, by
`_serve_loop`): `server` (`sync='server'`, one process: the parameter server, its state
sharded over `server_devices` (`runtime.sharding`) when there are several and the
policy applies one gradient per update; workers dispatched from the serve loop's
thread, or a thread each behind a `LocalTransport` with a cluster's delays),
`collective` (`sync='collective'`: a `CollectiveLink`, one `pmean` step per round, in
one process or this process's part of a multi-process job) and `distributed`
(`sync='server'` across processes: `DistributedServerLink` on process 0, a
`DistributedWorkerLink` in every process). A resumed run reads its checkpoint first
(its identity is checked before anything compiles).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import jax
import numpy as np

from staleness.engine import core
from staleness.engine.payload import payload_bytes
from staleness.runtime import checkpoint
from staleness.runtime.dispatch import DispatchTransport
from staleness.runtime.numerics import Numerics, zeros_like
from staleness.runtime.result import evaluate_snapshots
from staleness.runtime.serve import Server
from staleness.runtime.sharding import ServerPlacement
from staleness.runtime.spec import RunSpec
from staleness.runtime.transport import LocalTransport, WorkerLink
from staleness.runtime.worker import worker_loop

__all__ = ["Built", "build", "server", "collective", "distributed", "resolve_server_devices", "worker_placement"]


@dataclasses.dataclass
class Built:
    """A run ready to serve.

    server: the serve loop (`runtime.serve.Server`), not started (resumed runs: with
      the checkpoint's state); None in a process of a multi-process job that hosts
      workers only.
    workers: [(worker, target, args)] of the worker threads to start once the
      server's clock runs (target(*args, delays) is the thread's body).
    config: the Result's config.
    evaluate: params -> metrics (history rows).
    worker_link: the worker threads' end of the transport (stopped at the end), or None.
    """

    server: Server | None
    workers: list
    config: dict
    evaluate: Callable
    worker_link: WorkerLink | None = None


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


def worker_placement(num_workers: int, num_processes: int, num_local_devices: int, process_id: int) -> dict:
    """{worker: local device index} of the workers that `process_id` hosts."""
    return {w: (w // num_processes) % num_local_devices
            for w in range(num_workers) if w % num_processes == process_id}


def build(spec: RunSpec, devs: list, server_device, *, server_devices=None, stop_event: threading.Event,
          progress=None) -> Built:
    """The run of `spec` on `devs` (this process's devices), by the builder of `spec.sync`."""
    if spec.sync == "collective":
        return collective(spec, devs, stop_event=stop_event, progress=progress)
    return server(spec, devs, server_device, server_devices=server_devices, stop_event=stop_event,
                  progress=progress)


# -- the serve loop, made once ---------------------------------------------------------------
def _serve_loop(spec: RunSpec, config: dict, link, update, params, opt_state, *, zeros=None, row_bytes,
                stop_event, progress, inner_at=None) -> Server:
    """The one place a `Server` is made: the run's serve loop with its checkpointer.
    inner_at: `Numerics.inner_at` where the workers keep inner states (a local-update method,
    workers in this process): the checkpoint keeps each worker's after its last recorded push."""
    evaluate = _evaluate(spec)
    on_checkpoint = None
    if spec.checkpoint is not None and spec.checkpoint_every is not None:
        def on_checkpoint(srv: Server) -> None:
            evaluate_snapshots(srv, evaluate, srv.rec.update_losses())
            state = srv.saved_state()
            if inner_at is not None:
                last: dict[int, int] = {}
                for w, it in zip(srv.rec.column("worker"), srv.rec.column("iteration")):
                    last[int(w)] = max(last.get(int(w), -1), int(it))
                state.inner = inner_at(last)
            checkpoint.save(spec.checkpoint, state, config)

    return Server(spec, link=link, update=update, params=params, opt_state=opt_state, zeros=zeros,
                  row_bytes=row_bytes, progress=progress, on_checkpoint=on_checkpoint, stop_event=stop_event)


def _evaluate(spec: RunSpec) -> Callable:
    return lambda p: core.evaluate(spec.task, p)


def _saved(spec: RunSpec, config: dict):
    """The checkpoint a resumed run continues from (identity checked), or None."""
    return checkpoint.load(spec.checkpoint, config, spec.num_updates) if spec.resume else None


# -- the builders ------------------------------------------------------------------------------
def server(spec: RunSpec, devs: list, server_device, *, server_devices=None, stop_event: threading.Event,
           progress=None) -> Built:
    """The parameter server in this process: workers on `devs`, its state on `server_devices`."""
    worker_devices = [devs[w % len(devs)] for w in range(spec.num_workers)]
    shards = resolve_server_devices(server_devices, devs, server_device, spec.slots)
    placement = ServerPlacement(shards) if len(shards) > 1 else None
    threads = spec.cluster is not None   # injected delays: a thread per worker sleeps them
    config = spec.config(devices=[str(d) for d in dict.fromkeys(worker_devices)], server_device=str(server_device),
                         server_devices=[str(d) for d in shards], processes=1,
                         transport="local" if threads else "dispatch")
    saved = _saved(spec, config)
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
    keeps = spec.local is not None and not spec.local.learner   # workers' inner states, kept in `numerics`
    srv = _serve_loop(spec, config, link, numerics.update, params, opt_state, zeros=zeros_like(params),
                      row_bytes=payload_bytes(spec.task, spec.policy), stop_event=stop_event, progress=progress,
                      inner_at=numerics.inner_at if keeps else None)
    if saved is not None:
        state = checkpoint.restore(saved, (params, opt_state), put, numerics.inner_template(params) if keeps else None)
        numerics.restore_inner(state.inner, dict(enumerate(worker_devices)))
        srv.restore(state)
    workers = [(w, worker_loop, (w, link, numerics, worker_devices[w])) for w in range(spec.num_workers)
               if threads]
    return Built(srv, workers, config, _evaluate(spec), link if threads else None)


def collective(spec: RunSpec, devs: list, *, stop_event: threading.Event, progress=None, coord=None,
               liveness_wait: float = 5.0) -> Built:
    """Collective rounds over `devs`; `coord` (a multi-process job's Coordination):
    `devs` are every process's devices and this process builds its part of the global
    mesh (compiling: every process takes part)."""
    from staleness.runtime.collective import (CollectiveLink, CollectiveMesh, Liveness, RoundStep, StopAgreement,
                                              mesh_devices)

    mesh = CollectiveMesh(spec.num_workers, mesh_devices(spec.num_workers, devs))
    across = mesh.across
    me = jax.process_index()
    names = [f"p{d.process_index}:{d}" if across else str(d) for d in mesh.devices]
    config = spec.config(devices=names, server_device="collective",
                         processes=len({d.process_index for d in mesh.devices}), transport="collective")
    saved = _saved(spec, config)
    init_key, data_key = core.keys(spec.seed)
    params = spec.task.init_params(init_key)
    step = RoundStep(spec.task, spec.opt.tx, spec.rule, mesh, data_key, spec.opt.init(params))
    # BSP: round i makes update i + 1; none after the last is needed (`runtime.collective`)
    link = CollectiveLink(step, worker_timeout=spec.worker_timeout, max_iteration=spec.num_updates,
                          pipelined=not across and spec.cluster is None, delays=spec.delays,
                          stop=StopAgreement(mesh, stop_event, spec.max_time if me == 0 else None) if across else None,
                          liveness=Liveness(coord, mesh.process_of, liveness_wait) if across else None)
    params = mesh.place(params)
    link.warm_up(params)
    params, opt_state = link.set_state(params, step.opt_state)
    # a round moves no parameters (each device holds a replica); each worker sends
    # its share of a ring all-reduce of the gradient: 2 (λ - 1) / λ of its bytes
    nbytes = payload_bytes(spec.task, spec.policy)[1]
    push = 2 * (spec.num_workers - 1) * nbytes // spec.num_workers
    here, stop_here = spec, stop_event
    if across:   # the link decides when to stop (`agreed_stop`); only process 0 checkpoints
        here = dataclasses.replace(spec, max_time=None, checkpoint_every=spec.checkpoint_every if me == 0 else None)
        stop_here = threading.Event()
    srv = _serve_loop(here, config, link, link.update, params, opt_state, row_bytes=(0, push),
                      stop_event=stop_here, progress=progress)
    if saved is not None:
        state = checkpoint.restore(saved, (params, opt_state), mesh.place)
        state.params, state.opt_state = link.set_state(state.params, state.opt_state)
        srv.restore(state)
    return Built(srv, [], config, _evaluate(spec))


def distributed(spec: RunSpec, coord, *, stop_event: threading.Event, progress=None) -> Built:
    """This process's part of a multi-process parameter-server job (`coord`: its
    Coordination): process 0 hosts the server, worker w runs in process w % N on that
    process's local device (w // N) % (local devices)."""
    from staleness.runtime.coordination import DistributedServerLink, DistributedWorkerLink

    pid, n = coord.process_id, coord.num_processes
    local = jax.local_devices()
    placement = {w: local[i] for w, i in worker_placement(spec.num_workers, n, len(local), pid).items()}
    worker_process = [w % n for w in range(spec.num_workers)]
    server_device = local[0]
    init_key, data_key = core.keys(spec.seed)
    params_shape = jax.eval_shape(spec.task.init_params, init_key)
    numerics = Numerics(spec.task, spec.opt, spec.rule, spec.slots, data_key, spec.local, spec.inner,
                        spec.local_steps)
    config = spec.config(devices=sorted({f"p{worker_process[w]}" for w in range(spec.num_workers)}),
                         server_device=f"p0:{server_device}", server_devices=[f"p0:{server_device}"], processes=n,
                         transport="coordination-service+jax.experimental.transfer")
    srv = None
    if pid == 0:
        saved = _saved(spec, config)
        params = jax.device_put(spec.task.init_params(init_key), server_device)
        numerics.place_inputs(server_device)
        opt_state = numerics.init_state(params)
        link = DistributedServerLink(coord, worker_process, server_device, numerics.push_shape(params_shape))
        srv = _serve_loop(spec, config, link,
                          numerics.update, params, opt_state, zeros=zeros_like(params),
                          row_bytes=payload_bytes(spec.task, spec.policy), stop_event=stop_event, progress=progress)
        if saved is not None:
            srv.restore(checkpoint.restore(saved, (params, opt_state),
                                           lambda tree: jax.device_put(tree, server_device)))
        warm = params
    else:
        warm = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), params_shape)
    numerics.warm_up(warm, list(placement.values()), server_device if pid == 0 else None)
    link = DistributedWorkerLink(coord, placement, params_shape) if placement else None
    workers = [(w, worker_loop, (w, link, numerics, placement[w])) for w in placement]
    return Built(srv, workers, config, _evaluate(spec), link)
