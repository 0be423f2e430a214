"""Gradient events per second of wall time of `simulate_schedule`.

For λ in {8, 128, 1024} workers and every policy, on a jittered 1 : 2.6
cluster, measure gradients simulated per wall-clock second (one CPU core).
Compare with the limit: a bare `heapq` loop that only pushes/pops one event
per gradient with pre-drawn compute times (what any discrete-event
simulator must at least do). Ends with one JSON line.

Targets (issue #2): >= 100,000 events/s at λ = 8 and >= 50,000 at λ = 1024.

Then the network model (issue #11) on the same clusters with payload bytes:
per-worker links (`+net=`, times fixed at each transfer's start), a shared
server link (`+server=`, processor sharing, re-timed at every transfer) and
an all-reduce (`+allreduce=`, BSP). `--baseline DIR` runs the plain rows
with the `staleness` package found in DIR too (e.g. an export of an older
commit: `git archive HEAD staleness | tar -x -C DIR`), alternating, so that
before/after are measured in one run on the same machine load.

    python benchmarks/schedule_speed.py [--quick] [--baseline DIR]
"""

import argparse
import heapq
import json
import os
import subprocess
import sys
import time

import numpy as np

from staleness import cluster as C
from staleness import policies as P
from staleness.sim.scheduler import simulate_schedule

POLICIES = ["bsp", "asp", "ssp:3", "dssp:3:12", "dssp:3:12:nocap", "softsync:4", "backup:1"]


