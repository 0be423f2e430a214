"""`staleness schedule`: timing only, no numerics."""

from __future__ import annotations

import json

from staleness import policies
from staleness.cli.common import count, natural, positive, print_table

__all__ = ["add"]


def add(sub) -> None:
    p = sub.add_parser(
        "schedule",
        help="simulate only the timing of a run (no numerics) and print its summary",
        description="Simulate when each gradient is computed, pushed and applied under a policy "
        "on a cluster, and print staleness and waiting statistics.",
    )
    p.add_argument("--policy", action="append", default=None,
                   help="policy spec (repeatable; default: bsp, asp, ssp:3, dssp:3:12, softsync:4): "
                   + policies.spec_help())
    p.add_argument("--cluster", default=None,
                   help="cluster spec (see staleness.cluster.parse); default: 4 workers at 1.0 s + 4 at 2.6 s")
    p.add_argument("--updates", type=count, default=2000, help="server updates to simulate (default 2000)")
    p.add_argument("--max-time", type=positive, default=None, help="simulated seconds budget (optional)")
    p.add_argument("--seed", type=natural, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object per policy instead of a table")
    p.add_argument("--save", default=None, help="write the schedule of the first policy to this JSON file")
    p.set_defaults(func=_cmd_schedule)


def _cmd_schedule(args) -> int:
    from staleness import cluster as C
    from staleness import policies as P
    from staleness.sim import simulate_schedule

    specs = args.policy or ["bsp", "asp", "ssp:3", "dssp:3:12", "softsync:4"]
    pols = [P.parse(s) for s in specs]
    cluster = C.default() if args.cluster is None else C.parse(args.cluster)
    for pol in pols:
        pol.init(cluster.num_workers)  # validates e.g. softsync n <= workers before any work
    if args.save:
        from pathlib import Path

        from staleness import files
        from staleness.schedule import Schedule

        def is_schedule(path: Path) -> bool:   # one this command wrote before: replaced
            try:
                Schedule.load(path)
            except Exception:  # noqa: BLE001 - anything else is not ours to replace
                return False
            return True

        files.check_file(Path(args.save), what="--save", replaceable=is_schedule)
    rows = []
    for i, pol in enumerate(pols):
        sched = simulate_schedule(pol, cluster, num_updates=args.updates, max_time=args.max_time, seed=args.seed)
        if i == 0 and args.save:
            sched.save(args.save)
        rows.append(sched.summary())
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print(f"cluster: {cluster.describe()}   seed: {args.seed}")
        cols = ["policy", "updates", "sim_time_s", "updates_per_s", "gradients_per_update",
                "staleness_mean", "staleness_max", "wait_fraction_mean", "dropped", "lost"]
        print_table([{k: r[k] for k in cols} | ({"rstar_mean": r["rstar_mean"]} if "rstar_mean" in r else {})
                     for r in rows])
    return 0


