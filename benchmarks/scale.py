"""Scale: λ = 1024 workers on digits-mlp for 20,000 updates; time and peak memory.

Runs ASP (the largest staleness, so the largest ring of parameter versions)
and SSP(3). Peak memory is the process's maximum resident set size. Ends with
one JSON line. Target (issue #3): completes within 4 GB.

    python benchmarks/scale.py [--updates N]
"""

import argparse
import json
import resource
import time

import staleness as st


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=20_000)
    args = ap.parse_args()
    lam = 1024
    cluster = st.cluster.heterogeneous([1.0] * (lam // 2) + [2.6] * (lam // 2)).jitter(0.1)
    task = st.tasks.get("digits-mlp", batch_size=32, num_workers=lam)
    rows = []
    for pol in ("asp", "ssp:3"):
        t0 = time.perf_counter()
        sched = st.simulate_schedule(pol, cluster, num_updates=args.updates, seed=0)
        t_sched = time.perf_counter() - t0
        # staleness ~1000 at this scale: Rudra's α0/τ keeps it trainable (constant α0 stalls at chance)
        r = st.engine.replay(sched, task, lr=0.5, lr_rule="per_gradient", num_evals=10)
        dt = time.perf_counter() - t0
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        s = sched.summary()
        row = {"policy": pol, "workers": lam, "updates": args.updates, "wall_s": dt, "schedule_s": t_sched,
               "peak_rss_gb_so_far": peak_gb, "staleness_mean": s["staleness_mean"],
               "staleness_max": s["staleness_max"], "final_accuracy": float(r.final["accuracy"])}
        rows.append(row)
        print(f"{pol:>6}: {dt:6.1f} s wall ({t_sched:.1f} s schedule), peak RSS so far {peak_gb:.2f} GB, "
              f"staleness mean {s['staleness_mean']:.0f} max {s['staleness_max']}, accuracy {row['final_accuracy']:.3f}")
    peak = max(r["peak_rss_gb_so_far"] for r in rows)
    print(f"peak memory {peak:.2f} GB (target <= 4 GB): {'met' if peak <= 4 else 'NOT met'}")
    print(json.dumps({"benchmark": "scale", "rows": rows, "peak_rss_gb": peak, "target_met": peak <= 4}))


if __name__ == "__main__":
    main()
