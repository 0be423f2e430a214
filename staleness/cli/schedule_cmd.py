"""`staleness schedule`: timing only, no numerics."""

from __future__ import annotations

import json

from staleness import policies
from staleness.cli.common import (DEFAULT_RL_POLICIES, UsageError, add_task_option, add_yes, build_task, check_pairing,
                                   check_scale, print_table, rl_task_name)
from staleness.cli.config_flags import add_flags, check_values, flags_of, integer
from staleness.engine.settings import Settings

__all__ = ["add"]

# The settings `schedule` shares with `simulate`, generated from `engine.settings.Settings`
# and checked there (`settings.check`), once.
_SETTINGS = ["num_updates", "max_time", "seed", "batch_size"]
_HELP = {"num_updates": {"help": "server updates to simulate (default 2000)", "default": 2000},
         "max_time": {"help": "simulated seconds budget (optional)"},
         "seed": {"help": "seed of the cluster's draws (default 0)"},
         "batch_size": {"help": "with --task: its minibatch size (RL tasks: prompts per rollout)"}}


def add(sub) -> None:
    p = sub.add_parser(
        "schedule",
        help="simulate only the timing of a run (no numerics) and print its summary",
        description="Simulate when each gradient is computed, pushed and applied under a policy "
        "on a cluster, and print staleness and waiting statistics.",
    )
    p.add_argument("--policy", action="append", default=None,
                   help="policy spec (repeatable; default: bsp, asp, ssp:3, dssp:3:12, softsync:4, and "
                   f"{', '.join(DEFAULT_RL_POLICIES)} with an RL --task): " + policies.spec_help())
    p.add_argument("--cluster", default=None,
                   help="cluster spec (see staleness.cluster.parse); default: 4 workers at 1.0 s + 4 at 2.6 s")
    add_flags(p, flags_of(Settings, _SETTINGS[:2], **_HELP))
    add_yes(p)
    add_flags(p, flags_of(Settings, _SETTINGS[2:3], **_HELP))
    p.add_argument("--task", default=None, help="time the runs of this task as `simulate` does (optional): an RL "
                   "task's rollouts take as long as the tokens they decode (without it, one cluster step each), "
                   "and transfers carry the bytes of its parameters")
    add_flags(p, flags_of(Settings, _SETTINGS[3:], **_HELP))
    p.add_argument("--payload-bytes", type=integer, default=None, help="bytes each pull and push carries over the "
                   "cluster's links, without a --task (with one: the bytes of its parameters); a cluster with a "
                   "bandwidth needs one of them")
    add_task_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per policy instead of a table")
    p.add_argument("--save", default=None, help="write the schedule of the first policy to this JSON file")
    p.set_defaults(func=_cmd_schedule)


def _cmd_schedule(args) -> int:
    from staleness import cluster as C
    from staleness import policies as P
    from staleness.engine import settings
    from staleness.sim.scheduler import simulate_schedule

    check_values(args, Settings, settings.check, _SETTINGS)
    if args.task is None and (args.task_option or args.batch_size is not None):
        raise UsageError("--task-option and --batch-size apply to a --task")
    rl = rl_task_name(args.task) if args.task is not None else None
    specs = args.policy or (list(DEFAULT_RL_POLICIES) if rl else ["bsp", "asp", "ssp:3", "dssp:3:12", "softsync:4"])
    pols = [P.parse(s) for s in specs]
    cluster = C.default() if args.cluster is None else C.parse(args.cluster)
    for pol in pols:
        pol.init(cluster.num_workers)  # validates e.g. softsync n <= workers before any work
    check_scale(args, cluster, None if args.max_time is not None else args.num_updates, args.max_time, runs=len(pols))
    if args.task is not None:
        check_pairing(pols, args.task)
    if args.save:
        from pathlib import Path

        from staleness.infra import files
        from staleness.schedule import Schedule

        def is_schedule(path: Path) -> bool:   # one this command wrote before: replaced
            try:
                Schedule.load(path)
            except Exception:  # noqa: BLE001 - anything else is not ours to replace
                return False
            return True

        files.check_file(Path(args.save), what="--save", replaceable=is_schedule)
    if args.task is not None and args.payload_bytes is not None:
        raise UsageError("give either --task (its parameters' bytes) or --payload-bytes, not both")
    if args.task is None and not args.payload_bytes and _has_bandwidth(cluster):
        raise UsageError(f"--cluster {cluster.describe()!r} has a bandwidth, but without --task or --payload-bytes "
                         "(> 0) the transfers carry no bytes and it would be ignored; give one of them")
    timing = _timing(args, pols, cluster)
    rows = []
    for i, pol in enumerate(pols):
        sched = simulate_schedule(pol, cluster, num_updates=args.num_updates, max_time=args.max_time, seed=args.seed,
                                  **timing(pol))
        if i == 0 and args.save:
            sched.save(args.save)
        rows.append(sched.summary())
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"cluster: {cluster.describe()}   seed: {args.seed}" + (f"   task: {args.task}" if args.task else ""))
        cols = ["policy", "updates", "sim_time_s", "updates_per_s", "gradients_per_update",
                "staleness_mean", "staleness_max", "wait_fraction_mean", "dropped", "lost"]
        print_table([{k: r[k] for k in cols} | ({"rstar_mean": r["rstar_mean"]} if "rstar_mean" in r else {})
                     for r in rows])
    return 0


def _has_bandwidth(cluster) -> bool:
    """Whether some link of `cluster` has a finite bandwidth (a shared server link included)."""
    import math

    sampler = cluster.sampler(0)
    return sampler.server is not None or any(math.isfinite(b) for b in sampler.bandwidth)


def _timing(args, pols, cluster):
    """policy -> simulate_schedule's sizes and payload keywords: `simulate`'s for --task
    (an RL task's rollout sizes in tokens, the parameters' bytes), else none."""
    if args.task is None:
        n = args.payload_bytes
        return lambda pol: {} if n is None else {"payload_bytes": n}
    task = build_task(args, cluster.num_workers)
    check_pairing(pols, task)
    from staleness.engine import payload
    from staleness.engine.run import work_sizes

    def timing(pol):
        pull, push = payload.payload_bytes(task, pol)
        return {"payload_bytes": pull, "push_bytes": push, "sizes": work_sizes(task, pol, args.seed)}
    return timing
