"""Pipelines across processes: stage k in process k, joined by `jax.distributed`.

    staleness pipeline --launch-local 4 --schedule dsp --batches 300          # 4 local processes
    staleness pipeline --coordinator host0:1234 --num-processes 4 --process-id I ...   # one per host

Every process runs the K-device engine (`staleness.pipeline.devices`) over one
global mesh of K devices, one per process (on CPU the cross-process
`ppermute`s go through gloo, `jax_cpu_collectives_implementation`): the same
SPMD program, the same per-stage code and the same tick tables as the
single-process device run, so the numbers are those of `run_devices` on K
local devices (bitwise on CPU in `tests/test_pipeline_multiprocess.py`).
After every evaluation chunk the stages' states are gathered to every process
(`process_allgather`); process 0 evaluates the model, keeps the history and
returns the `Result`, the others return None.

Liveness: `jax.distributed`'s coordination service drops a job whose process
stops sending heartbeats for `heartbeat_timeout` seconds, and a peer blocked
in a transfer with a dead process fails; `launch_local` watches its processes
and reports the first stage process that dies (its signal or exit status) at
once, then stops the others.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np

__all__ = ["DEFAULT_HEARTBEAT_S", "connect", "launch_local", "train_distributed"]

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


def train_distributed(ptask, schedule, num_batches: int, *, cluster=None, seed: int = 0, lr: float | None = None,
                      optimizer="momentum:0.9", eval_every: int | None = None, num_evals: int = 10,
                      backward_ratio: float = 2.0, recompute_cost: float = 1.0, log=None):
    """This process's part of a pipeline run with one stage per process (after `connect`).

    Call it in each of the K = `ptask.num_stages` processes with the same arguments;
    stage k runs in process k (its one local device). Arguments as
    `staleness.pipeline.train`; log: a callable taking one line of progress.

    Returns the `Result` in process 0 (history, simulated timeline, params,
    config with engine='processes'), None in the others. Raises `DivergenceError`
    (process 0: with `.result`) on a non-finite loss, in every process.
    """
    import jax

    if jax.process_count() != ptask.num_stages:
        raise ValueError(f"this job has {jax.process_count()} processes but the pipeline has {ptask.num_stages} "
                         "stages; run one process per stage (connect first)")
    return _train(ptask, schedule, num_batches, process_id=jax.process_index(), cluster=cluster, seed=seed, lr=lr,
                  optimizer=optimizer, eval_every=eval_every, num_evals=num_evals, backward_ratio=backward_ratio,
                  recompute_cost=recompute_cost, log=log or (lambda line: None))


def _train(ptask, schedule, num_batches, *, process_id, cluster, seed, lr, optimizer, eval_every, num_evals,
           backward_ratio, recompute_cost, log):
    import jax
    import pandas as pd
    from jax.experimental import multihost_utils

    from staleness import cluster as _cluster
    from staleness.engine import core
    from staleness.engine import optim as _optim
    from staleness.engine.run import _check_lr
    from staleness.pipeline import stage as S
    from staleness.pipeline.devices import DeviceEngine
    from staleness.pipeline.model import join_params
    from staleness.pipeline.plan import IDLE, make_plan
    from staleness.pipeline.run import _check_positive_int, _losses_per_batch
    from staleness.pipeline.schedules import PipelineSchedule, parse
    from staleness.pipeline.timing import simulate_timing
    from staleness.results import DivergenceError, Result

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
    num_batches = _check_positive_int("num_batches", num_batches)
    lr = _check_lr(lr, allow_none=True)
    sched = parse(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(sched, PipelineSchedule):
        raise ValueError(f"schedule = {schedule!r} must be a PipelineSchedule or a spec like 'dsp:1,1,0'")
    sched = sched.resolve(k)
    plan = make_plan(sched, k, num_batches)
    cluster = _cluster.constant(k) if cluster is None else (_cluster.parse(cluster) if isinstance(cluster, str)
                                                            else cluster)
    timeline = simulate_timing(plan, cluster, seed, backward_ratio=backward_ratio, recompute_cost=recompute_cost)
    opt = _optim.resolve(optimizer, lr, num_batches, jax.eval_shape(ptask.init_stage_params, jax.random.key(0))
                         if lr is not None else None)
    if eval_every is None:
        eval_every = max(1, -(-num_batches // _check_positive_int("num_evals", num_evals)))
    eval_every = _check_positive_int("eval_every", eval_every)
    ticks_per_batch = (plan.microbatches + plan.lags[0]) if sched.flush else 1
    chunk = min(eval_every * ticks_per_batch, plan.num_ticks)

    init_key, data_key = core.keys(seed)
    params = ptask.init_stage_params(init_key)
    engine = DeviceEngine(ptask, plan, opt, params, S.Context(ptask, data_key), devices)
    carry = engine.init_carry()
    t0 = time.perf_counter()
    compiled = engine._run.lower(engine.ctx, carry, engine._put_xs(plan.xs(0, chunk))).compile()
    compile_s = time.perf_counter() - t0
    log(f"stage {process_id}: compiled in {compile_s:.1f} s; running {plan.num_ticks} ticks")

    def gathered_params(carry):
        host = multihost_utils.process_allgather(carry.state, tiled=True)   # collective: every process
        return tuple(engine.head_layouts[j].unpack({d: np.asarray(v[j]) for d, v in host.items()})[0]
                     for j in range(k))

    lead = process_id == 0
    evaluate = jax.jit(lambda task, p: task.evaluate(p)) if lead else None
    tick_end_time = timeline.tick_end()

    def metrics_of(per_stage):
        return jax.device_get(evaluate(ptask.task, join_params(per_stage))) if lead else {}

    def row(tick_end, wall, train_loss, metrics):
        sim_t = float(tick_end_time[tick_end - 1]) if tick_end > 0 else 0.0
        r = {"update": plan.batches_done(tick_end), "tick": tick_end, "time": wall, "sim_time": sim_t,
             "wall_time": wall, "train_loss": train_loss}
        r.update({name: float(v) for name, v in metrics.items()})
        return r

    cfg = dict(task=ptask.name, schedule=sched.describe(), stages=k, batches=num_batches,
               microbatches=plan.microbatches, batch_size=ptask.batch_size, lags=list(plan.lags),
               forward_delays=list(plan.forward_delays), backward_delays=list(plan.backward_delays),
               backward=sched.backward, lr=opt.lr, optimizer=opt.describe(), seed=seed, cluster=cluster.describe(),
               engine="processes", devices=[str(d) for d in devices], processes=k, ticks=plan.num_ticks,
               eval_every=eval_every, backward_ratio=backward_ratio, recompute_cost=recompute_cost,
               sim_throughput=timeline.throughput, policy=sched.describe(), workers=k, compile_s=compile_s,
               **{n: v for n, v in ptask.task.config().items() if n not in ("task", "batch_size")})
    rows = [row(0, 0.0, math.nan, metrics_of(params))]
    tick_loss = np.full(plan.num_ticks, np.nan)
    wall, last = 0.0, params
    for start in range(0, plan.num_ticks, chunk):
        t1 = time.perf_counter()
        carry, loss = compiled(engine.ctx, carry, engine._put_xs(plan.xs(start, chunk)))
        loss = np.asarray(multihost_utils.process_allgather(loss, tiled=True))[:, -1]   # the last stage's
        wall += time.perf_counter() - t1
        end = min(start + chunk, plan.num_ticks)
        tick_loss[start:end] = loss[: end - start]
        valid = plan.fwd[start:end, -1] != IDLE
        chunk_losses = tick_loss[start:end][valid]
        cur = gathered_params(carry)
        metrics = metrics_of(cur)
        log(f"stage {process_id}: ticks {end}/{plan.num_ticks}")
        if len(chunk_losses) and not np.all(np.isfinite(chunk_losses)):
            bad = start + int(np.flatnonzero(valid)[np.flatnonzero(~np.isfinite(chunk_losses))[0]])
            rows.append(row(end, wall, math.nan, metrics))
            result = (Result(pd.DataFrame(rows), timeline.to_schedule(), join_params(last), cfg,
                             _losses_per_batch(plan, tick_loss), "diverged") if lead else None)
            raise DivergenceError(f"non-finite loss at tick {bad} (batch {int(plan.fwd[bad, -1]) // plan.microbatches}"
                                  f" of {sched.describe()}, stage lags {list(plan.lags)}); try a smaller lr "
                                  f"(now {opt.lr:g})", result)
        rows.append(row(end, wall, float(np.mean(chunk_losses)) if len(chunk_losses) else math.nan, metrics))
        last = cur
    if not lead:
        return None
    ticks_run = -(-plan.num_ticks // chunk) * chunk
    cfg.update(wall_s=wall, ticks_per_s=ticks_run / wall if wall > 0 else math.nan)
    events = timeline.to_schedule()
    events.meta.update(engine="processes", wall_s=wall, ticks_per_s=cfg["ticks_per_s"],
                       time_axis="simulated (cluster model); history 'wall_time' is measured")
    return Result(pd.DataFrame(rows), events, join_params(last), cfg, _losses_per_batch(plan, tick_loss), "complete")


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
            dead = [i for i, c in enumerate(codes) if c is not None and c != 0]
            if dead:
                i = dead[0]
                print(f"staleness pipeline: stage {i} (process {procs[i].pid}) died: {_describe_exit(codes[i])}; "
                      f"stopping the other stages", file=stream, flush=True)
                _wait_then_kill(procs, heartbeat_timeout)
                return 1
            if all(c == 0 for c in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                print(f"staleness pipeline: the stages did not finish within {timeout:g} s; killing them",
                      file=stream, flush=True)
                _wait_then_kill(procs, 0)
                return 124
            time.sleep(0.1)
    except KeyboardInterrupt:
        _wait_then_kill(procs, 0)
        return 130


def _wait_then_kill(procs, grace: float) -> None:
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
