"""`run`: the same policies on the devices of one process, recording a trace.

A thread per worker, each bound to a device (workers share devices when there
are more workers than devices), runs the engine's jitted per-gradient
function; the server loop runs in the calling thread and owns parameters and
optimizer state; tensors move with `jax.device_put`. The result is the
simulator's `Result`: history at evaluation points (time = wall seconds since
the start), the recorded trace as its schedule, final parameters and config.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import jax

from staleness.engine import core
from staleness.results import DivergenceError, Result
from staleness.runtime import checkpoint as _ckpt
from staleness.runtime.errors import RunFailure
from staleness.runtime.numerics import Numerics, zeros_like
from staleness.runtime.progress import ProgressLine
from staleness.runtime.server import Diverged, Server
from staleness.runtime.spec import RunSpec, make_spec
from staleness.runtime.transport import LocalTransport
from staleness.runtime.worker import worker_loop

__all__ = ["run", "resolve_devices", "JOIN_SECONDS"]

JOIN_SECONDS = 10.0  # how long stopping waits for worker threads (a hung step cannot be interrupted)


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


@contextlib.contextmanager
def sigint_stops(stop_event: threading.Event):
    """While active (main thread only), the first Ctrl-C sets `stop_event` (the run
    stops cleanly at the next check); a second one raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop_event.is_set():
            raise KeyboardInterrupt
        stop_event.set()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def make_progress(progress):
    """(callback or None, closer): progress=True prints a live line on stderr."""
    if progress is True:
        line = ProgressLine()
        return line, line.close
    if progress in (False, None):
        return None, lambda: None
    if callable(progress):
        return progress, lambda: None
    raise ValueError(f"progress = {progress!r} must be True, False or a callable(dict)")


def build_result(server: Server, spec: RunSpec, config: dict, status: str) -> Result:
    """The Result of a (possibly interrupted) run from the server's records."""
    import pandas as pd

    end_time = server.end_time if server.end_time is not None else (server.now() if server.t0 is not None else 0.0)
    train_loss = server.rec.update_losses()
    rows = server.evaluate_snapshots(lambda p: core.evaluate(spec.task, p), train_loss, final=True)
    state = server.state
    sched = server.rec.to_schedule(
        num_workers=spec.num_workers, policy=spec.policy.describe(),
        cluster=spec.cluster.describe() if spec.cluster else "", seed=spec.seed,
        rstar=state.rstar if state is not None else (), end_time=end_time, pending=server.pending_rows(),
        meta={"max_gap": state.max_gap if state is not None else 0, "recorded": "runtime",
              "time_scale": spec.time_scale if spec.cluster else None,
              **({"local_steps": list(spec.local_steps)} if spec.local is not None else {})})
    return Result(pd.DataFrame(rows), sched, jax.device_get(server.params), config, train_loss, status)


def serve(server: Server, spec: RunSpec, config: dict, resume_state=None) -> Result:
    """Start and run `server`; turn its faults into errors that carry the Result."""
    try:
        status = server.serve()
    except Diverged as e:
        raise DivergenceError(str(e), build_result(server, spec, config, "diverged")) from None
    except RunFailure as e:
        e.result = build_result(server, spec, config, "stopped")
        raise
    return build_result(server, spec, config, status)


