"""The `staleness` command.

Every sub-command validates its input at the boundary: a bad argument prints
one line (`staleness: error: ...`) and exits with status 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


class UsageError(ValueError):
    """A bad command-line argument: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_table(rows: list[dict], file=None) -> None:
    """Print dicts as an aligned text table (columns = keys of the first row)."""
    file = file or sys.stdout
    if not rows:
        return
    keys = list(rows[0])
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, width)), file=file)
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, width)), file=file)


# -- staleness schedule ------------------------------------------------------------
def _add_schedule(sub) -> None:
    p = sub.add_parser(
        "schedule",
        help="simulate only the timing of a run (no numerics) and print its summary",
        description="Simulate when each gradient is computed, pushed and applied under a policy "
        "on a cluster, and print staleness and waiting statistics.",
    )
    p.add_argument("--policy", action="append", default=None,
                   help="policy spec (repeatable): bsp, asp, ssp:S, dssp:S_LOW:R_MAX[:nocap], softsync:N, backup:B "
                   "(default: bsp, asp, ssp:3, dssp:3:12, softsync:4)")
    p.add_argument("--cluster", default=None,
                   help="cluster spec (see staleness.cluster.parse); default: 4 workers at 1.0 s + 4 at 2.6 s")
    p.add_argument("--updates", type=int, default=2000, help="server updates to simulate (default 2000)")
    p.add_argument("--max-time", type=float, default=None, help="simulated seconds budget (optional)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object per policy instead of a table")
    p.add_argument("--save", default=None, help="write the schedule of the first policy to this JSON file")
    p.set_defaults(func=_cmd_schedule)


def _cmd_schedule(args) -> int:
    from staleness import cluster as C
    from staleness import policies as P
    from staleness.sim import simulate_schedule

    specs = args.policy or ["bsp", "asp", "ssp:3", "dssp:3:12", "softsync:4"]
    pols = [P.parse(s) for s in specs]
    cluster = C.parse(args.cluster) if args.cluster else C.default()
    for pol in pols:
        pol.init(cluster.num_workers)  # validates e.g. softsync n <= workers before any work
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="staleness", description="Stale-synchronous distributed training: simulate, compare, run.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    _add_schedule(sub)
    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return parser


# Sub-commands defined in other modules register themselves here (keeps this file small).
_EXTRA_COMMANDS: list = []


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"staleness: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("staleness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
