"""`staleness simulate` (one policy) and `staleness compare` (several policies)."""

from __future__ import annotations

import math
import sys
import time

from staleness import policies
from staleness.cli.config_flags import add_flags, check_values, flags_of
from staleness.engine.settings import Settings
from staleness.cli.common import (is_rl_task, DEFAULT_RL_POLICIES, UsageError, add_log, add_task_option, add_yes,
                                   build_task, check_out, check_pairing, check_scale, is_rl_policy,
                                   header_lines, log_callbacks, print_table, rl_estimate, rl_task_name)

__all__ = ["add_simulate", "add_compare"]

DEFAULT_TASK = "digits-mlp"
DEFAULT_MAX_TIME = 600.0   # simulated seconds: ~3,300 ASP updates and ~230 BSP rounds on the default cluster
DEFAULT_RL_UPDATES = 40    # learner updates per run on an RL task (its simulated time is per generated token)
DEFAULT_LR = 0.1
DEFAULT_ACCURACY_TARGET = 0.95   # the default --target when the metric is accuracy (no default for others)

# The run's settings both commands offer, generated from `engine.settings.Settings` (checked there, once);
# `simulate` also offers _SIMULATE_ONLY (`compare` has --seeds and its own --resume).
_TRAINING = ["max_time", "num_updates", "lr", "lr_rule", "optimizer", "inner_optimizer", "batch_size"]
_SIMULATE_ONLY = ["seed", "checkpoint", "resume"]