def run(task, policy, cluster=None, *, num_updates: int, num_workers: int | None = None, seed: int = 0,
        lr: float | None = None, lr_rule="constant", optimizer=None, batch_size: int | None = None, data_dir=None,
        devices=None, server_device=None, time_scale: float = 0.01, eval_every: int | None = None,
        num_evals: int = 20, max_time: float | None = None, checkpoint=None, checkpoint_every: int | None = None,
        resume: bool = False, worker_timeout: float = 30.0, on_worker_failure: str = "continue",
        progress=False, stop_event: threading.Event | None = None, inner_optimizer=None) -> Result:
    """Train `task` with `policy` on real devices of this process; record the trace.

    Args:
      task: a `staleness.tasks.Task` or a built-in task name.
      policy: a `staleness.policies` policy or spec ('bsp', 'asp', 'ssp:3', 'dssp:3:12',
        'softsync:4', 'backup:1').
      cluster: None (workers run at the hardware's speed) or a `staleness.cluster`
        Cluster / spec: its compute times, network delays and failures are injected
        (compute: the iteration lasts max(real, compute_time · time_scale) seconds).
      num_updates: stop after this many server updates.
      num_workers: λ (default: the cluster's, else one per device).
      seed: initial parameters and minibatches (`engine.core.keys(seed)`), and the
        cluster's random draws.
      lr, lr_rule, optimizer: as in `engine.replay`.
      devices: None (all local devices), a count, or a list; worker w runs on
        devices[w % len(devices)]. server_device: default devices[0].
      time_scale: real seconds per simulated second of the cluster model.
      eval_every / num_evals: history rows every this many updates (evaluated after
        the run from kept snapshots, so evaluation never stalls the server).
      max_time: optional wall-clock budget in seconds.
      checkpoint, checkpoint_every, resume: checkpoint directory; write every
        `checkpoint_every` updates; resume=True continues from the checkpoint there.
      worker_timeout: seconds after its release at which a worker without a gradient
        is declared lost.
      on_worker_failure: 'continue' (the policy's gates count live workers only) or
        'stop' (raise `WorkerLostError`).
      progress: True for a live line on stderr, or a callable(dict).
      stop_event: a threading.Event; setting it stops the run (status 'stopped').

    Returns: a `Result` (status 'complete', or 'stopped' after Ctrl-C / stop_event).
    Raises: `WorkerError` (a worker raised; message names it), `WorkerLostError`,
    `DivergenceError`; each carries the Result recorded so far in `.result`.
    """
    devs = resolve_devices(devices)
    if num_workers is None and cluster is None:
        num_workers = len(devs)
    spec = make_spec(task, policy, cluster, num_updates=num_updates, num_workers=num_workers, seed=seed, lr=lr,
                     lr_rule=lr_rule, optimizer=optimizer, batch_size=batch_size, data_dir=data_dir,
                     max_time=max_time, eval_every=eval_every, num_evals=num_evals, time_scale=time_scale,
                     worker_timeout=worker_timeout, on_worker_failure=on_worker_failure, checkpoint=checkpoint,
                     checkpoint_every=checkpoint_every, resume=resume, inner_optimizer=inner_optimizer)
    if server_device is None:
        server_device = devs[0]
    elif not isinstance(server_device, jax.Device):
        raise ValueError(f"server_device = {server_device!r} must be a jax device")
    worker_devices = [devs[w % len(devs)] for w in range(spec.num_workers)]
    callback, close_progress = make_progress(progress)
    config = spec.config(devices=[str(d) for d in dict.fromkeys(worker_devices)], server_device=str(server_device),
                         processes=1, transport="local")
    meta = _ckpt.load(spec.checkpoint, config) if spec.resume else None

    init_key, data_key = core.keys(spec.seed)
    params = jax.device_put(spec.task.init_params(init_key), server_device)
    numerics = Numerics(spec.task, spec.opt, spec.rule, spec.slots, data_key, spec.local, spec.inner,
                        spec.local_steps)
    opt_state = numerics.init_state(params)
    numerics.warm_up(params, worker_devices, server_device)
    link = LocalTransport(server_device, worker_devices)
    stop_event = stop_event or threading.Event()
    server = Server(policy=spec.policy, num_workers=spec.num_workers, numerics=numerics, params=params,
                    opt_state=opt_state, zeros=zeros_like(params), link=link, num_updates=spec.num_updates,
                    max_time=spec.max_time, eval_every=spec.eval_every, worker_timeout=spec.worker_timeout,
                    on_worker_failure=spec.on_worker_failure, progress=callback,
                    on_checkpoint=_checkpointer(spec, config), checkpoint_every=spec.checkpoint_every,
                    stop_event=stop_event)
    state = _ckpt.restore(server, meta, server_device) if meta is not None else None
    server.membership.extend(spec.membership(after=server.t_offset))
    threads = []
    try:
        with sigint_stops(stop_event):
            server.start(state)
            delays_t0 = server.t0 - server.t_offset
            for w in range(spec.num_workers):
                t = threading.Thread(target=worker_loop,
                                     args=(w, link, numerics, worker_devices[w], spec.delays(delays_t0)),
                                     name=f"staleness-worker-{w}", daemon=True)
                t.start()
                threads.append(t)
            return serve(server, spec, config)
    finally:
        link.stop()
        close_progress()
        deadline = time.monotonic() + JOIN_SECONDS
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _checkpointer(spec: RunSpec, config: dict):
    if spec.checkpoint is None or spec.checkpoint_every is None:
        return None

    def save(server: Server) -> None:
        _ckpt.save(spec.checkpoint, server, config, lambda p: core.evaluate(spec.task, p))

    return save