def bare_heap_loop(seconds: np.ndarray, num_gradients: int, seed: int = 0) -> float:
    """Events/s of the minimal ASP event loop: one heap pop + push per gradient."""
    lam = len(seconds)
    rng = np.random.default_rng(seed)
    draws = (seconds[None, :] * rng.lognormal(-0.005, 0.1, (3 * (num_gradients // lam) + 10, lam))).tolist()
    clock = [0] * lam
    heap = [(draws[0][w], w) for w in range(lam)]
    heapq.heapify(heap)
    t0 = time.perf_counter()
    for _ in range(num_gradients):
        t, w = heapq.heappop(heap)
        clock[w] += 1
        heapq.heappush(heap, (t + draws[clock[w]][w], w))
    return num_gradients / (time.perf_counter() - t0)


def measure(policy: str, lam: int, min_gradients: int) -> dict:
    pol = P.parse(policy)
    secs = [1.0] * (lam // 2) + [2.6] * (lam - lam // 2)
    cluster = C.heterogeneous(secs).jitter(0.1)
    per_update = {"bsp": lam, "backup:1": lam - 1, "softsync:4": lam // 4}.get(policy, 1)
    num_updates = max(1, min_gradients // per_update)
    simulate_schedule(pol, cluster, num_updates=max(1, num_updates // 20), seed=1)  # warm caches
    t0, c0 = time.perf_counter(), time.process_time()
    sched = simulate_schedule(pol, cluster, num_updates=num_updates, seed=0)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"policy": policy, "workers": lam, "gradients": sched.num_gradients,
            "seconds": dt, "events_per_s": sched.num_gradients / dt,
            "cpu_events_per_s": sched.num_gradients / max(cpu, 1e-9)}


NETWORK = [("asp", "+net=1gbps:5ms"), ("ssp:3", "+net=1gbps:5ms"), ("asp", "+net=1gbps:5ms+server=10gbps"),
           ("bsp", "+allreduce=ring:10gbps:1ms")]
PAYLOAD = 4 * 10**6   # bytes: a 1M-parameter float32 model
REPS = 3              # alternations of this tree and the baseline


def measure_network(policy: str, suffix: str, lam: int, min_gradients: int) -> dict:
    pol = P.parse(policy)
    secs = ",".join(["1"] * (lam // 2) + ["2.6"] * (lam - lam // 2))
    cluster = C.parse(f"{secs}+jitter=0.1{suffix}")
    per_update = lam if policy == "bsp" else 1
    num_updates = max(1, min_gradients // per_update)
    simulate_schedule(pol, cluster, num_updates=max(1, num_updates // 20), seed=1, payload_bytes=PAYLOAD)
    t0, c0 = time.perf_counter(), time.process_time()
    sched = simulate_schedule(pol, cluster, num_updates=num_updates, seed=0, payload_bytes=PAYLOAD)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"policy": policy, "network": suffix, "workers": lam, "gradients": sched.num_gradients,
            "seconds": dt, "events_per_s": sched.num_gradients / dt,
            "cpu_events_per_s": sched.num_gradients / max(cpu, 1e-9)}


def baseline(directory: str, policy: str, lam: int, n: int) -> dict:
    """`measure(policy, lam, n)` with the staleness package in `directory`."""
    code = (f"import json, sys; sys.path.insert(0, {os.path.abspath(__file__ + '/..')!r}); "
            f"import schedule_speed as b; print(json.dumps(b.measure({policy!r}, {lam}, {n})))")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(directory)}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer events (smoke run)")
    ap.add_argument("--baseline", default=None, help="a directory holding another staleness package to compare with")
    ap.add_argument("--baseline-only", action="store_true", help="with --baseline: only the comparison")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    rows = []
    limit = {}
    print(f"{'policy':>16} {'λ':>5} {'gradients':>10} {'events/s':>10} {'vs bare heap':>12} {'cpu events/s':>12}")
    for lam in () if args.baseline_only else (8, 128, 1024):
        limit[lam] = bare_heap_loop(np.array([1.0] * (lam // 2) + [2.6] * (lam - lam // 2)), n)
        for pol in POLICIES:
            r = measure(pol, lam, n)
            r["vs_bare_heap"] = r["events_per_s"] / limit[lam]
            rows.append(r)
            print(f"{pol:>16} {lam:>5} {r['gradients']:>10} {r['events_per_s']:>10,.0f} {r['vs_bare_heap']:>12.3f} "
                  f"{r['cpu_events_per_s']:>12,.0f}")
        print(f"{'bare heap loop':>16} {lam:>5} {n:>10} {limit[lam]:>10,.0f} {1.0:>12.3f}")
    worst, ok = {}, None
    if rows:
        worst = {lam: min(r["events_per_s"] for r in rows if r["workers"] == lam) for lam in (8, 128, 1024)}
        ok = worst[8] >= 100_000 and worst[1024] >= 50_000
        print(f"slowest policy: λ=8 {worst[8]:,.0f}/s (target 100,000), λ=1024 {worst[1024]:,.0f}/s "
              f"(target 50,000): {'met' if ok else 'NOT met'}")

    net_rows = []
    print(f"\n{'policy':>8} {'network':>30} {'λ':>5} {'gradients':>10} {'events/s':>10} {'vs no network':>13} "
          f"{'cpu events/s':>12} {'cpu vs no network':>17}")
    for lam in () if args.baseline_only else (8, 1024):
        for pol, suffix in NETWORK:
            r = measure_network(pol, suffix, lam, n)
            plain = next(x["events_per_s"] for x in rows if x["policy"] == pol and x["workers"] == lam)
            plain_cpu = next(x["cpu_events_per_s"] for x in rows if x["policy"] == pol and x["workers"] == lam)
            r["vs_no_network"] = r["events_per_s"] / plain
            r["cpu_vs_no_network"] = r["cpu_events_per_s"] / plain_cpu
            net_rows.append(r)
            print(f"{pol:>8} {suffix:>30} {lam:>5} {r['gradients']:>10} {r['events_per_s']:>10,.0f} "
                  f"{r['vs_no_network']:>13.3f} {r['cpu_events_per_s']:>12,.0f} {r['cpu_vs_no_network']:>17.3f}")

    base_rows = []
    if args.baseline:
        print(f"\nbaseline {args.baseline}: the plain rows again, alternating this tree and the baseline "
              f"{REPS} times; medians of wall-clock and of CPU-time (steadier on a shared machine) events/s")
        print(f"{'policy':>8} {'λ':>5} {'this tree':>10} {'baseline':>10} {'ratio':>6} "
              f"{'cpu: this':>10} {'baseline':>10} {'ratio':>6}")
        for lam in (8, 1024):
            for pol in ("asp", "bsp", "ssp:3"):
                pairs = [(measure(pol, lam, n), baseline(args.baseline, pol, lam, n)) for _ in range(REPS)]
                row = {"policy": pol, "workers": lam}
                for key in ("events_per_s", "cpu_events_per_s"):
                    row[key] = float(np.median([a[key] for a, _ in pairs]))
                    row["baseline_" + key] = float(np.median([b[key] for _, b in pairs]))
                    row["ratio_" + key] = float(np.median([a[key] / b[key] for a, b in pairs]))
                base_rows.append(row)
                print(f"{pol:>8} {lam:>5} {row['events_per_s']:>10,.0f} {row['baseline_events_per_s']:>10,.0f} "
                      f"{row['ratio_events_per_s']:>6.3f} {row['cpu_events_per_s']:>10,.0f} "
                      f"{row['baseline_cpu_events_per_s']:>10,.0f} {row['ratio_cpu_events_per_s']:>6.3f}")
    print(json.dumps({"benchmark": "schedule_speed", "rows": rows, "bare_heap_events_per_s": limit,
                      "worst_events_per_s": worst, "targets_met": ok, "network_rows": net_rows,
                      "baseline_rows": base_rows}))


if __name__ == "__main__":
    main()