def _training_args(p, *, task_default=DEFAULT_TASK) -> None:
    p.add_argument("--task", default=task_default, help=f"task: a built-in name (default {task_default}; see "
                   "staleness.tasks.names()) or a custom task as package.module:factory (a function on the Python "
                   "path returning a Task; called with num_workers, batch_size, partition, seed, data_dir as its "
                   "signature takes them)")
    p.add_argument("--cluster", default=None,
                   help="cluster spec, e.g. '1*4,2.6*4+jitter=0.1' or 'gtx1080ti*4,gtx1060*4' "
                   "(default: 4 workers at 1.0 s + 4 at 2.6 s per iteration, 10%% jitter)")
    add_flags(p, flags_of(Settings, ["max_time", "num_updates"], **_BUDGET_HELP))
    add_yes(p)
    add_log(p)
    add_flags(p, flags_of(Settings, ["lr", "lr_rule", "optimizer", "inner_optimizer", "batch_size"]))
    add_task_option(p)
    p.add_argument("--partition", default=None, help="iid (the default, or the task factory's own; every worker "
                   "samples all data), shard (disjoint "
                   "label-skewed shards), dirichlet:ALPHA (Dirichlet label proportions per worker, e.g. "
                   "dirichlet:0.5) or sizes:F1,...,Fn (unequal iid shards, one fraction per worker)")
    p.add_argument("--data-dir", default=None, help="local data directory (CIFAR tasks; or set STALENESS_CIFAR_DIR)")
    p.add_argument("--metric", default=None, help="metric for the table and time-to-target (default: accuracy "
                   "where the task has it, reward for RL tasks, else its first metric, e.g. loss); its direction "
                   "comes from the task")
    p.add_argument("--target", type=float, default=None,
                   help=f"target value of --metric for time-to-target (default {DEFAULT_ACCURACY_TARGET:g} for "
                   "accuracy, none for other metrics); checked against the metric's range")
    p.add_argument("--out", default=None, help="directory for CSV/PNG/Result files (checked before anything runs)")
    p.add_argument("--overwrite", action="store_true", help="replace staleness output already in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


_BUDGET_HELP = {"max_time": {"help": f"simulated seconds per run (default {DEFAULT_MAX_TIME:g}; RL tasks: --updates)"},
                "num_updates": {"help": "server updates per run (instead of --max-time; default for RL tasks "
                                        f"{DEFAULT_RL_UPDATES} learner updates)"}}


def check_settings(args, names) -> None:
    """The run's settings given as flags `names` (fields of `engine.settings.Settings`),
    checked by the library (`config_flags.check_values`)."""
    from staleness.engine import settings

    check_values(args, Settings, settings.check, names)


def _cluster_task(args):
    """(cluster, rl, task): the cluster; whether --task is an RL task; the task, built here only when
    its kind is known once built and no --policy was given (a custom task: its kind picks the defaults)."""
    from staleness import cluster as C

    cluster = C.default().jitter(0.1) if args.cluster is None else C.parse(args.cluster)
    rl, task = rl_task_name(args.task), None
    if rl is None and args.policy is None:
        task = build_task(args, cluster.num_workers)
        rl = is_rl_task(task)
    return cluster, rl, task


def check_target(args, metric: str, owner):
    """--target (default DEFAULT_ACCURACY_TARGET for accuracy, else none), checked against the range of
    `owner.metric(metric)` (a task or a Result)."""
    target = DEFAULT_ACCURACY_TARGET if args.target is None and metric == "accuracy" else args.target
    return None if target is None else owner.metric(metric).check_target(target, "--target")


def _metric_target(args, task):
    """(metric, target) from --metric/--target, validated against the task's metrics."""
    metric = args.metric if args.metric is not None else task.default_metric
    task.metric(metric)   # an unknown --metric: one line
    return metric, check_target(args, metric, task)


def check_specs(args) -> None:
    """Parse --lr-rule and --optimizer up front (a bad spec is one line before any work)."""
    from staleness import lr as _lr
    from staleness.tasks import optim

    _lr.get(args.lr_rule)
    if getattr(args, "inner_optimizer", None) is not None:
        optim.get(args.inner_optimizer, "--inner-optimizer")
    if args.optimizer is not None:
        spec = optim.get(args.optimizer)
        if args.lr is not None and spec.lr is not None and args.lr != spec.lr:
            raise UsageError(f"--lr = {args.lr:g} and --optimizer {args.optimizer!r} (lr={spec.lr:g}) disagree; "
                             "give the learning rate once")


def settle_lr(args, task) -> None:
    """The learning rate of a run: --lr, else the optimizer's own (its spec's lr=, or
    the task's default optimizer), else DEFAULT_LR for a spec that names none."""
    from staleness.tasks import optim

    if args.lr is not None:
        return
    optimizer = args.optimizer if args.optimizer is not None else task.optimizer
    if optimizer is None or (isinstance(optimizer, str) and optim.get(optimizer).lr is None):
        args.lr = DEFAULT_LR


def _budget(args, rl: bool = False):
    """(updates, max_time): --updates or --max-time, else DEFAULT_MAX_TIME simulated
    seconds (DEFAULT_RL_UPDATES learner updates for RL: their time is per token)."""
    if args.num_updates is not None and args.max_time is not None:
        raise UsageError("give either --updates or --max-time, not both")
    if args.num_updates is None and args.max_time is None:
        return (DEFAULT_RL_UPDATES, None) if rl else (None, DEFAULT_MAX_TIME)
    return args.num_updates, args.max_time


def task_label(task) -> str:
    """The task's name, with its objective for an RL task ('rl-digits, decoupled_ppo(eps=0.2)')."""
    objective = getattr(task, "objective", None)
    return task.name if objective is None else f"{task.name}, {objective.describe()}"


def print_rollouts(results, task, file=None) -> None:
    """An RL run's rollouts, one line per policy (`staleness.results.compare.rollout_table`)."""
    from staleness.results.compare import rollout_table

    table = rollout_table(results, task)
    if table is not None and len(table):
        print("rollouts (medians over seeds; mean completion length generated -> consumed):", file=file)
        print_table([{"policy": r["policy"], "rollouts": r["rollouts"], "consumed": r["consumed"],
                      "dropped": r["dropped"], "lost": r["lost"],
                      "stale/rollout": f"{r['staleness_per_rollout']:.2f}",
                      "versions/rollout": f"{r['versions_per_rollout']:.2f}",
                      "length": f"{r['length_generated']:.3g} -> {r['length_consumed']:.3g}"}
                     for r in table.to_dict("records")], file=file)


def add_simulate(sub) -> None:
    p = sub.add_parser("simulate", help="simulate one policy with real numerics and write a Result",
                       description="Simulate POLICY on a cluster and train a task along the schedule.")
    p.add_argument("--policy", default=None, help="policy spec (default ssp:3, and rl_async:2 on an RL task): "
                   f"{policies.spec_help()}")
    add_flags(p, flags_of(Settings, _SIMULATE_ONLY, seed={"help": "seed of parameters, minibatches and the "
                                                          "cluster's draws (default 0)"}))
    _training_args(p)
    p.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args) -> int:
    import staleness as st
    from staleness.results import plots
    from staleness.engine.result import DivergenceError

    check_settings(args, _TRAINING + _SIMULATE_ONLY)
    cluster, rl, task = _cluster_task(args)
    policy = st.policies.parse(args.policy if args.policy is not None else ("rl_async:2" if rl else "ssp:3"))
    policy.init(cluster.num_workers)
    check_pairing([policy], args.task)
    check_specs(args)
    updates, max_time = _budget(args, is_rl_policy(policy) if rl is None else rl)
    check_scale(args, cluster, updates, max_time)
    callbacks = log_callbacks(args)
    if args.resume and not args.checkpoint:
        raise UsageError("--resume needs --checkpoint DIR")
    out = check_out(args)
    if task is None:
        task = build_task(args, cluster.num_workers)
    check_pairing([policy], task)
    note = rl_estimate(task, updates)
    if note:
        print(note, file=sys.stderr)
    if not policy.local:
        settle_lr(args, task)
    elif args.inner_optimizer is None and task.optimizer is None:
        args.inner_optimizer = f"sgd:lr={DEFAULT_LR:g}"   # the CLI's sgd default, for the workers' steps
    metric, target = _metric_target(args, task)
    t0 = time.perf_counter()
    try:
        result = st.simulate(task, policy, cluster, num_updates=updates, max_time=max_time, seed=args.seed,
                             lr=args.lr, lr_rule=args.lr_rule, optimizer=args.optimizer,
                             inner_optimizer=args.inner_optimizer,
                             progress=not args.no_progress, checkpoint=args.checkpoint, resume=args.resume,
                             callbacks=callbacks)
    except DivergenceError as e:
        result = e.result
        print(f"staleness: diverged: {e}", file=sys.stderr)
    except st.tracking.CallbackError as e:   # a --log writer failed: keep and write what was recorded
        result = e.result
        print(f"staleness: {e}", file=sys.stderr)
    for line in header_lines([f"{policy.describe()} on {cluster.describe()}", task_label(task), f"seed {args.seed}",
                              f"{time.perf_counter() - t0:.1f} s wall"]):
        print(line)
    if is_rl_task(task):   # RL's words: the reward, staleness per token, the learner's diagnostics
        keep = ["update", "time", metric, "greedy_reward", "kl_behav", "clip_fraction", "staleness_mean"]
        print_table(result.history[[c for c in keep if c in result.history]].to_dict("records"))
        from staleness.results.compare import rollout_table

        s = result.summary(target, metric)
        ro = rollout_table([result], task).to_dict("records")[0]
        row = {"updates": s["updates"], "sim s": f"{s['sim_time_s']:.4g}", "upd/s": f"{s['updates_per_s']:.3g}",
               f"final {metric}": f"{s.get(f'final_{metric}', math.nan):.3g}",
               "token stale mean/max": f"{ro['staleness_per_token']:.2f}/{ro['staleness_max']}",
               "dropped": f"{ro['dropped']}/{ro['rollouts']}", "kl_behav": f"{s.get('kl_behav', math.nan):.2g}",
               "IS max": f"{s.get('is_weight_max', math.nan):.3g}"}
        if s["status"] != "complete":
            row["status"] = s["status"]
        if target is not None:
            row[f"time to {target:g} (s)"] = f"{s[f'time_to_{metric}_{target:g}_s']:.4g}"
        print_table([row])
    else:
        print_table(result.history.to_dict("records"))
        print_table([result.summary(target, metric)])
    print_rollouts([result], task)
    if out is not None:
        def summary_png(d):
            if len(result.history):
                plots.save(plots.comparison_figure([result], metric=metric, target=target), d / "summary.png")

        result.save(out, overwrite=args.overwrite, extra=summary_png)
        print(f"wrote {out}/")
    if result.status == "stopped":
        print("staleness: interrupted; wrote what was recorded" if out is not None else "staleness: interrupted",
              file=sys.stderr)
        return 130
    if result.status == "failed":
        print(f"staleness: {result.config['ended']}", file=sys.stderr)
    return 0 if result.status == "complete" else 1


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="compare policies on one cluster (the main job)",
                       description="Run several policies on one cluster and task with the same simulated-time "
                       "budget; print time to target accuracy, final accuracy, staleness and waiting; write "
                       "CSV and PNG files. With no arguments: digits-mlp, 8 workers (4 fast, 4 at 1/2.6 speed), "
                       "BSP, ASP, SSP(3), SSP(15), DSSP(3,12), softsync(4). On an RL task (--task rl-bandit, "
                       "rl-digits): the rl_* policies, the same number of learner updates each, final reward "
                       "(higher is better) and the staleness of the rollouts the learner consumed.")
    p.add_argument("--policy", action="append", default=None,
                   help="policy spec (repeatable; default: bsp asp ssp:3 ssp:15 dssp:3:12 softsync:4, and "
                   f"{' '.join(DEFAULT_RL_POLICIES)} on an RL task): " + policies.spec_help())
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--resume", dest="resume_compare", action="store_true",
                   help="continue the comparison in --out: run only what is not done yet")
    p.add_argument("--lr-grid", default=None,
                   help="comma-separated learning rates to tune each policy's from (default: the optimizer's "
                   "learning rate x 0.1, 0.3, 1, 3, 10); tuning is the default unless --lr is given")
    p.add_argument("--no-tune", action="store_true", help="no learning-rate tuning: every policy at the default lr")
    _training_args(p)
    p.set_defaults(func=_cmd_compare, out=None)


