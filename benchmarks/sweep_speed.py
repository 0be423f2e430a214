"""32 configurations through one `sweep` vs 32 sequential `simulate` calls.

Tiny MLP (digits, 16 hidden units, μ = 8), λ = 16 workers on a jittered
1 : 2.6 cluster; configurations = 4 policies (asp, ssp:3, ssp:15, dssp:3:12)
x 4 seeds x 2 lr rules (constant, per_gradient). Both sides include schedule
simulation and compilation (a user pays both). The sweep pins its padding
(ring=, slots=: one compiled replay for the grid) and reports its compile
seconds apart (JAX's compile-event durations, `config['compile_s']`); with
--devices N it also shards the grid over N virtual CPU devices. Ends with one
JSON line. Targets (issue #13): >= 4x warm and >= 3x cold over sequential
simulate calls; (issue #25) >= 2x warm on 2 cores, the schedules on every core, and a
projection for 16 cores.

Agreement (checked: the script exits 1, after its JSON line, when a check fails): on CPU
every configuration of the sweep is BITWISE its sequential `st.simulate` (final parameters
and the whole history: tolerance 0, whatever else is in the grid), and with --devices N the
sharded sweep is bitwise the one-device sweep (README: "On CPU the Results are bitwise
those of one device"). Off CPU nothing is documented: the final parameters are held to
float32 rounding between the grid program and a single run's program, 1e-5 of the
largest |parameter| (an accelerator may fuse or tile the two differently), and the
histories are not checked (a rounding-level difference can move a test example across the
decision boundary). Speed targets are reported, not checked.

    python benchmarks/sweep_speed.py [--quick] [--devices 2]
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from jax.tree_util import tree_leaves as jax_leaves

import staleness as st
from _report import BITWISE, Agreement, difference, finish
from staleness.tasks import data as task_data
from staleness.tasks import models
from staleness.tasks.registry import classification_task


RING, SLOTS = 64, 1   # pinned padding: >= the largest staleness + 1 of these schedules, one gradient per update
RTOL_OFF_CPU = 1e-5   # final parameters off CPU (nothing documented): float32 rounding of two programs


def label(r) -> str:
    c = r.config
    return f"{c.get('policy')} seed {c.get('seed')} lr_rule {c.get('lr_rule')} lr {c.get('lr')}"


def agreement(first: str, second: str, runs_a: list, runs_b: list, on_cpu: bool) -> list[Agreement]:
    """Paired Results of two paths (in grid order), configuration by configuration: final
    parameters and histories bitwise on CPU (off CPU: parameters within RTOL_OFF_CPU of the
    largest |parameter|, histories unchecked). One check per part, the worst configuration's."""
    def diff(a, b, part):
        if label(a) != label(b):   # not the same configuration: nothing to compare
            return np.inf
        if part == "history":
            same_cols = list(a.history.columns) == list(b.history.columns)
            return difference(a.history.to_numpy(), b.history.to_numpy()) if same_cols else np.inf
        return difference(a.params, b.params)

    scale = max((float(np.max(np.abs(x))) for r in runs_b for x in jax_leaves(r.params) if np.size(x)), default=0.0)
    tol = BITWISE if on_cpu else RTOL_OFF_CPU * scale
    checks = []
    for part in ["final parameter"] + (["history"] if on_cpu else []):
        diffs = [diff(a, b, part) for a, b in zip(runs_a, runs_b)] + [np.inf] * (len(runs_a) != len(runs_b))
        k = int(np.argmax(diffs)) if diffs else 0
        worst = label(runs_a[k]) if k < len(runs_a) else "a configuration missing on one side"
        bad = sum(d > tol for d in diffs)
        checks.append(Agreement(
            first, second, float(max(diffs, default=0.0)), tol,
            what=f"max |{part} difference| over {len(runs_a)} configurations",
            why="bitwise on CPU" if on_cpu else f"{RTOL_OFF_CPU:g} x max |parameter| off CPU",
            detail=f"{bad} of {len(diffs)} configurations differ; worst: {worst}" if bad else ""))
    return checks


