"""`staleness pipeline`: layer-wise staleness in a pipeline of K stages (DSP, GPipe, DDG, backprop).

    staleness pipeline --schedule dsp --delays 1,1,0 --batches 500
    staleness pipeline --schedule gpipe --microbatches 4 --stages 4 --cluster 1,1,2,1
    staleness pipeline --schedule ddg --stages 4 --devices --out runs/ddg
    staleness pipeline --schedule dsp --launch-local 4 --out runs/dsp4   # one stage per local process
    staleness pipeline ... --coordinator host0:1234 --num-processes 4 --process-id I   # one per host

Trains a pipeline task simulated on one device (default), with stage k on device k (--devices) or in
process k (`staleness.pipeline.multiprocess`), prints the history and a summary, and with --out writes a
Result directory whose schedule.json has one row per stage backward (`Timeline.to_schedule`).
"""

from __future__ import annotations

import os
import sys
import time

from staleness.cli.common import UsageError, add_log, check_out, count, log_callbacks, natural, positive, print_table
from staleness.cli.config_flags import add_flags, check_values, flags_of
from staleness.pipeline.settings import RunArgs, check

__all__ = ["add"]

DEFAULT_TASK = "digits-resmlp"
DEFAULT_STAGES = 4
DEFAULT_BATCHES = 300
DEFAULT_LR = 0.005

# The run's settings, generated from `pipeline.settings.RunArgs` (checked there, once).
_SETTINGS = ["num_batches", "lr", "optimizer", "cluster", "backward_ratio", "recompute_cost", "seed", "eval_every"]