def _lr_grid(text):
    if text is None:
        return None
    try:
        grid = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--lr-grid = {text!r} must be comma-separated numbers, e.g. 0.01,0.03,0.1") from None
    if not grid or any(not (g > 0 and g < float("inf")) for g in grid):
        raise UsageError(f"--lr-grid = {text!r} must list finite learning rates > 0")
    return sorted(set(grid))


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds = {text!r} must be comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise UsageError("--seeds is empty; give e.g. 0,1,2")
    if min(seeds) < 0:
        raise UsageError(f"--seeds = {text!r}: seeds must be integers >= 0, e.g. 0,1,2")
    return seeds


def _iv(median, lo, hi, digits: int = 3) -> str:
    """'median [lo, hi]' in `digits` significant digits ('-' for NaN)."""
    return f"{median:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]" if math.isfinite(median) else "-"


def compact_rows(table, metric: str, target, rollouts=None) -> list[dict]:
    """The comparison table for a terminal (at most about 100 columns; table.csv and rollouts.csv keep every
    column): policy, lr, time to target and final metric with their intervals, then the gradient policies'
    or (`rollouts`: the comparison's `rollout_table`) the RL policies' own columns."""
    by = {} if rollouts is None else {r["policy"]: r for r in rollouts.to_dict("records")}
    rows = []
    for r in table.to_dict("records"):
        row = {"policy": r["policy"], "lr": f"{r['lr']:.3g}" if isinstance(r.get("lr"), float) else r.get("lr", "")}
        if rollouts is not None:
            row["upd/s"] = f"{r['updates_per_s']:.3g}" if math.isfinite(r.get("updates_per_s", math.nan)) else "-"
        if target is not None:
            row[f"time to {target:g} (s)"] = (_iv(r[f"time_to_{metric}_{target:g}_s"], r["time_ci_low_s"],
                                                 r["time_ci_high_s"]) + f" {r['reached']}")
        row[f"final {metric}"] = _iv(r[f"final_{metric}"], r["final_ci_low"], r["final_ci_high"])
        if rollouts is None:
            row["stale mean/max"] = f"{r['staleness_mean']:.2f}/{r['staleness_max']}"
            row["wait"] = f"{r['wait_fraction_mean']:.2f}"
            row["comm"] = f"{r['comm_fraction_mean']:.2f}"
            row["MB sent"] = f"{r['bytes_sent'] / 1e6:.3g}" if math.isfinite(r["bytes_sent"]) else "-"
        else:
            ro = by.get(r["policy"], {})
            share = ro.get("dropped", 0) / max(ro.get("rollouts", 0), 1)
            row["token stale mean/max"] = (f"{ro['staleness_per_token']:.2f}/{ro['staleness_max']}" if ro else "-")
            row["dropped"] = f"{100 * share:.0f}%" if ro else "-"
            row["kl_behav"] = f"{r.get('kl_behav', math.nan):.2g}"
            row["clip"] = f"{r.get('clip_fraction', math.nan):.2f}"
        if r["status"] != "complete" or r.get("diverged"):
            row["status"] = r["status"] + (f", {r['diverged']} diverged" if r.get("diverged") else "")
        rows.append(row)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return [{k: row.get(k, "") for k in keys} for row in rows]


