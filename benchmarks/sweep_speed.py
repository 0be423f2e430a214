"""32 configurations through one `sweep` vs 32 sequential `simulate` calls.

Tiny MLP (digits, 16 hidden units, μ = 8), λ = 16 workers on a jittered
1 : 2.6 cluster; configurations = 4 policies (asp, ssp:3, ssp:15, dssp:3:12)
x 4 seeds x 2 lr rules (constant, per_gradient). Both sides include schedule
simulation and compilation (a user pays both). Ends with one JSON line.
Target (issue #3): sweep >= 4x faster than sequential simulate calls.

    python benchmarks/sweep_speed.py [--quick]
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import staleness as st
from staleness.tasks import data as task_data
from staleness.tasks import models
from staleness.tasks.registry import classification_task


def cold(side: str, quick: bool) -> float:
    """Seconds for one side in a fresh interpreter (after imports and task creation),
    so neither side inherits the other's compiled functions."""
    out = subprocess.run([sys.executable, __file__, "--side", side] + (["--quick"] * quick),
                         capture_output=True, text=True, timeout=1200, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--side", choices=["sweep", "sequential"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = 1000 if args.quick else 4000
    lam = 16
    task = classification_task("tiny-mlp", models.MLP(hidden=(16,), num_outputs=10), task_data.digits(),
                               batch_size=8, num_workers=lam)
    cluster = st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1)
    pols = ["asp", "ssp:3", "ssp:15", "dssp:3:12"]
    seeds = [0, 1, 2, 3]
    rules = ["constant", "per_gradient"]
    kw = dict(num_updates=n, eval_every=n // 10)
    if args.side:
        t0 = time.perf_counter()
        if args.side == "sweep":
            st.sweep(task, pols, cluster, seeds=seeds, lr_rules=rules, lrs=[0.05], **kw)
        else:
            for p in pols:
                for s in seeds:
                    for r in rules:
                        st.simulate(task, p, cluster, seed=s, lr_rule=r, lr=0.05, **kw)
        print(time.perf_counter() - t0)
        return
    t_sweep_cold, t_seq_cold = cold("sweep", args.quick), cold("sequential", args.quick)

    t0 = time.perf_counter()
    swept = st.sweep(task, pols, cluster, seeds=seeds, lr_rules=rules, lrs=[0.05], **kw)
    t_sweep = time.perf_counter() - t0

    t0 = time.perf_counter()
    singles = [st.simulate(task, p, cluster, seed=s, lr_rule=r, lr=0.05, **kw)
               for p in pols for s in seeds for r in rules]
    t_seq = time.perf_counter() - t0

    # Warm: both sides again with every compiled function cached (steady state).
    t0 = time.perf_counter()
    st.sweep(task, pols, cluster, seeds=seeds, lr_rules=rules, lrs=[0.05], **kw)
    t_sweep_warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in pols:
        for s in seeds:
            for r in rules:
                st.simulate(task, p, cluster, seed=s, lr_rule=r, lr=0.05, **kw)
    t_seq_warm = time.perf_counter() - t0

    gap = max(float(np.max(np.abs(a.history["accuracy"].to_numpy() - b.history["accuracy"].to_numpy())))
              for a, b in zip(swept, singles))
    grads = sum(r.schedule.num_gradients for r in singles)
    print(f"32 configs x {n} updates ({grads:,} gradients); max |accuracy difference| sweep vs simulate {gap:.2e}")
    print(f"cold (fresh process each, compile included): sweep {t_sweep_cold:.2f} s, sequential simulate "
          f"{t_seq_cold:.2f} s -> {t_seq_cold / t_sweep_cold:.1f}x")
    print(f"in one process, sweep first: sweep {t_sweep:.2f} s, sequential {t_seq:.2f} s -> {t_seq / t_sweep:.1f}x")
    print(f"warm (compiled, cached): sweep {t_sweep_warm:.2f} s, sequential {t_seq_warm:.2f} s -> "
          f"{t_seq_warm / t_sweep_warm:.1f}x")
    best = max(t_seq_cold / t_sweep_cold, t_seq_warm / t_sweep_warm)
    print(f"target >= 4x: cold {t_seq_cold / t_sweep_cold:.1f}x, warm {t_seq_warm / t_sweep_warm:.1f}x: "
          f"{'met' if t_seq_cold / t_sweep_cold >= 4 else 'NOT met (cold)'}")
    print(json.dumps({"benchmark": "sweep_speed", "configs": len(swept), "updates": n,
                      "sweep_cold_s": t_sweep_cold, "sequential_cold_s": t_seq_cold,
                      "speedup_cold": t_seq_cold / t_sweep_cold, "sweep_s": t_sweep,
                      "sequential_s": t_seq, "speedup": t_seq / t_sweep, "sweep_warm_s": t_sweep_warm,
                      "sequential_warm_s": t_seq_warm, "speedup_warm": t_seq_warm / t_sweep_warm,
                      "max_accuracy_gap": gap, "best_speedup": best,
                      "target_met": t_seq_cold / t_sweep_cold >= 4}))


if __name__ == "__main__":
    main()
