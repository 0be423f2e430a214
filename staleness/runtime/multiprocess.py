"""Several processes and hosts: `run_process` in each process of a
`jax.distributed` job, and `launch_local` to start N such processes here.

Every process is started with the same arguments (`staleness run --coordinator
HOST:PORT --num-processes N --process-id I ...`); process 0 hosts the server
and returns the Result, worker w runs in process w % N (`build.distributed`).
A worker process that dies loses its workers; started again with the same id,
it rejoins (`policy.join`). If process 0 dies the others raise
`ServerLostError`; process 0 cannot rejoin (restart the job, with --resume).

Every policy, BSP included, runs through the parameter-server transport
(`runtime.coordination`) by default: the server's jitted update is then the
only place gradients are summed, which keeps traces replayable bitwise (a
`pmean` sums in another order) and lets BSP survive a lost worker. With
sync='collective' (asked for) the job is one SPMD program over a global mesh
(`runtime.collective`); a process that dies stops the job, and none rejoins.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from staleness.infra.procs import kill_groups

__all__ = ["run_process", "launch_local", "free_port", "worker_placement"]

SHUTDOWN_SECONDS = 15.0   # how long process 0 waits for the others to leave at the end


def __getattr__(name):
    if name == "worker_placement":   # the builder's (imported when asked: launching needs no JAX)
        from staleness.runtime.build import worker_placement

        return worker_placement
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_job(coordinator, num_processes, process_id) -> None:
    if not isinstance(coordinator, str) or ":" not in coordinator:
        raise ValueError(f"coordinator = {coordinator!r} must be HOST:PORT, e.g. 10.0.0.1:8476")
    try:
        port = int(coordinator.rsplit(":", 1)[1])
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ValueError(f"coordinator = {coordinator!r}: the port must be an integer in 1..65535")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes = {num_processes!r} must be an integer >= 1")
    if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id = {process_id!r} must be an integer in 0..{num_processes - 1}")


def run_process(task, policy, cluster=None, *, coordinator: str, num_processes: int, process_id: int,
                num_updates: int, num_workers: int | None = None, heartbeat_timeout: int | None = None,
                init_timeout: float = 120.0, progress=False, **kwargs):
    """Run one process of a multi-process job (call before any other JAX operation).

    Args:
      task: a Task, a built-in task name, or a zero-argument callable that builds
        the Task (called after `jax.distributed` is initialized, since no JAX
        operation may run before that).
      coordinator: HOST:PORT of process 0's coordination service.
      num_processes, process_id: the job's size and this process's index.
      heartbeat_timeout: seconds without heartbeat after which a process counts as
        dead (default: half of worker_timeout, rounded up, at least 1); detection
        takes about this long plus a liveness round (~0.2-1 s).
      init_timeout: seconds to wait for every process to join and compile.
      Everything else as in `runtime.run`.

    Returns: the Result on process 0, None on the others. Process 0 raises like
    `runtime.run`; the others raise `ServerLostError` if they lose the server.