def _print_comparison(args, cmp, task, cluster, policies, metric, max_time, updates, wall: float) -> None:
    """The comparison's header (at most 100 columns), its compact table and its notes."""
    rl = is_rl_task(task)
    budget = f"{max_time:g} simulated s" if max_time else f"{updates} {'learner ' if rl else ''}updates"
    rate = f"lr {args.lr:g}" if args.lr is not None else cmp.budget()
    goal = "higher" if task.metric(metric).higher_is_better else "lower"
    who = "actors" if rl else "workers"
    for line in header_lines([task_label(task), f"cluster {cluster.describe()} ({cluster.num_workers} {who})",
                              f"{budget} per run", f"seeds {args.seeds}", rate, f"lr rule {args.lr_rule}",
                              f"metric {metric} ({goal} is better)", f"{wall:.1f} s wall"]):
        print(line)
    print_table(compact_rows(cmp.table(), metric, cmp.target, cmp.rollout_table() if rl else None))
    for note in cmp.tuning_notes():
        print(f"note: {note}")
    local = [p.describe() for p in policies if p.local]
    if local:
        print(f"note: for {', '.join(local)}, an update (table.csv's `updates`) is an outer round of "
              "H inner steps per worker")
    print_rollouts(cmp.results, task)


def _cmd_compare(args) -> int:
    import staleness as st
    from staleness.results.compare import DEFAULT_POLICIES, check_tunable, compare

    check_settings(args, _TRAINING)
    cluster, rl, task = _cluster_task(args)
    specs = args.policy or (DEFAULT_RL_POLICIES if rl else DEFAULT_POLICIES)
    policies = [st.policies.parse(p) for p in specs]
    for p in policies:
        p.init(cluster.num_workers)
    check_pairing(policies, args.task, rl)
    seeds = _seeds(args.seeds)
    check_specs(args)
    updates, max_time = _budget(args, any(is_rl_policy(p) for p in policies) if rl is None else rl)
    check_scale(args, cluster, updates, max_time, runs=len(policies) * len(seeds))
    callbacks = log_callbacks(args)
    if args.resume_compare and args.overwrite:
        raise UsageError("give either --resume or --overwrite, not both")
    out = check_out(args, default="runs/compare")
    if task is None:
        task = build_task(args, cluster.num_workers)
    check_pairing(policies, task)
    note = rl_estimate(task, updates, runs=len(policies) * len(seeds))
    if note:
        print(note, file=sys.stderr)
    metric, target = _metric_target(args, task)
    grid = _lr_grid(args.lr_grid)
    if grid is not None and args.lr is None and not args.no_tune:
        try:
            check_tunable(task, "--lr-grid")
        except ValueError as e:
            raise UsageError(str(e)) from None
    t0 = time.perf_counter()
    if args.inner_optimizer is None and task.optimizer is None:
        args.inner_optimizer = f"sgd:lr={DEFAULT_LR:g}"
    if args.lr is None and not args.no_tune and not args.resume_compare and not args.no_progress:
        from staleness.results.compare import tuning_cost

        print(tuning_cost(task, policies, grid, num_updates=updates), file=sys.stderr)
    try:
        cmp = compare(task, policies, cluster, seeds=seeds, max_time=max_time, num_updates=updates, lr=args.lr,
                      lr_rule=args.lr_rule, optimizer=args.optimizer, inner_optimizer=args.inner_optimizer,
                      metric=metric, target=target,
                      progress=not args.no_progress, out=out, resume=args.resume_compare, overwrite=args.overwrite,
                      tune=not args.no_tune, lr_grid=grid, default_lr=DEFAULT_LR, callbacks=callbacks)
    except st.tracking.CallbackError as e:   # written like an interrupted comparison
        print(f"staleness: {e}" + (f"; wrote {out}/ (continue with --resume)" if out is not None else ""),
              file=sys.stderr)
        return 1
    if cmp.interrupted and not any(r.status != "stopped" for r in cmp.results):   # Ctrl-C while tuning
        tuned = [k for k, v in cmp.tuning.items() if isinstance(v, dict) and "lr" in v]
        print(f"staleness: interrupted while tuning the learning rates ({len(tuned)} of {len(policies)} policies "
              f"tuned); wrote {out}/ (continue with --resume)" if out is not None else
              "staleness: interrupted while tuning the learning rates", file=sys.stderr)
        return 130
    _print_comparison(args, cmp, task, cluster, policies, metric, max_time, updates, time.perf_counter() - t0)
    if cmp.interrupted:
        done = sum(r.status != "stopped" for r in cmp.results)
        print(f"staleness: interrupted after {done} of {len(cmp.planned)} runs; wrote {out}/ "
              f"(continue with --resume)", file=sys.stderr)
        return 130
    extra = ", rollouts.csv" if is_rl_task(task) else ""
    print(f"wrote {out}/table.csv, history.csv{extra}, comparison.png, timeline_*.png, results/")
    return 0