def cold(side: str, quick: bool, devices: int) -> tuple[float, float]:
    """(seconds, compile seconds) of one side in a fresh interpreter (after imports and
    task creation), so neither side inherits the other's compiled functions."""
    out = subprocess.run([sys.executable, __file__, "--side", side, "--devices", str(devices)]
                         + (["--quick"] * quick), capture_output=True, text=True, timeout=1200, check=True).stdout
    total, compile_s = out.strip().splitlines()[-1].split()
    return float(total), float(compile_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--devices", type=int, default=1, help="also shard the sweep over N virtual CPU devices")
    ap.add_argument("--side", choices=["sweep", "sequential", "sharded"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    import jax

    if args.devices > 1:
        jax.config.update("jax_num_cpu_devices", args.devices)
    from staleness.engine.sweeps import compile_seconds
    n = 1000 if args.quick else 4000
    lam = 16
    task = classification_task("tiny-mlp", models.MLP(hidden=(16,), num_outputs=10), task_data.digits(),
                               batch_size=8, num_workers=lam)
    cluster = st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1)
    pols = ["asp", "ssp:3", "ssp:15", "dssp:3:12"]
    seeds = [0, 1, 2, 3]
    rules = ["constant", "per_gradient"]
    kw = dict(num_updates=n, eval_every=n // 10)
    grid = dict(seeds=seeds, lr_rules=rules, lrs=[0.05], ring=RING, slots=SLOTS, **kw)

    def sequential():
        return [st.simulate(task, p, cluster, seed=s, lr_rule=r, lr=0.05, **kw)
                for p in pols for s in seeds for r in rules]

    if args.side:
        c0 = compile_seconds()
        t0 = time.perf_counter()
        if args.side == "sweep":
            st.sweep(task, pols, cluster, **grid)
        elif args.side == "sharded":
            st.sweep(task, pols, cluster, devices=args.devices, **grid)
        else:
            sequential()
        print(time.perf_counter() - t0, compile_seconds() - c0)
        return
    (t_sweep_cold, c_sweep_cold), (t_seq_cold, c_seq_cold) = (cold("sweep", args.quick, args.devices),
                                                              cold("sequential", args.quick, args.devices))
    t_shard_cold = cold("sharded", args.quick, args.devices)[0] if args.devices > 1 else None

    c0 = compile_seconds()
    t0 = time.perf_counter()
    swept = st.sweep(task, pols, cluster, **grid)
    t_sweep = time.perf_counter() - t0
    c_sweep = compile_seconds() - c0

    c0 = compile_seconds()
    t0 = time.perf_counter()
    singles = sequential()
    t_seq = time.perf_counter() - t0
    c_seq = compile_seconds() - c0

    # Warm: both sides again with every compiled function cached (steady state).
    t0 = time.perf_counter()
    st.sweep(task, pols, cluster, **grid)
    t_sweep_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    sequential()
    t_seq_warm = time.perf_counter() - t0
    t_shard_warm = None
    if args.devices > 1:
        sharded = st.sweep(task, pols, cluster, devices=args.devices, **grid)   # compiles the sharded replay
        t0 = time.perf_counter()
        st.sweep(task, pols, cluster, devices=args.devices, **grid)
        t_shard_warm = time.perf_counter() - t0

    # The sweep's schedules alone: one after another vs on every core (`staleness.sim.pool`, which the
    # sweep uses once they are estimated at MIN_SECONDS or more), and what 16 cores would give.
    from staleness.sim import pool as sim_pool

    jobs = [dict(policy=p, cluster=cluster, num_updates=n, seed=x) for p in pols for x in seeds]
    t0 = time.perf_counter()
    [st.simulate_schedule(**job) for job in jobs]
    t_sched_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    sim_pool.simulate_schedules(jobs, min_seconds=0.0)
    t_sched_pool = time.perf_counter() - t0
    pooled = sum(sim_pool.estimate_seconds(job) for job in jobs) >= sim_pool.MIN_SECONDS
    cores = os.cpu_count() or 1
    # 16 cores, projected: the schedules split over min(16, schedules) processes (each paying the
    # measured start-up, ~(pool time - one-core time / cores)), the rest of the warm sweep unchanged
    start = max(0.0, t_sched_pool - t_sched_one / min(cores, len(jobs)))
    t16 = (t_sweep_warm - (t_sched_pool if pooled else t_sched_one)) + t_sched_one / min(16, len(jobs)) + start
    print(f"schedules ({len(jobs)}): one after another {t_sched_one:.2f} s, on {cores} cores {t_sched_pool:.2f} s "
          f"(the sweep {'pools them: estimated at' if pooled else 'keeps them here: estimated under'} "
          f"{sim_pool.MIN_SECONDS:g} s{' or more' if pooled else ''}); projected on 16 cores, the rest unchanged: warm sweep {t16:.2f} s -> "
          f"{t_seq_warm / t16:.1f}x")
    on_cpu = jax.default_backend() == "cpu"
    gap = max(difference(a.history["accuracy"].to_numpy(), b.history["accuracy"].to_numpy())
              for a, b in zip(swept, singles))
    checks = agreement(f"st.sweep ({len(swept)} configurations, ring={RING}, slots={SLOTS})",
                       "sequential st.simulate", swept, singles, on_cpu)
    grads = sum(r.schedule.num_gradients for r in singles)
    print(f"32 configs x {n} updates ({grads:,} gradients); sweep vs simulate: max |accuracy difference| "
          f"{gap:.2e}, max |final parameter difference| {checks[0].measured:.2e}"
          + (f", max |history difference| {checks[1].measured:.2e}" if on_cpu else "")
          + f" (tolerance {checks[0].tolerance:g}{': bitwise' if on_cpu else ''})")
    same = None
    if args.devices > 1:
        shard_checks = agreement(f"st.sweep(devices={args.devices})", "one-device st.sweep", sharded, swept, on_cpu)
        checks += shard_checks
        same = all(c.measured == 0 for c in shard_checks)
    cold_x, warm_x = t_seq_cold / t_sweep_cold, t_seq_warm / t_sweep_warm
    print(f"cold (fresh process each, compile included): sweep {t_sweep_cold:.2f} s (compiling {c_sweep_cold:.2f} s), "
          f"sequential simulate {t_seq_cold:.2f} s (compiling {c_seq_cold:.2f} s) -> {cold_x:.1f}x")
    print(f"in one process, sweep first: sweep {t_sweep:.2f} s (compiling {c_sweep:.2f} s), sequential "
          f"{t_seq:.2f} s (compiling {c_seq:.2f} s) -> {t_seq / t_sweep:.1f}x")
    print(f"warm (compiled, cached): sweep {t_sweep_warm:.2f} s, sequential {t_seq_warm:.2f} s -> {warm_x:.1f}x")
    if args.devices > 1:
        print(f"sharded over {args.devices} CPU devices: cold {t_shard_cold:.2f} s -> {t_seq_cold / t_shard_cold:.1f}x, "
              f"warm {t_shard_warm:.2f} s -> {t_seq_warm / t_shard_warm:.1f}x; bitwise the one-device sweep: {same}")
    met = warm_x >= 4 and cold_x >= 3
    print(f"targets >= 4x warm, >= 3x cold: warm {warm_x:.1f}x, cold {cold_x:.1f}x: {'met' if met else 'NOT met'}")
    finish({"benchmark": "sweep_speed", "configs": len(swept), "updates": n, "ring": RING, "slots": SLOTS,
            "sweep_cold_s": t_sweep_cold, "sweep_cold_compile_s": c_sweep_cold,
            "sequential_cold_s": t_seq_cold, "sequential_cold_compile_s": c_seq_cold,
            "speedup_cold": cold_x, "sweep_s": t_sweep, "sweep_compile_s": c_sweep,
            "sequential_s": t_seq, "sequential_compile_s": c_seq, "speedup": t_seq / t_sweep,
            "sweep_warm_s": t_sweep_warm, "sequential_warm_s": t_seq_warm, "speedup_warm": warm_x,
            "devices": args.devices, "sharded_cold_s": t_shard_cold, "sharded_warm_s": t_shard_warm,
            "schedules_one_core_s": t_sched_one, "schedules_pool_s": t_sched_pool,
            "schedules_pooled_in_sweep": pooled, "projected_16_core_warm_speedup": t_seq_warm / t16,
            "max_accuracy_gap": gap, "max_param_diff_sweep_vs_simulate": checks[0].measured,
            "sharded_bitwise_one_device": same, "target_met": met}, checks)


if __name__ == "__main__":
    main()
