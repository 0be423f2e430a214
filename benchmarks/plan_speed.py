"""Seconds the asynchronous-RL staleness planner (`st.rl.plan`) takes for 26 policies x 1,000
learner updates on 8 actors (η in 0, 1, 2, 3, 4, 6, 8, 12, 16, ∞ × pace, drop and requeue; η = 0
is rl_sync once, and an unbounded drop or requeue is no policy), against issue 36's target of 10 s on 2 cores; and, checked, that its numbers
are `st.simulate_schedule`'s (the same schedule: updates per simulated second and staleness per
token equal to the last digit; the script exits 1 after its JSON line otherwise). Ends with one
JSON line.

    python benchmarks/plan_speed.py [--updates 1000]
"""

import argparse
import time

import staleness as st
from _report import Agreement, finish
from staleness.engine import core
from staleness.results.planner import _timing_task

CLUSTER = "1*6,3*2+jitter=0.2"
ETAS = [0, 1, 2, 3, 4, 6, 8, 12, 16, None]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=1000)
    args = ap.parse_args()
    specs = st.rl.policies_of(ETAS, ["pace", "drop", "requeue"])
    st.rl.plan(CLUSTER, policies=specs[:1], num_updates=10)   # imports and first-use costs out of the timing
    t0, c0 = time.perf_counter(), time.process_time()
    table = st.rl.plan(CLUSTER, policies=specs, num_updates=args.updates)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # the same numbers from the simulator directly, for one policy
    row = table.set_index("policy").loc["rl_async:4"]
    task = _timing_task(8, st.tasks.rl.bandit.DEFAULT_LENGTHS, 8, 256, 0.0)
    sched = st.simulate_schedule("rl_async:4", CLUSTER, num_updates=args.updates, seed=0,
                                 sizes=task.rollout_sizes(core.keys(0)[1]))
    s = st.rollouts.summary(sched, task, seed=0)
    diff = max(abs(row["updates_per_s"] - args.updates / sched.update_time[-1]) / row["updates_per_s"],
               abs(row["staleness_mean"] - s["mean_staleness_per_token"]) / max(row["staleness_mean"], 1e-12))
    check = Agreement("st.rl.plan", "st.simulate_schedule + st.rollouts.summary", diff, 1e-12,
                      what="max relative difference (updates/s, staleness per token) of rl_async:4",
                      why="the same schedule: equal to float64 rounding")
    met = wall <= 10.0
    print(f"{len(specs)} policies x {args.updates} learner updates on {CLUSTER}: {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({wall / len(specs) * 1000:.0f} ms per policy); target <= 10 s: {'met' if met else 'NOT met'}")
    print(f"plan vs simulate_schedule (rl_async:4): max relative difference {diff:.2g}")
    finish({"benchmark": "plan_speed", "policies": len(specs), "updates": args.updates, "wall_s": wall, "cpu_s": cpu,
            "target_s": 10.0, "target_met": met, "frontier": {k: v for k, v in st.rl.frontier(table).items()}},
           [check])


if __name__ == "__main__":
    main()