def add(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="train a pipeline of K stages with layer-wise staleness (DSP, GPipe, DDG)",
        description="Train a task split into K pipeline stages under a schedule: dsp (layer-wise staleness "
        "m_k = 2*sum_{i>=k} s_i), gpipe (micro-batches, synchronous), ddg (delayed gradients) or backprop. "
        "Simulated on one device with per-stage speeds from --cluster, or on K devices with --devices.")
    p.add_argument("--schedule", default="dsp",
                   help="dsp, gpipe, ddg or backprop (specs like dsp:1,1,0, gpipe:4, dsp:1,1,0+stash also work; "
                   "default dsp)")
    p.add_argument("--delays", default=None,
                   help="dsp link delays s_0,...,s_{K-1} in ticks, one per stage (the last is the link to the "
                   "loss); default 1,...,1,0")
    p.add_argument("--microbatches", type=count, default=None, help="gpipe micro-batches per batch (default 4)")
    p.add_argument("--stash", action="store_true", help="dsp with PipeDream-style weight stashing")
    p.add_argument("--task", default=DEFAULT_TASK,
                   help=f"pipeline task (default {DEFAULT_TASK}); digits-resmlp, mnist1d-resmlp, cifar10-resnet20")
    p.add_argument("--stages", type=count, default=None,
                   help=f"number of stages K (default: the number of --delays, else {DEFAULT_STAGES})")
    p.add_argument("--blocks", type=count, default=None,
                   help="residual blocks of the MLP tasks (default K); basic blocks per ResNet stage (default 3)")
    add_flags(p, flags_of(RunArgs, ["num_batches"], num_batches={
        "default": DEFAULT_BATCHES, "help": f"batches to train (default {DEFAULT_BATCHES})"}))
    p.add_argument("--batch-size", type=count, default=32, help="examples per batch (default 32)")
    add_flags(p, flags_of(RunArgs, ["lr", "optimizer", "cluster", "backward_ratio", "recompute_cost"], lr={
        "default": DEFAULT_LR, "help": f"base learning rate (default {DEFAULT_LR:g})"}))
    p.add_argument("--devices", action="store_true", help="run stage k on device k (shard_map + ppermute)")
    p.add_argument("--launch-local", type=count, default=None, metavar="K",
                   help="run the K stages in K local processes (jax.distributed on 127.0.0.1; CPU transfers via "
                   "gloo); a stage process that dies is reported and the others stopped")
    p.add_argument("--coordinator", default=None, help="host:port of process 0: run this process's stage of a job "
                   "with one stage per process (with --num-processes and --process-id)")
    p.add_argument("--num-processes", type=count, default=None, help="processes of the job (= stages)")
    p.add_argument("--process-id", type=natural, default=None, help="this process's id = its stage (0..K-1)")
    p.add_argument("--heartbeat-timeout", type=count, default=None,
                   help="seconds without a heartbeat after which a stage process counts as dead (default 10)")
    p.add_argument("--launch-timeout", type=positive, default=None,
                   help="--launch-local: seconds before every stage process is killed (default: no limit)")
    add_flags(p, flags_of(RunArgs, ["seed", "eval_every"]))
    p.add_argument("--data-dir", default=None, help="CIFAR-10 directory (cifar10-resnet20)")
    p.add_argument("--out", default=None, help="directory for the Result files (checked before anything runs)")
    p.add_argument("--overwrite", action="store_true", help="replace staleness output already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_log(p)
    p.set_defaults(func=_cmd)


def _num_stages(args) -> int:
    if args.stages is not None:
        return args.stages
    if args.delays:
        return len([d for d in args.delays.split(",") if d.strip()])
    if args.schedule.lower().startswith("dsp:"):
        return len([d for d in args.schedule.split(":", 1)[1].split("+")[0].split(",") if d.strip()])
    return DEFAULT_STAGES


def _want_cpu_devices(k: int) -> None:
    """On CPU, ask for K virtual devices before JAX starts (no effect once it has, or on accelerators)."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", max(k, 1))
    except RuntimeError:  # JAX already started (e.g. called in-process): use what there is
        pass


# options every stage process of --launch-local gets, as given (dest -> flag)
_FORWARDED = {"schedule": "--schedule", "delays": "--delays", "microbatches": "--microbatches", "task": "--task",
              "stages": "--stages", "blocks": "--blocks", "num_batches": "--batches", "batch_size": "--batch-size",
              "lr": "--lr", "optimizer": "--optimizer", "cluster": "--cluster", "backward_ratio": "--backward-ratio",
              "recompute_cost": "--recompute-cost", "seed": "--seed", "eval_every": "--eval-every",
              "data_dir": "--data-dir", "out": "--out"}
_FORWARDED_FLAGS = {"stash": "--stash", "overwrite": "--overwrite"}


def _launch(args, k: int) -> int:
    from staleness.pipeline import multiprocess as mp

    if args.devices or args.coordinator is not None:
        raise UsageError("--launch-local starts its own processes; drop --devices / --coordinator")
    if args.stages is not None and args.stages != args.launch_local:
        raise UsageError(f"--launch-local {args.launch_local} runs one stage per process but --stages is "
                         f"{args.stages}; give the same number (or only --launch-local)")
    if k != args.launch_local:
        raise UsageError(f"--launch-local {args.launch_local}: the schedule has {k} stages; give one process per stage")
    check_out(args)
    argv = ["--stages", str(k)]
    for dest, flag in _FORWARDED.items():
        v = getattr(args, dest)
        if v is not None and dest != "stages":
            argv += [flag, str(v)]
    argv += [flag for dest, flag in _FORWARDED_FLAGS.items() if getattr(args, dest)]
    for spec in args.log or []:   # process 0 logs every evaluation
        argv += ["--log", spec]
    argv.append("--no-progress")
    return mp.launch_local(k, argv, timeout=args.launch_timeout,
                           heartbeat_timeout=args.heartbeat_timeout or mp.DEFAULT_HEARTBEAT_S)


def _cmd(args) -> int:
    check_values(args, RunArgs, check, _SETTINGS, schedule=args.schedule)
    if args.launch_local is not None and args.stages is None and not args.delays:
        args.stages = args.launch_local
    k = _num_stages(args)
    if k < 1:
        raise UsageError(f"--stages = {k} must be >= 1")
    callbacks = log_callbacks(args)   # specs checked in every process; writers used by process 0 only
    if args.launch_local is not None:
        return _launch(args, k)
    job = (args.coordinator, args.num_processes, args.process_id)
    if any(v is not None for v in job):
        if any(v is None for v in job):
            raise UsageError("a stage process needs --coordinator, --num-processes and --process-id together")
        if args.devices:
            raise UsageError("--coordinator runs one stage per process; drop --devices")
        if args.num_processes != k:
            raise UsageError(f"--num-processes {args.num_processes} but the schedule has {k} stages; run one "
                             "process per stage")
        from staleness.pipeline import multiprocess as mp

        mp.connect(args.coordinator, args.num_processes, args.process_id,
                   heartbeat_timeout=args.heartbeat_timeout or mp.DEFAULT_HEARTBEAT_S)
    elif args.devices:
        _want_cpu_devices(k)
    import staleness.pipeline as pp
    from staleness.engine.result import DivergenceError
    from staleness.infra.tracking import CallbackError

    delays = args.delays
    if args.schedule.strip().lower() == "dsp" and delays is None:
        delays = ",".join(["1"] * (k - 1) + ["0"])
    sched = pp.parse(args.schedule, delays=delays, microbatches=args.microbatches, stash=args.stash)
    sched.resolve(k)  # delays of the wrong length: one clear line before any data is loaded
    staged = args.coordinator is not None
    out = check_out(args) if not staged or args.process_id == 0 else None
    ptask = pp.tasks.get(args.task, num_stages=k, batch_size=args.batch_size, blocks=args.blocks,
                         data_dir=args.data_dir, seed=args.seed)
    t0 = time.perf_counter()
    kw = dict(cluster=args.cluster, seed=args.seed, lr=args.lr, optimizer=args.optimizer, eval_every=args.eval_every,
              backward_ratio=args.backward_ratio, recompute_cost=args.recompute_cost)
    try:
        if staged:
            from staleness.pipeline import multiprocess as mp

            result = mp.train_distributed(ptask, sched, args.num_batches, **kw,
                                          log=lambda line: print(line, file=sys.stderr, flush=True),
                                          callbacks=callbacks if args.process_id == 0 else None)
        else:
            result = pp.train(ptask, sched, args.num_batches, devices=args.devices, progress=not args.no_progress,
                              callbacks=callbacks, **kw)
    except DivergenceError as e:
        result = e.result
        print(f"staleness: diverged: {e}", file=sys.stderr)
    except CallbackError as e:   # a --log writer failed: keep and write what was recorded
        result = e.result
        print(f"staleness: {e}", file=sys.stderr)
        if result is None:   # a stage process other than 0: process 0 reports and writes
            return 1
    if result is None:
        print(f"stage {args.process_id}: done", file=sys.stderr)
        return 0
    cfg = result.config
    where = (f"{k} processes (one stage each)" if staged else f"{k} devices" if args.devices
             else "1 device (simulated)")
    print(f"{sched.describe()} on {k} stages (lags m = {cfg['lags']}), {args.task}, {args.num_batches} batches of "
          f"{args.batch_size}, {where}: {time.perf_counter() - t0:.1f} s wall ({cfg['compile_s']:.1f} s compile)")
    print_table(result.history.to_dict("records"))
    s = result.schedule.summary()
    print_table([{
        "schedule": sched.describe(), "batches_per_sim_s": s["updates_per_s"], "sim_time_s": s["sim_time_s"],
        "ticks": cfg["ticks"], "ticks_per_wall_s": cfg["ticks_per_s"], "staleness_max": s["staleness_max"],
        "idle_fraction_mean": s["wait_fraction_mean"], "final_accuracy": result.final.get("accuracy", float("nan")),
        "status": result.status}])
    if out is not None:
        result.save(out, overwrite=args.overwrite)
        print(f"wrote {out}/")
    return 0 if result.status == "complete" else 1
