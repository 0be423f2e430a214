"""`staleness sweep`: a grid of configurations in one compiled replay, on local devices or processes.

    staleness sweep --policy asp --policy ssp:3 --seeds 0,1,2,3 --lr-rules constant,per_gradient \\
        --lrs 0.03,0.1 --updates 2000 --out runs/grid
    staleness sweep --policy diloco:10 --local-steps 5,10,20 --inner-optimizer adamw:lr=1e-3 --out runs/h
    staleness sweep ... --cpu-devices 4 --devices 4          # the configurations sharded over 4 devices
    staleness sweep ... --launch-local 2                      # 2 local processes (jax.distributed)
    staleness sweep ... --coordinator HOST:PORT --num-processes N --process-id I   # on every host

The grid, the sharding and what --out receives: README, "staleness sweep".
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

from staleness import policies
from staleness.cli.common import (is_rl_task, UsageError, add_log, add_task_option, add_yes, build_task, check_out,
                                   check_pairing, check_scale, count, declared_optimizer, log_callbacks, natural,
                                   positive, print_table, rl_estimate, rl_task_name, task_options)
from staleness.cli.config_flags import add_flags, check_values, flags_of
from staleness.cli.simulate_cmd import DEFAULT_RL_UPDATES, check_settings, check_target
from staleness.engine.settings import Settings, SweepSettings
from staleness.infra.procs import kill_groups

__all__ = ["add"]

DEFAULT_POLICIES = ("asp", "ssp:3")
DEFAULT_RL_POLICIES = ("rl_sync", "rl_async:2")   # on an RL task (rl-bandit, rl-digits)
DEFAULT_UPDATES = 1000
DEFAULT_LAUNCH_TIMEOUT = 3600.0   # seconds before --launch-local kills its processes

# The run's settings a sweep offers (its seeds, lr rules and rates are lists: its own flags),
# generated from `engine.settings.Settings` and checked there, once.
_SETTINGS = ["num_updates", "max_time", "optimizer", "inner_optimizer", "batch_size", "eval_every"]
_HELP = {"num_updates": {"help": f"server updates per run (default {DEFAULT_UPDATES}; {DEFAULT_RL_UPDATES} learner "
                                 "updates on an RL task)"},
         "max_time": {"help": "simulated seconds per run (instead of --updates)"},
         "optimizer": {"help": "server (outer) optimizer spec (default: the policy's, else the task's, else sgd)"},
         "inner_optimizer": {"help": "local-update methods: the workers' optimizer spec"}}


def add(sub) -> None:
    p = sub.add_parser("sweep", help="replay a grid of policies x seeds x lr rules x lrs in one compiled call",
                       description="Replay every configuration of a grid (policies x seeds x lr rules x learning "
                       "rates) in one compiled program per evaluation chunk, each bitwise its simulate; shard it over local devices "
                       "(--devices) or processes (--launch-local, --coordinator); write one table row per "
                       "configuration plus every Result.")
    p.add_argument("--policy", action="append", default=None,
                   help=f"policy spec (repeatable; default {' '.join(DEFAULT_POLICIES)}, and "
                   f"{' '.join(DEFAULT_RL_POLICIES)} on an RL task): {policies.spec_help()}")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--lr-rules", default="constant",
                   help="comma-separated lr rules: constant, per_gradient, per_update, delay_adaptive:N")
    p.add_argument("--lrs", default=None, help="comma-separated learning rates (default: the optimizer's, else "
                   "0.1 for a spec that names none)")
    p.add_argument("--local-steps", default=None,
                   help="comma-separated inner steps H: every local-update policy is swept over them "
                   "(streaming_diloco: one sweep per H)")
    p.add_argument("--task", default="digits-mlp", help="task name or package.module:factory (default digits-mlp)")
    p.add_argument("--cluster", default=None, help="cluster spec (default: 4 workers at 1.0 s + 4 at 2.6 s, "
                   "10%% jitter)")
    add_flags(p, flags_of(Settings, ["num_updates", "max_time"], **_HELP))
    add_yes(p)
    add_log(p)
    add_flags(p, flags_of(Settings, ["optimizer", "inner_optimizer", "batch_size"], **_HELP))
    add_task_option(p)
    p.add_argument("--partition", default=None, help="iid (the default, or the task factory's own), shard, "
                   "dirichlet:ALPHA or sizes:F1,...,Fn")
    p.add_argument("--data-dir", default=None, help="local data directory (CIFAR tasks)")
    add_flags(p, flags_of(Settings, ["eval_every"]))
    add_flags(p, flags_of(SweepSettings, ["ring", "slots"]))
    p.add_argument("--devices", type=count, default=None, help="shard the configurations over this process's "
                   "first N local devices")
    p.add_argument("--block", type=count, default=None, help="configurations per device per compiled call "
                   "(default min(8, ⌈grid size / lanes⌉), lanes the devices or one CPU device's cores; with "
                   "processes min(8, ⌈grid size / processes⌉)); the numbers depend on none of them")
    p.add_argument("--cpu-devices", type=count, default=None, help="make N virtual CPU devices (per process) "
                   "before JAX starts")
    p.add_argument("--metric", default=None, help="metric for time-to-target (default: the task's: accuracy, "
                   "reward for RL tasks, ...)")
    p.add_argument("--target", type=float, default=None, help="target of --metric (default 0.95 for accuracy)")
    p.add_argument("--launch-local", type=count, default=None, metavar="N",
                   help="start N local processes of this sweep (127.0.0.1, a free port) and wait for them")
    p.add_argument("--timeout", type=positive, default=None,
                   help=f"--launch-local: kill every process after this many seconds (default {DEFAULT_LAUNCH_TIMEOUT:g})")
    p.add_argument("--coordinator", default=None, help="HOST:PORT of process 0 (multi-process sweeps)")
    p.add_argument("--num-processes", type=count, default=None, help="processes in the job")
    p.add_argument("--process-id", type=natural, default=None, help="this process's index, 0..N-1")
    p.add_argument("--out", default=None, help="output directory (default runs/sweep; checked before anything runs)")
    p.add_argument("--overwrite", action="store_true", help="replace staleness output already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd)


def _list(text: str, what: str, kind=str) -> list:
    try:
        values = [kind(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{what} = {text!r} must be comma-separated {kind.__name__}s") from None
    if not values:
        raise UsageError(f"{what} is empty")
    return values


def _policies(args) -> list:
    """Policy objects of --policy, each local-update one expanded over --local-steps."""
    from staleness import policies as P

    specs = args.policy or list(DEFAULT_RL_POLICIES if rl_task_name(args.task) else DEFAULT_POLICIES)
    pols = [P.parse(s) for s in specs]
    check_pairing(pols, args.task)
    if args.local_steps is not None:
        steps = _list(args.local_steps, "--local-steps", int)
        if any(h < 1 for h in steps):
            raise UsageError(f"--local-steps = {args.local_steps!r} must be integers >= 1")
        if not any(p.local for p in pols):
            raise UsageError("--local-steps expands local-update policies (local_sgd, diloco, async_diloco, "
                             "streaming_diloco); no --policy is one")
        out = []
        for p in pols:
            if not p.local:
                out.append(p)
                continue
            parts = p.describe().split(":")
            out += [P.parse(":".join([parts[0], str(h), *parts[2:]])) for h in steps]
        pols = out
    if len({p.local for p in pols}) > 1:
        raise UsageError("local-update methods and gradient policies need separate sweeps (their replays differ)")
    compiled = {(type(p.work), p.work.replay_settings()): p for p in pols}
    if len(compiled) > 1:
        name = pols[0].describe().split(":")[0]
        raise UsageError(f"{name}: {', '.join(sorted(p.describe() for p in compiled.values()))} need one sweep each "
                         f"({pols[0].work.compiled_what} are compiled into its replay); sweep the other settings "
                         "(seeds, lr rules, learning rates) within one")
    return list(dict.fromkeys(pols))


def _check(args):
    """Everything checkable before JAX starts: (policies, seeds, rules, lrs, cluster, budget, multi)."""
    from staleness import cluster as C
    from staleness import lr as _lr
    from staleness.cli.simulate_cmd import DEFAULT_LR, check_specs
    from staleness.engine import settings
    from staleness.tasks import optim
    from staleness.tasks import registry

    check_settings(args, _SETTINGS)
    check_values(args, SweepSettings, settings.check_sweep)   # the pinned --ring, --slots
    task_options(args)   # malformed KEY=VALUE: one line before anything runs
    pols = _policies(args)
    seeds = _list(args.seeds, "--seeds", int)
    if any(s < 0 for s in seeds):
        raise UsageError(f"--seeds = {args.seeds!r} must be integers >= 0")
    rules = _list(args.lr_rules, "--lr-rules")
    for r in rules:
        _lr.get(r)
    args.lr, args.lr_rule = None, rules[0]
    check_specs(args)
    if args.lrs is not None:
        lrs = _list(args.lrs, "--lrs", float)
        if any(not (math.isfinite(v) and v > 0) for v in lrs):
            raise UsageError(f"--lrs = {args.lrs!r} must be finite learning rates > 0")
        spec = optim.get(args.optimizer) if args.optimizer is not None else None
        if spec is not None and spec.lr is not None:
            raise UsageError(f"--lrs and --optimizer {args.optimizer!r} (lr={spec.lr:g}) disagree; give the "
                             "learning rates once")
    else:
        plain = args.task in registry.names() and declared_optimizer(args.task) is None
        named = args.optimizer is not None and optim.get(args.optimizer).lr is not None
        lrs = [DEFAULT_LR] if plain and not named and not any(p.local for p in pols) else [None]
    if any(p.local for p in pols) and args.inner_optimizer is None and args.task in registry.names() \
            and declared_optimizer(args.task) is None:
        args.inner_optimizer = f"sgd:lr={DEFAULT_LR:g}"   # the CLI's sgd default, for the workers' steps
    cluster = C.default().jitter(0.1) if args.cluster is None else C.parse(args.cluster)
    for p in pols:
        p.init(cluster.num_workers)
    if args.num_updates is not None and args.max_time is not None:
        raise UsageError("give either --updates or --max-time, not both")
    updates = (args.num_updates if args.num_updates is not None or args.max_time is not None
               else DEFAULT_RL_UPDATES if rl_task_name(args.task) else DEFAULT_UPDATES)
    check_scale(args, cluster, updates, args.max_time, runs=len(pols) * len(seeds))
    given = [args.coordinator is not None, args.num_processes is not None, args.process_id is not None]
    if any(given) and not all(given):
        raise UsageError("multi-process sweeps need all of --coordinator, --num-processes and --process-id")
    multi = all(given)
    if multi and not args.process_id < args.num_processes:
        raise UsageError(f"--process-id = {args.process_id} must be in 0..{args.num_processes - 1}")
    log_callbacks(args)   # a bad --log is a usage error before anything runs
    if (multi or args.launch_local is not None) and args.log:
        raise UsageError("--log applies to one-process sweeps")
    if multi and args.launch_local is not None:
        raise UsageError("--launch-local starts the processes itself; drop --coordinator/--num-processes/--process-id")
    if args.timeout is not None and args.launch_local is None:
        raise UsageError("--timeout applies to --launch-local")
    return pols, seeds, rules, lrs, cluster, updates, multi


def _cmd(args) -> int:
    pols, seeds, rules, lrs, cluster, updates, multi = _check(args)
    writes = not multi or args.process_id == 0
    out = check_out(args, default="runs/sweep") if writes else None
    if args.launch_local is not None:
        return _launch(args, out)
    if args.cpu_devices is not None:
        import jax

        jax.config.update("jax_num_cpu_devices", int(args.cpu_devices))
    if args.devices is not None and not multi:
        import jax

        have = len(jax.local_devices())
        if args.devices > have:
            raise UsageError(f"--devices = {args.devices} must be in 1..{have} (this process's devices; "
                             "--cpu-devices N makes N virtual CPU devices)")
    from staleness.engine import sweeps

    built = []   # the task (for the table's default metric and an RL task's rollouts)

    def make_grid():
        task = build_task(args, cluster.num_workers)
        check_pairing(pols, task)
        built.append(task)
        note = rl_estimate(task, updates, runs=len(pols) * len(seeds) * len(rules) * len(lrs))
        if note and writes:
            print(note, file=sys.stderr)
        return sweeps.prepare(task, pols, cluster, seeds=seeds, lr_rules=rules, lrs=lrs, num_updates=updates,
                              max_time=args.max_time, optimizer=args.optimizer,
                              inner_optimizer=args.inner_optimizer, eval_every=args.eval_every,
                              ring=args.ring, slots=args.slots)

    t0 = time.perf_counter()
    if multi:
        from staleness.engine.distributed import sweep_process

        results = sweep_process(make_grid, coordinator=args.coordinator, num_processes=args.num_processes,
                                process_id=args.process_id, devices=args.devices, block=args.block,
                                progress=not args.no_progress)
        if results is None:
            return 0
    else:
        results = sweeps.replay_grid(make_grid(), devices=args.devices, progress=not args.no_progress,
                                     block=args.block, callbacks=tuple(log_callbacks(args)))
    wall = time.perf_counter() - t0
    rows, metric, target = _table(results, args, built[0] if built else None)
    where = (f"{args.num_processes} processes" if multi else
             f"{len(results[0].config['devices'])} device(s)")
    compile_s = max(r.config["compile_s"] for r in results)
    print(f"{len(results)} configurations on {cluster.describe()} ({where}): {wall:.1f} s wall, of which "
          f"compilation {compile_s:.1f} s")
    print_table(rows)
    meta = {"configurations": len(results), "policies": [p.describe() for p in pols], "seeds": seeds,
            "lr_rules": rules, "lrs": lrs, "task": args.task, "cluster": cluster.describe(), "updates": updates,
            "max_time": args.max_time, "ring": results[0].config["ring"], "slots": results[0].config["slots"],
            "block": results[0].config["block"], "processes": args.num_processes if multi else 1,
            "devices": results[0].config["devices"],
            "wall_s": wall, "compile_s": compile_s, "metric": metric, "target": target}
    _write(out, results, rows, meta, args.overwrite)
    print(f"wrote {out}/table.csv, sweep.json, results/")
    return 0 if all(r.status == "complete" for r in results) else 1


def _table(results, args, task=None):
    """(rows, metric, target): one row per configuration (an RL task's with the mean
    staleness of the completion tokens the learner consumed, `staleness.results.rollouts`)."""
    from staleness.results import rollouts

    first = results[0]
    names = [c for c in first.history.columns if c not in ("update", "time", "train_loss")]
    own = getattr(task, "default_metric", None)
    metric = args.metric or (own if own in names else "accuracy" if "accuracy" in names else names[0])
    if metric not in names:
        raise UsageError(f"--metric = {metric!r} is not a metric of the task; valid: {', '.join(names)}")
    target = check_target(args, metric, first)
    order = ["config", "policy", "seed", "lr_rule", "lr"]
    rows = []
    for i, r in enumerate(results):
        c = r.config
        row = {"config": i, "policy": c["policy"], "seed": c["seed"], "lr_rule": c["lr_rule"], "lr": c["lr"]}
        if "local_steps" in c:   # H (Streaming DiLoCo's iterations are H / fragments steps)
            row["local_steps"] = max(c["local_steps"]) * r.schedule.policy.work.iterations_per_sync
        row.update({k: v for k, v in r.summary(target, metric).items() if k not in row})
        if task is not None and is_rl_task(task):
            row["staleness_per_token"] = rollouts.summary(r.schedule, task)["mean_staleness_per_token"]
        row["divergence"] = c.get("divergence", "")
        rows.append({**{k: row[k] for k in order}, **{k: v for k, v in row.items() if k not in order}})
    return rows, metric, target


def _write(out, results, rows, meta, overwrite: bool) -> None:
    import pandas as pd

    from staleness.infra import files

    def write(d):
        pd.DataFrame(rows).to_csv(d / "table.csv", index=False)
        width = len(str(len(results) - 1))
        for i, r in enumerate(results):
            r._write(_mkdir(d / "results" / f"{i:0{width}d}"))
        (d / "sweep.json").write_text(json.dumps(meta, indent=1, default=str))

    files.write_dir(out, write, overwrite=overwrite)


def _mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- --launch-local ------------------------------------------------------------------
def _launch(args, out) -> int:
    """Start --launch-local N processes of this sweep on 127.0.0.1 and wait (hard kill at --timeout)."""
    from staleness.runtime.multiprocess import free_port

    n = args.launch_local
    timeout = args.timeout if args.timeout is not None else DEFAULT_LAUNCH_TIMEOUT
    argv = _rebuild(args, out)
    port = free_port()
    env = dict(os.environ)
    if args.cpu_devices is None:   # one device per process unless asked otherwise
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
    procs = [subprocess.Popen([sys.executable, "-m", "staleness", *argv, "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", str(n), "--process-id", str(i)], env=env,
                              start_new_session=True) for i in range(n)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                kill_groups(procs)
                print(f"staleness: error: --launch-local: the sweep did not finish within {timeout:g} s; killed "
                      f"its {n} processes", file=sys.stderr)
                return 124
            bad = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if bad:   # one failed: the others would wait for it until their timeouts
                kill_groups(procs)
                print(f"staleness: error: --launch-local: process {bad[0]} exited with status "
                      f"{procs[bad[0]].returncode}; stopped the others", file=sys.stderr)
                return procs[bad[0]].returncode or 1
            time.sleep(0.1)
    except KeyboardInterrupt:
        kill_groups(procs)
        raise
    return procs[0].returncode


def _rebuild(args, out) -> list[str]:
    """The arguments of one process of the sweep, from the parsed `args` (minus --launch-local)."""
    argv = ["sweep"]
    for p in args.policy or []:
        argv += ["--policy", p]
    for option in args.task_option or []:
        argv.append(f"--task-option={option}")
    for flag, dest in (("--seeds", "seeds"), ("--lr-rules", "lr_rules"), ("--lrs", "lrs"),
                       ("--local-steps", "local_steps"), ("--task", "task"), ("--cluster", "cluster"),
                       ("--updates", "num_updates"), ("--max-time", "max_time"), ("--optimizer", "optimizer"),
                       ("--inner-optimizer", "inner_optimizer"), ("--batch-size", "batch_size"),
                       ("--partition", "partition"), ("--data-dir", "data_dir"), ("--eval-every", "eval_every"),
                       ("--ring", "ring"), ("--slots", "slots"), ("--devices", "devices"), ("--block", "block"),
                       ("--cpu-devices", "cpu_devices"), ("--metric", "metric"), ("--target", "target")):
        value = getattr(args, dest)
        if value is not None:
            argv.append(f"{flag}={value}")
    argv.append(f"--out={out}")
    for flag, dest in (("--overwrite", "overwrite"), ("--no-progress", "no_progress")):
        if getattr(args, dest):
            argv.append(flag)
    return argv

