"""`staleness plan`: the asynchronous-RL staleness planner (timing only, in seconds)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from staleness.cli.common import UsageError, check_out, header_lines, print_table

__all__ = ["add"]


def add(sub) -> None:
    p = sub.add_parser(
        "plan", help="plan asynchronous RL: throughput vs staleness of rl_* policies, from timing alone",
        description="Simulate the timing (no numerics) of asynchronous-RL policies on your actors' speeds, with your "
        "completion lengths, and print per policy: learner updates and tokens per simulated second, the staleness "
        "of the consumed tokens (mean/max), the dropped share, the consumed-length shift, actor and learner "
        "utilization; then the frontier: the η after which throughput stops rising.")
    p.add_argument("--cluster", default="1*8+jitter=0.2",
                   help="the actors' speeds in seconds per decoded token (a cluster spec or a measured trace; "
                   "default 1*8+jitter=0.2)")
    p.add_argument("--lengths", default="lognormal:128:1.0:1024",
                   help="completion lengths in tokens: lognormal:MEDIAN:SIGMA:MAX, zipf:A:MAX, constant:N, or a CSV "
                   "file of measured lengths (a column 'length', optionally 'count'; default lognormal:128:1.0:1024)")
    p.add_argument("--learner", type=float, default=0.5,
                   help="the learner's time per update, in units of an average actor's rollout (default 0.5)")
    p.add_argument("--eta", default="0,1,2,4,8,inf", help="the staleness bounds η to plan (default 0,1,2,4,8,inf; "
                   "0 is rl_sync, inf unbounded)")
    p.add_argument("--mode", default="pace", help="what to do about a rollout staler than η, comma-separated: pace, "
                   "drop, requeue (default pace)")
    p.add_argument("--inflight", action="store_true", help="also plan in-flight weight updates (rl_inflight)")
    p.add_argument("--one-step-off", action="store_true", help="also plan rl_one_step_off")
    p.add_argument("--minibatches", type=int, default=1, help="optimizer steps per version (default 1)")
    p.add_argument("--batch", type=int, default=None, help="rollouts per learner update (default one per actor)")
    p.add_argument("--policy", action="append", default=None,
                   help="plan these rl_* policy specs instead of the η × mode sweep (repeatable)")
    p.add_argument("--updates", type=int, default=1000, help="learner updates per schedule (default 1000)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; medians over them (default 0)")
    p.add_argument("--prompts-per-rollout", type=int, default=8,
                   help="prompts per rollout: a batch decodes as long as its longest (default 8)")
    p.add_argument("--prefill", type=float, default=0.0, help="a prompt's cost in decoded tokens (default 0)")
    p.add_argument("--out", default=None, help="write plan.csv and plan.png here")
    p.add_argument("--overwrite", action="store_true", help="replace a plan already in --out")
    p.set_defaults(func=_cmd_plan)


def _lengths(text: str):
    from staleness.tasks.rl import lengths as L

    if text.endswith(".csv"):
        import pandas as pd

        path = Path(text)
        if not path.is_file():
            raise UsageError(f"--lengths = {text!r}: no such file")
        frame = pd.read_csv(path)
        if "length" not in frame:
            raise UsageError(f"--lengths = {text!r}: the CSV needs a column 'length' (and optionally 'count')")
        try:
            return L.empirical(frame["length"].to_numpy(), frame["count"].to_numpy() if "count" in frame else None)
        except ValueError as e:
            raise UsageError(f"--lengths = {text!r}: {e}") from None
    kind, *args = text.split(":")
    try:
        if kind == "lognormal" and len(args) == 3:
            return L.lognormal(float(args[0]), float(args[1]), int(args[2]))
        if kind == "zipf" and len(args) == 2:
            return L.zipf(float(args[0]), int(args[1]))
        if kind == "constant" and len(args) == 1:
            return L.constant(int(args[0]))
    except ValueError as e:
        raise UsageError(f"--lengths = {text!r}: {e}") from None
    raise UsageError(f"--lengths = {text!r} must be lognormal:MEDIAN:SIGMA:MAX, zipf:A:MAX, constant:N or a .csv file")


def _etas(text: str) -> list:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("inf", "none", "∞"):
            out.append(None)
        elif part.isdigit():
            out.append(int(part))
        else:
            raise UsageError(f"--eta = {text!r} must be comma-separated integers >= 0 or inf, e.g. 0,1,2,4,8,inf")
    return out


def _cmd_plan(args) -> int:
    import staleness as st
    from staleness import cluster as C
    from staleness import policies as P
    from staleness.policies.factories import RL_MODES

    try:   # everything checked before anything is simulated
        cluster = C.parse(args.cluster)
        lengths = _lengths(args.lengths)
        etas = _etas(args.eta)
        modes = [m.strip() for m in args.mode.split(",") if m.strip()]
        bad = [m for m in modes if m not in RL_MODES]
        if bad or not modes:
            raise UsageError(f"--mode = {args.mode!r} must be comma-separated {', '.join(RL_MODES)}")
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        for name, value, low in (("--updates", args.updates, 1), ("--minibatches", args.minibatches, 1),
                                 ("--prompts-per-rollout", args.prompts_per_rollout, 1)):
            if value < low:
                raise UsageError(f"{name} = {value} must be >= {low}")
        if not (args.learner >= 0 and math.isfinite(args.learner)):
            raise UsageError(f"--learner = {args.learner} must be a finite number >= 0")
        specs = args.policy or st.rl.policies_of(etas, modes, inflight=args.inflight, one_step_off=args.one_step_off,
                                                 minibatches=args.minibatches, batch=args.batch, learner=args.learner)
        pols = [P.parse(s) for s in specs]
        for p in pols:
            p.init(cluster.num_workers)
        if any(not p.learner for p in pols):
            raise UsageError("--policy: the planner plans rl_* policies (asynchronous RL)")
    except ValueError as e:
        raise UsageError(str(e).split("\n")[0]) from None
    out = check_out(args) if args.out is not None else None
    t0 = time.perf_counter()
    table = st.rl.plan(cluster, lengths=lengths, policies=pols, num_updates=args.updates, seeds=seeds,
                       prompts_per_rollout=args.prompts_per_rollout, prefill=args.prefill)
    wall = time.perf_counter() - t0
    for line in header_lines([f"{len(pols)} policies x {args.updates} learner updates",
                              f"{cluster.describe()} ({cluster.num_workers} actors)", f"lengths {lengths}",
                              f"{wall:.1f} s"]):
        print(line)
    print_table([{"policy": r["policy"], "upd/s": f"{r['updates_per_s']:.3g}", "tok/s": f"{r['tokens_per_s']:.3g}",
                  "stale mean/max": f"{r['staleness_mean']:.2f}/{r['staleness_max']}",
                  "dropped": f"{100 * r['dropped_share']:.1f}%", "len shift": f"{r['length_shift']:+.3g}",
                  "actors": f"{r['actor_utilization']:.2f}", "learner": f"{r['learner_utilization']:.2f}"}
                 for r in table.to_dict("records")])
    for mode, eta in st.rl.frontier(table).items():
        if eta is not None:
            print(f"frontier ({mode}): throughput stops rising at η = {eta}; a larger η only adds staleness")
        elif (table["mode"] == mode).sum() > 1:
            print(f"frontier ({mode}): no bounded η planned reaches the best throughput; try larger ones")
    print("(upd/s, tok/s: per simulated second; stale: of the consumed tokens, in versions;\n"
          " actors, learner: utilization)")
    if out is not None:
        from staleness.infra import files
        from staleness.results import plots

        def write(d):
            table.to_csv(d / "plan.csv", index=False)
            plots.save(plots.plan_figure(table), d / "plan.png")

        files.write_dir(out, write, overwrite=args.overwrite)
        print(f"wrote {out}/plan.csv, plan.png")
    return 0
