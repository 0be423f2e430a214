"""`staleness run` (real devices; one process or one process of a multi-process
job), `staleness launch` (N local processes) and `staleness replay` (a trace
in the engine)."""

from __future__ import annotations

import functools
import math
import sys
import time

from staleness import policies
from staleness.infra import files
from staleness.cli.common import (UsageError, add_log, add_task_option, add_yes, build_task, check_out, check_pairing,
                                   check_processes, count, declared_optimizer, log_callbacks, nonnegative,
                                   print_table, task_options)
from staleness.cli.config_flags import Flag, add_flags, check_values, flag_argv, flags_of, values_of
from staleness.engine.settings import Settings as EngineSettings
from staleness.runtime.spec import Settings, check_settings

__all__ = ["add"]

COLLECTIVE_TOLERANCE = 1e-6   # replay --check of a collective run: float32 rounding of its all-reduce

# The options of `run`, shared with `launch`, which passes them on to every process it
# starts: the run's settings, generated from `runtime.spec.Settings` (their values are
# checked there, once), between the command line's own options.
_RUN_OPTIONS = [
    Flag("--task", "task", str, "digits-mlp", "built-in task (default digits-mlp) or package.module:factory "
         "(a function on the Python path returning a Task)"),
    Flag("--policy", "policy", str, "ssp:3", f"policy spec (default ssp:3): {policies.spec_help()}"),
    Flag("--cluster", "cluster", str, None, "cluster spec whose compute times, network delays and failures are "
         "injected, e.g. '1*4,2.6*4' (default: none; workers run at the hardware's speed)"),
    *flags_of(Settings),
    Flag("--devices", "devices", count, None, "use the first N local devices (default: all)"),
    Flag("--cpu-devices", "cpu_devices", count, None, "make N virtual CPU devices (per process) before JAX starts"),
    Flag("--server-devices", "server_devices", count, None, "--sync server: shard the server's parameters and "
         "optimizer state over the first N devices (default: all on accelerators for asp/ssp/dssp, one on CPU)"),
    Flag("--heartbeat-timeout", "heartbeat_timeout", count, None, "multi-process: heartbeat timeout in seconds "
         "(default: half of --worker-timeout, rounded up)"),
    Flag("--out", "out", str, None, "directory for the Result files (as `staleness simulate` writes them; "
         "checked before anything runs)"),
    Flag("--overwrite", "overwrite", "flag", False, "replace staleness output already in --out"),
    Flag("--no-progress", "no_progress", "flag", False, "no live progress line"),
]


# `replay`'s settings, generated from `engine.settings.Settings` (checked there, once); each
# defaults to the recorded run's.
_REPLAY = ["lr", "lr_rule", "optimizer", "batch_size", "seed"]
_RECORDED = {
    "lr": {"help": "learning rate (default: the recorded run's)"},
    "lr_rule": {"help": "lr rule: constant, per_gradient, per_update, delay_adaptive:N (default: the recorded run's)",
                "default": None},
    "optimizer": {"help": "server optimizer spec (default: the recorded run's; a run recorded with an optax object "
                          "is replayed from Python with it)"},
    "batch_size": {"help": "per-worker minibatch (default: the recorded run's)"},
    "seed": {"help": "seed of parameters and minibatches (default: the recorded run's)", "default": None}}


def _run_argv(args) -> list[str]:
    """The `staleness run` arguments that reproduce `args` (for `launch`)."""
    argv = flag_argv(args, _RUN_OPTIONS)
    for item in args.task_option or []:
        argv += ["--task-option", item]
    return argv