"""
    import math

    _check_job(coordinator, num_processes, process_id)
    worker_timeout = kwargs.get("worker_timeout", 30.0)
    if heartbeat_timeout is None:  # a dead process is then seen (by its heartbeat) before its deadline
        heartbeat_timeout = max(1, math.ceil(worker_timeout / 2)) if isinstance(worker_timeout, (int, float)) else 15
    if isinstance(heartbeat_timeout, bool) or not isinstance(heartbeat_timeout, int) or heartbeat_timeout < 1:
        raise ValueError(f"heartbeat_timeout = {heartbeat_timeout!r} must be an integer number of seconds >= 1")

    import jax

    from staleness.runtime import coordination

    if kwargs.get("sync") == "collective":   # CPU collectives across processes (before the backend starts)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    coord = coordination.initialize(coordinator, num_processes, process_id,
                                    heartbeat_timeout=heartbeat_timeout, init_timeout=int(init_timeout))
    done = False
    try:
        result = _run_process(coord, task, policy, cluster, num_updates=num_updates, num_workers=num_workers,
                              init_timeout=init_timeout, progress=progress, heartbeat_timeout=heartbeat_timeout,
                              **kwargs)
        done = True
        return result
    finally:
        # a collective job that failed: the others may wait in a round with process 0 that
        # only ends (with an error) once it has left, so it leaves at once
        if process_id == 0 and (done or kwargs.get("sync") != "collective"):
            coord.wait_others_left(SHUTDOWN_SECONDS)
        coord.shutdown()


def _run_process(coord, task, policy, cluster, *, num_updates, num_workers, init_timeout, progress,
                 heartbeat_timeout, **kwargs):
    import jax

    from staleness.runtime import build
    from staleness.runtime.execute import execute, make_progress
    from staleness.runtime.spec import make_spec

    pid, n = coord.process_id, coord.num_processes
    if callable(task) and not isinstance(task, str) and not hasattr(task, "loss_fn"):
        task = task()
    if num_workers is None and cluster is None:
        num_workers = n * len(jax.local_devices())
    spec = make_spec(task, policy, cluster, num_updates=num_updates, num_workers=num_workers, processes=n,
                     **kwargs)
    stop_event = threading.Event()
    if spec.sync == "collective":
        if coord.rejoining:
            raise RuntimeError(f"process {pid} cannot rejoin a job under sync='collective' (every round needs "
                               "every process): restart the whole job")
        callback, close_progress = make_progress(progress if pid == 0 else False, spec)
        built = build.collective(spec, jax.devices(), stop_event=stop_event, progress=callback, coord=coord,
                                 liveness_wait=heartbeat_timeout + 2.0)   # compiles: every process takes part
        return execute(built, spec, stop_event, close_progress, ready=lambda: _ready(coord, None, init_timeout),
                       main=None if pid == 0 else lambda built, spec: _serve_collective(built.server, pid))
    if coord.rejoining and pid == 0:
        raise RuntimeError("process 0 cannot rejoin a running job (the server's state died with it)")
    callback, close_progress = make_progress(progress if pid == 0 else False, spec)
    built = build.distributed(spec, coord, stop_event=stop_event, progress=callback)
    return execute(built, spec, stop_event, close_progress,
                   ready=lambda: _ready(coord, built.worker_link, init_timeout),
                   main=None if pid == 0 else lambda built, spec: _work(built.worker_link, stop_event, pid))


def _ready(coord, link, init_timeout: float) -> bool:
    """Enter the job: every process compiled and listening starts the clock together
    (a barrier); a restarted worker process (`link`: its workers' link, or None; a
    collective job's processes cannot rejoin) tells the running job it is back
    instead. False: nothing to do here (the run ended while this process started)."""
    if not coord.rejoining:
        coord.barrier("ready", init_timeout)
        return True
    if link is None or link.server_done():  # nothing to do here, or the run ended while we started
        return False
    coord.announce_join()
    return True


def _work(link, stop_event: threading.Event, pid: int) -> None:
    """Process `pid`, with workers only (their `link`, or None): work until the server
    stops us (or is lost, or Ctrl-C)."""
    from staleness.runtime.errors import ServerLostError

    if link is None:  # more processes than workers: nothing to do here
        return None
    while not link.stopped.wait(0.1):
        if stop_event.is_set():
            break
    if link.server_lost:
        raise ServerLostError(pid, link.server_lost)
    return None


def _serve_collective(server, pid: int) -> None:
    """Process `pid` (not 0) of a collective job: serve every round with process 0
    (which writes the Result); a lost process-0 worker is the lost server."""
    from staleness.runtime.errors import ServerLostError, WorkerLostError

    try:
        server.serve()
    except WorkerLostError as e:
        if server.link.process_of[e.worker] == 0:
            raise ServerLostError(pid, e.reason) from None
        raise
    return None


# -- launching processes on this machine ---------------------------------------------------
def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


INTERRUPT_GRACE = 10.0   # seconds the other processes get to end after an interrupted process 0


def launch_local(num_processes: int, run_args: list[str], *, devices_per_process: int | None = None,
                 timeout: float | None = None, python: str | None = None, env: dict | None = None) -> int:
    """Start `num_processes` processes of `staleness run` on 127.0.0.1 and wait for them.

    Args:
      run_args: arguments of `staleness run` (without --coordinator/--num-processes/--process-id).
      devices_per_process: virtual CPU devices per process (XLA_FLAGS); default: keep the environment's.
      timeout: seconds before every process is killed (SIGKILL: a hung JAX process
        ignores SIGTERM); None waits forever.
    Ctrl-C is forwarded to process 0 only, which stops the others and writes its
    Result; the others still running INTERRUPT_GRACE seconds after process 0 ended (a
    process still starting up waits for a coordination service that is gone) are
    killed, and a second Ctrl-C kills them all.
    Returns: process 0's exit status (128 + N for signal N), which is the job's: with
    on_worker_failure='continue' a run that lost a worker process completes. Every other
    process that did not exit 0 is named on stderr, one line each.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"--local = {num_processes!r} must be an integer >= 1 (processes)")
    port = free_port()
    base_env = dict(os.environ if env is None else env)
    if devices_per_process is not None:
        flags = [f for f in base_env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
        base_env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices_per_process}"])
    procs = []
    for i in range(num_processes):
        argv = [python or sys.executable, "-m", "staleness", "run", "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", str(num_processes), "--process-id", str(i), *run_args]
        procs.append(subprocess.Popen(argv, env=base_env, start_new_session=True))
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = 0
    interrupted_end = None   # after a forwarded Ctrl-C: when the others are killed
    try:
        while any(p.poll() is None for p in procs):
            try:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
                time.sleep(0.1)
                if interrupted and procs[0].poll() is not None and interrupted_end is None:
                    interrupted_end = time.monotonic() + INTERRUPT_GRACE
                if interrupted_end is not None and time.monotonic() > interrupted_end:
                    kill_groups(procs)
                    print(f"staleness: killed the processes still running {INTERRUPT_GRACE:g} s after process 0 "
                          "stopped", file=sys.stderr)
                    return _status(procs[0].returncode)
            except KeyboardInterrupt:
                interrupted += 1
                if interrupted == 1 and procs[0].poll() is None:
                    procs[0].send_signal(signal.SIGINT)
                else:
                    raise
    except (KeyboardInterrupt, TimeoutError):
        kill_groups(procs)
        return 124 if interrupted == 0 else 130
    codes = [_status(p.returncode) for p in procs]
    for i, c in enumerate(codes[1:], 1):
        if c != 0:
            how = f"signal {c - 128}" if c > 128 else f"status {c}"
            print(f"staleness: process {i} exited with {how}", file=sys.stderr)
    return codes[0]


def _status(returncode: int) -> int:
    """A shell's exit status of a child: 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode
