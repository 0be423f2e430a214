"""The real runtime's speed, measured against the engine and the simulator in one run.

On 8 virtual CPU devices (a thread per worker), `digits-mlp` (μ = 32):
  1. real vs replay: updates/s of a real run at hardware speed (no injected
     delays) vs the engine's compiled replay of the very trace it recorded
     (slot_mode='map', compile excluded), for ASP and BSP;
  2. server overhead: the server loop's busy time per update (policy decision,
     trace row, jitted update dispatch, releases), from the same ASP run;
  3. heterogeneity: with 4 fast + 4 slow (2.6x) workers injected through the
     cluster model, the measured updates/s of ASP, SSP(3) and DSSP(3,12)
     relative to BSP, against the simulator's prediction for the same cluster
     and the same (simulated) duration. Target: within 15 %.
Prints ratios measured in this run; ends with one JSON line.

    python benchmarks/runtime_speed.py [--quick] [--time-scale 0.02] [--seconds 6]
"""

import argparse
import json
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

import staleness as st  # noqa: E402
import staleness.runtime as rt  # noqa: E402
from staleness.runtime.server import Server  # noqa: E402

POLICIES = ["bsp", "asp", "ssp:3", "dssp:3:12"]


class BusyClock:
    """Wraps Server._on_arrival to add up the server's busy time."""

    def __init__(self):
        self.busy = 0.0
        self._orig = Server._on_arrival

    def __enter__(self):
        orig = self._orig

        def timed(server, arrival):
            t = time.perf_counter()
            try:
                return orig(server, arrival)
            finally:
                self.busy += time.perf_counter() - t

        Server._on_arrival = timed
        return self

    def __exit__(self, *exc):
        Server._on_arrival = self._orig


def replay_rate(task, sched):
    kw = dict(lr=0.05, slot_mode="map", eval_every=sched.num_updates)
    st.engine.replay(sched, task, **kw)  # compile
    t0 = time.perf_counter()
    st.engine.replay(sched, task, **kw)
    return sched.num_updates / (time.perf_counter() - t0)


def real_vs_replay(task, policy, updates):
    with BusyClock() as clock:
        res = rt.run(task, policy, None, num_updates=updates, lr=0.05, eval_every=updates)
    real = res.schedule.num_updates / res.schedule.end_time
    return {"policy": policy, "updates": res.schedule.num_updates, "real_upd_per_s": real,
            "replay_upd_per_s": replay_rate(task, res.schedule),
            "server_busy_ms_per_update": 1e3 * clock.busy / res.schedule.num_updates,
            "server_busy_fraction": clock.busy / res.schedule.end_time}


def heterogeneity(task, cluster, scale, seconds):
    rows = {}
    for policy in POLICIES:
        res = rt.run(task, policy, cluster, num_updates=10**9, max_time=seconds, time_scale=scale, lr=0.05,
                     eval_every=10**6)
        # count the updates of the measured window only (max_time stops at its first check after it)
        t_end = min(seconds, res.schedule.end_time)
        real = int((res.schedule.update_time <= t_end).sum()) / t_end
        sim = st.simulate_schedule(policy, cluster, max_time=t_end / scale, seed=0)
        rows[policy] = {"real_upd_per_s": real, "sim_upd_per_sim_s": sim.num_updates / sim.end_time,
                        "real_updates": int(res.schedule.num_updates), "sim_updates": sim.num_updates}
    base_real, base_sim = rows["bsp"]["real_upd_per_s"], rows["bsp"]["sim_upd_per_sim_s"]
    for policy, r in rows.items():
        r["real_vs_bsp"] = r["real_upd_per_s"] / base_real
        r["sim_vs_bsp"] = r["sim_upd_per_sim_s"] / base_sim
        r["agreement"] = r["real_vs_bsp"] / r["sim_vs_bsp"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--time-scale", type=float, default=0.02, help="real seconds per simulated second")
    ap.add_argument("--seconds", type=float, default=None, help="wall seconds per heterogeneous run")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 8.0)
    updates = 400 if args.quick else 2000
    print(f"{len(jax.local_devices())} devices ({jax.local_devices()[0].platform}), jax {jax.__version__}")
    task = st.tasks.get("digits-mlp", num_workers=8, batch_size=32)

    speed = [real_vs_replay(task, p, updates if p == "asp" else updates // 4) for p in ("asp", "bsp")]
    for r in speed:
        print(f"real vs replay {r['policy']:>4}: real {r['real_upd_per_s']:>8,.0f} upd/s | replay "
              f"{r['replay_upd_per_s']:>8,.0f} upd/s ({r['real_upd_per_s'] / r['replay_upd_per_s']:.2f}x) | "
              f"server busy {r['server_busy_ms_per_update']:.3f} ms/update ({r['server_busy_fraction']:.0%} of wall)")

    cluster = st.cluster.heterogeneous([1.0] * 4 + [2.6] * 4)
    het = heterogeneity(task, cluster, args.time_scale, seconds)
    print(f"4 fast + 4 slow (2.6x) workers, {args.time_scale:g} s per simulated s, {seconds:g} s per policy:")
    for p, r in het.items():
        print(f"  {p:>9}: real {r['real_upd_per_s']:7.1f} upd/s = {r['real_vs_bsp']:5.2f}x BSP | simulator "
              f"{r['sim_vs_bsp']:5.2f}x BSP | real/predicted {r['agreement']:.3f}")
    worst = max(abs(r["agreement"] - 1) for p, r in het.items() if p != "bsp")
    met = worst <= 0.15
    print(f"target (relative throughput within 15% of the simulator's): {'met' if met else 'NOT met'} "
          f"(worst {worst:.1%})")
    print(json.dumps({"benchmark": "runtime_speed", "devices": len(jax.local_devices()), "workers": 8,
                      "time_scale": args.time_scale, "seconds_per_policy": seconds,
                      "real_vs_replay": speed, "heterogeneous": het, "worst_deviation": worst,
                      "target_met": met}))


if __name__ == "__main__":
    main()