def add(sub) -> None:
    p = sub.add_parser("run", help="run a policy on real devices (and hosts) and record its trace",
                       description="Train a task with a synchronization policy on the devices of this process, "
                       "or as one process of a multi-process job (--coordinator, --num-processes, --process-id on "
                       "every host; process 0 hosts the server and writes the Result).")
    add_flags(p, _RUN_OPTIONS)
    add_task_option(p)
    add_log(p)
    p.add_argument("--coordinator", default=None, help="HOST:PORT of process 0 (multi-process runs)")
    p.add_argument("--num-processes", type=int, default=None, help="processes in the job")
    p.add_argument("--process-id", type=int, default=None, help="this process's index, 0..N-1")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("launch", help="start N local processes of `staleness run` (127.0.0.1, a free port)",
                       description="Start --local N processes of `staleness run` on this machine, joined through "
                       "jax.distributed on 127.0.0.1; process 0 writes the Result.")
    p.add_argument("--local", type=int, required=True, help="number of processes")
    add_yes(p)
    p.add_argument("--timeout", type=float, default=None, help="kill every process after this many seconds")
    add_flags(p, _RUN_OPTIONS)
    add_task_option(p)
    p.set_defaults(func=_cmd_launch)

    p = sub.add_parser("replay", help="replay a recorded trace (or a Result directory) in the engine",
                       description="Replay TRACE (a Result directory, or a schedule.json) in the engine with "
                       "slot_mode='map'; for a Result directory, compare the final parameters with the recorded "
                       "run's (bitwise on CPU).")
    p.add_argument("trace", help="Result directory or schedule JSON file")
    p.add_argument("--task", default=None, help="task name or package.module:factory (default: the Result's, "
                   "as it was given to the run; required for a bare trace)")
    add_flags(p, flags_of(EngineSettings, _REPLAY, **_RECORDED))
    p.add_argument("--overwrite", action="store_true", help="replace staleness output already in --out")
    p.add_argument("--tolerance", type=nonnegative, default=None,
                   help="largest accepted |difference| of final parameters (default 0, bitwise; "
                   f"{COLLECTIVE_TOLERANCE:g} for a run recorded under --sync collective, whose all-reduce sums "
                   "in another order)")
    p.add_argument("--check", action="store_true", help="exit 1 unless the replay matches the recorded parameters")
    p.add_argument("--out", default=None, help="directory for the replay's Result files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_replay)


# -- run -------------------------------------------------------------------------------------
def _set_cpu_devices(n) -> None:
    if n is None:   # else >= 1 (its flag's type is `count`)
        return
    import jax

    jax.config.update("jax_num_cpu_devices", int(n))


def _multiprocess(args) -> bool:
    given = [args.coordinator is not None, args.num_processes is not None, args.process_id is not None]
    if any(given) and not all(given):
        raise UsageError("multi-process runs need all of --coordinator, --num-processes and --process-id")
    return all(given)


def _settle_lr(args, policy) -> None:
    """As `simulate`'s: --lr, else the optimizer's own, else the CLI's default for a
    built-in task trained with plain sgd (the task itself is built later, in the
    runtime, after jax.distributed starts)."""
    from staleness.cli.simulate_cmd import DEFAULT_LR
    from staleness.tasks import registry

    plain = args.task in registry.names() and declared_optimizer(args.task) is None   # rl-digits: adam
    if policy.local:   # the outer optimizer is the method's; the workers' sgd gets the default
        if args.inner_optimizer is None and plain:
            args.inner_optimizer = f"sgd:lr={DEFAULT_LR:g}"
    elif args.lr is None and args.optimizer is None and plain:
        args.lr = DEFAULT_LR


def _check_sync(args, policy, processes: int) -> None:
    """--sync and its conflicts, as one line before JAX starts."""
    from staleness import cluster as _cluster
    from staleness.runtime.spec import resolve_sync

    cluster = _cluster.parse(args.cluster) if args.cluster is not None else None
    resolve_sync(args.sync, policy, cluster, args.on_worker_failure, processes, args.seed)


def _check_checkpoint(args) -> None:
    """--checkpoint, --checkpoint-every and --resume, before anything runs."""
    if args.checkpoint is None:
        if args.checkpoint_every:
            raise UsageError("--checkpoint-every needs --checkpoint DIR (where the checkpoints go)")
        if args.resume:
            raise UsageError("--resume needs --checkpoint DIR (the checkpoint to continue from)")
        return
    files.check_dir(args.checkpoint, what="--checkpoint")
    if not args.resume and not args.checkpoint_every:
        raise UsageError("--checkpoint alone writes nothing: give --checkpoint-every K (updates between "
                         "checkpoints), or --resume to continue from it")


def _task(args):
    """--task, or with --task-option a zero-argument callable that builds it with those
    options (called in the process, after jax.distributed starts) for --workers, else the
    cluster's workers."""
    if not task_options(args):
        return args.task
    from staleness import cluster as _cluster

    n = args.num_workers or (_cluster.parse(args.cluster).num_workers if args.cluster is not None else None)
    if n is None:
        raise UsageError("--task-option builds the task for a number of workers: give --workers or --cluster")
    return functools.partial(build_task, args, n)


def _check_run(args, processes: int):
    """What `run` and `launch` check alike, one line each before JAX starts; returns the policy."""
    from staleness import cluster as _cluster
    from staleness import policies as _policies
    from staleness.cli.simulate_cmd import check_specs

    policy = _policies.parse(args.policy)   # specs first
    check_pairing([policy], args.task)       # an RL policy needs an RL task, and the other way round
    if args.cluster is not None:
        _cluster.parse(args.cluster)
    check_values(args, Settings, check_settings)
    check_specs(args)
    _check_checkpoint(args)
    _check_sync(args, policy, processes)
    _settle_lr(args, policy)
    return policy


def _cmd_run(args) -> int:
    multi = _multiprocess(args)
    policy = _check_run(args, args.num_processes if multi else 1)
    callbacks = log_callbacks(args)
    if multi and callbacks:
        raise UsageError("--log applies to one-process runs")
    task = _task(args)
    out = check_out(args) if not multi or args.process_id == 0 else None  # only process 0 writes
    if multi:
        _set_cpu_devices(args.cpu_devices)  # before jax.distributed.initialize
    import staleness as st
    from staleness.engine.result import DivergenceError
    from staleness.runtime import RunFailure

    kwargs = dict(values_of(args, Settings), progress=not args.no_progress)
    t0 = time.perf_counter()
    code = 0
    try:
        if multi:
            if args.devices is not None:
                raise UsageError("--devices applies to one-process runs; use --cpu-devices per process")
            if args.server_devices is not None:
                raise UsageError("--server-devices applies to one-process runs (the multi-process server "
                                 "keeps its state on process 0's first device)")
            result = st.runtime.run_process(task, policy, args.cluster, coordinator=args.coordinator,
                                            num_processes=args.num_processes, process_id=args.process_id,
                                            heartbeat_timeout=args.heartbeat_timeout, **kwargs)
        else:
            _set_cpu_devices(args.cpu_devices)
            result = st.runtime.run(task() if isinstance(task, functools.partial) else task, policy, args.cluster,
                                    devices=args.devices, server_devices=args.server_devices, callbacks=callbacks,
                                    **kwargs)
    except (RunFailure, DivergenceError, st.tracking.CallbackError) as e:
        print(f"staleness: error: {str(e).splitlines()[0]}", file=sys.stderr)
        result, code = e.result, 1
    if result is None:
        return code
    where = f" ({args.num_processes} processes)" if multi else ""
    print(f"{result.schedule.policy} on {result.schedule.cluster or 'the hardware'}{where}, {args.task}, seed "
          f"{args.seed}: {result.schedule.num_updates} updates in {result.schedule.end_time:.2f} s "
          f"({time.perf_counter() - t0:.1f} s with compilation), status {result.status}")
    print_table(result.history.to_dict("records"))
    print_table([result.summary()])
    if out is not None:
        result.save(out, overwrite=args.overwrite)
        print(f"wrote {out}/")
    if code == 0 and result.status == "stopped":
        code = 130
    return code


def _cmd_launch(args) -> int:
    from staleness.runtime import launch_local

    if args.local < 1:
        raise UsageError(f"--local = {args.local} must be >= 1 (processes)")
    check_processes(args, args.local)
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout = {args.timeout} must be a number of seconds > 0")
    if args.devices is not None:
        raise UsageError("--devices applies to one-process runs; use --cpu-devices per process")
    from staleness.tasks import registry

    _check_run(args, args.local)
    if args.server_devices is not None:
        raise UsageError("--server-devices applies to one-process runs")
    _task(args)
    check_out(args)
    if args.task not in registry.names():   # a 'package.module:factory' must import: before any process starts
        registry.factory_of(args.task)
    return launch_local(args.local, _run_argv(args), timeout=args.timeout)


# -- replay ----------------------------------------------------------------------------------
def _cmd_replay(args) -> int:
    from staleness.cli.simulate_cmd import check_settings
    from staleness.runtime.replay import replay_trace

    check_settings(args, _REPLAY)
    out = check_out(args)
    t0 = time.perf_counter()
    rep, cmp = replay_trace(args.trace, args.task, lr=args.lr, lr_rule=args.lr_rule, optimizer=args.optimizer,
                            seed=args.seed, batch_size=args.batch_size, config={"replay_of": str(args.trace)},
                            progress=not args.no_progress)
    sched = rep.schedule
    pushed = "rollouts" if sched.policy.learner else "gradients"
    print(f"replayed {sched.num_updates} {'learner ' if sched.policy.learner else ''}updates of {sched.policy} "
          f"({sched.num_gradients} {pushed}) in {time.perf_counter() - t0:.1f} s")
    print_table(rep.history.to_dict("records"))
    code = 0
    if cmp is not None:
        tolerance = args.tolerance if args.tolerance is not None else (
            COLLECTIVE_TOLERANCE if rep.config.get("recorded_sync") == "collective" else 0.0)
        verdict = ("bitwise equal" if cmp.bitwise else "equal within the tolerance" if cmp.within(tolerance)
                   else "differ")
        print(f"final parameters vs the recorded run: {verdict} "
              f"(max |difference| {cmp.max_abs_diff:.3g}, tolerance {tolerance:g})")
        code = 0 if cmp.within(tolerance) else 1
    elif args.check:
        raise UsageError("--check needs a Result directory (a bare trace has no recorded parameters)")
    if out is not None:
        rep.save(out, overwrite=args.overwrite)
        print(f"wrote {out}/")
    return code if args.check else 0
