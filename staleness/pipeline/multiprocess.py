"""Pipelines across processes: stage k in process k, joined by `jax.distributed`.

    staleness pipeline --launch-local 4 --schedule dsp --batches 300          # 4 local processes
    staleness pipeline --coordinator host0:1234 --num-processes 4 --process-id I ...   # one per host

Every process runs the K-device engine (`staleness.pipeline.devices`) over one
global mesh of K devices, one per process (on CPU the cross-process
`ppermute`s go through gloo, `jax_cpu_collectives_implementation`): the same
SPMD program, the same per-stage code and the same tick tables as the
single-process device run, so the numbers are those of `run_devices` on K
local devices (bitwise on CPU in `tests/test_pipeline_multiprocess.py`).
After every evaluation chunk the loss and the stages' states are gathered to
every process (`process_allgather`); process 0 evaluates, keeps the history and
returns the `Result`. Liveness: `jax.distributed` drops a job whose process
stops sending heartbeats for `heartbeat_timeout` seconds; `launch_local`
reports the first stage process that dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

__all__ = ["DEFAULT_HEARTBEAT_S", "connect", "first_death", "launch_local", "train_distributed"]

DEFAULT_HEARTBEAT_S = 10


def _check_job(coordinator, num_processes, process_id, heartbeat_timeout) -> None:
    if not isinstance(coordinator, str) or ":" not in coordinator:
        raise ValueError(f"coordinator = {coordinator!r} must be 'host:port' (process 0's address)")
    for name, v, lo in (("num_processes", num_processes, 1), ("process_id", process_id, 0),
                        ("heartbeat_timeout", heartbeat_timeout, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} = {v!r} must be an integer >= {lo}")
    if process_id >= num_processes:
        raise ValueError(f"process_id = {process_id} must be < num_processes = {num_processes}")


def connect(coordinator: str, num_processes: int, process_id: int, *,
            heartbeat_timeout: int = DEFAULT_HEARTBEAT_S, init_timeout: int = 120) -> None:
    """Join the job with `jax.distributed` (CPU collectives through gloo). Call it before
    anything starts a JAX backend (building a task does), in every process of the job.

    heartbeat_timeout: seconds without a heartbeat after which the coordination
      service counts a process as dead and fails the job."""
    import jax

    _check_job(coordinator, num_processes, process_id, heartbeat_timeout)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout,
                               initialization_timeout=init_timeout)


def train_distributed(ptask, schedule, num_batches: int, *, log=None, callbacks=None, **settings):
    """This process's part of a pipeline run with one stage per process (after `connect`).

    Call it in each of the K = `ptask.num_stages` processes with the same arguments;
    stage k runs in process k (its one local device). settings: the fields of `training.RunArgs`
    (an unknown one is a TypeError). log: a callable taking one line of progress; callbacks:
    `staleness.infra.tracking` callbacks, called in process 0 at every evaluation as it is made
    (the other processes ignore theirs: give them None).

    Returns the `Result` in process 0 (history, simulated timeline, params,
    config with engine='processes'), None in the others. Raises `DivergenceError`
    (process 0: with `.result`) on a non-finite loss, in every process.
    """
    import jax

    from staleness.pipeline.training import RunArgs

    if jax.process_count() != ptask.num_stages:
        raise ValueError(f"this job has {jax.process_count()} processes but the pipeline has {ptask.num_stages} "
                         "stages; run one process per stage (connect first)")
    args = RunArgs(schedule, num_batches, **settings)
    from staleness.infra import tracking

    return _train(ptask, args, jax.process_index(), log or (lambda line: None), tracking.as_callbacks(callbacks))


def _train(ptask, args, process_id: int, log, callbacks: tuple = ()):
    """Process `process_id`'s part of running `args` (a `training.RunArgs`) on `ptask`."""
    import jax
    from jax.experimental import multihost_utils

    from staleness.engine import core
    from staleness.pipeline import stage as S
    from staleness.pipeline import training
    from staleness.pipeline.devices import DeviceEngine

    k = ptask.num_stages
    local = jax.local_devices()
    if len(jax.devices()) != k or len(local) != 1:
        raise ValueError(f"one device per process is needed: this job has {len(jax.devices())} devices, "
                         f"{len(local)} in this process; on CPU start every process with "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=1")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))   # stage k = process k
    if devices[process_id] != local[0]:
        raise ValueError(f"process {process_id}'s device {local[0]} is not the job's device {process_id}; "
                         "give process ids 0..K-1 to the K processes")
    setup = training.set_up(ptask, args)
    plan = setup.plan
    init_key, data_key = core.keys(args.seed)
    params = ptask.init_stage_params(init_key)
    engine = DeviceEngine(ptask, plan, setup.opt, params, S.Context(ptask, data_key), devices)
    carry = engine.init_carry()
    t0 = time.perf_counter()
    program = engine.compile_program(carry, plan.xs(0, setup.chunk))
    compile_s = time.perf_counter() - t0
    log(f"stage {process_id}: compiled in {compile_s:.1f} s; running {plan.num_ticks} ticks")

    # Both are collectives (every process enters them, once per chunk): the loss and the
    # stages' states live one stage per process.
    def step(carry, xs):
        carry, loss = program(carry, xs)
        return carry, np.asarray(multihost_utils.process_allgather(loss, tiled=True))[:, -1]   # the last stage's

    def gathered_params(carry):
        return engine.unpack_params(multihost_utils.process_allgather(carry.state, tiled=True))

    return training.drive(ptask, setup, params,
                          training.Engine(step, gathered_params, carry, [str(d) for d in devices], compile_s),
                          training.Host(engine_name="processes", wall_time=True, config={"processes": k},
                                        lead=process_id == 0, log=lambda line: log(f"stage {process_id}: {line}"),
                                        callbacks=callbacks))


def first_death(codes: list) -> int | None:
    """The stage to report among processes' exit codes (None: still running, 0: done,
    > 0: exited with a status, < 0: killed by a signal); None when none died. A stage
    killed by a signal is the cause when several are found dead at one poll: the others
    exit with a status when they lose their peer ("connection reset"), and a loaded
    machine can delay the poll past both."""
    dead = [i for i, c in enumerate(codes) if c is not None and c != 0]
    signalled = [i for i in dead if codes[i] < 0]
    return (signalled or dead or [None])[0]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {-code} ({name})"
    return f"exited with status {code}"


def launch_local(num_processes: int, stage_args: list[str], *, timeout: float | None = None,
                 heartbeat_timeout: int = DEFAULT_HEARTBEAT_S, python: str | None = None, env: dict | None = None,
                 out=None) -> int:
    """Run `staleness pipeline` with one stage per local process (127.0.0.1, a free port) and wait.

    Args:
      num_processes: K, the number of stages.
      stage_args: `staleness pipeline` arguments for every process (without --launch-local,
        --coordinator, --num-processes, --process-id).
      timeout: seconds before every process is killed (SIGKILL), None: no limit.
      heartbeat_timeout: passed to the processes (`train_distributed`).
      out: a stream for the launcher's lines (default sys.stderr).
    The first process that ends with a non-zero status or a signal is reported at
    once ("stage k (process PID) died: killed by signal 9 (SIGKILL)"); the others are
    given `heartbeat_timeout` seconds to fail on their own, then killed.
    Returns 0 when every stage finished, 1 when one died, 124 on the timeout.
    """
    from staleness.infra.procs import kill_groups
    from staleness.runtime.multiprocess import free_port

    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"--launch-local = {num_processes!r} must be an integer >= 1 (one process per stage)")
    stream = sys.stderr if out is None else out
    port = free_port()
    base = dict(os.environ if env is None else env)
    flags = [f for f in base.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    base["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    base.setdefault("JAX_PLATFORMS", "cpu")
    procs = []
    for i in range(num_processes):
        argv = [python or sys.executable, "-m", "staleness", "pipeline", *stage_args,
                "--coordinator", f"127.0.0.1:{port}", "--num-processes", str(num_processes), "--process-id", str(i),
                "--heartbeat-timeout", str(heartbeat_timeout)]
        procs.append(subprocess.Popen(argv, env=base, start_new_session=True))
        print(f"stage {i}: process {procs[-1].pid}", file=stream, flush=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            i = first_death(codes)
            if i is not None:
                print(f"staleness pipeline: stage {i} (process {procs[i].pid}) died: {_describe_exit(codes[i])}; "
                      f"stopping the other stages", file=stream, flush=True)
                kill_groups(procs, heartbeat_timeout)
                return 1
            if all(c == 0 for c in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                print(f"staleness pipeline: the stages did not finish within {timeout:g} s; killing them",
                      file=stream, flush=True)
                kill_groups(procs, 0)
                return 124
            time.sleep(0.1)
    except KeyboardInterrupt:
        kill_groups(procs, 0)
        return 130

