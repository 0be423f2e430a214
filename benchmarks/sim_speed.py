"""Gradients per second of the compiled replay vs the fastest plain training loop and a Python event loop.

For ASP and SSP(3) with λ = 16 workers on a jittered 1 : 2.6 cluster, on
`digits-mlp` (μ = 32), a tiny MLP (digits, 16 hidden units, μ = 8) and the
byte-level transformer `stdlib-lm` (if present):
  ours       `staleness.simulate` (schedule + compiled replay; compile excluded by a warm-up)
  limit      the fastest plain training a user would write: one jitted `lax.scan` of
             SGD over a precomputed table of minibatch indices (the gather of the
             task's `gather_fn`, no sampling, no staleness bookkeeping at all)
  reference  what a researcher would write first: a Python loop over the
             schedule's events, one jitted gradient call per gradient and one
             jitted apply per update, keeping every pulled version in a dict.
Prints ratios measured in this run; ends with one JSON line.
Targets: ours >= 0.9x limit for ASP and SSP(3) on digits-mlp and the LM (issue #10);
>= 10x reference on the tiny MLP (issue #3).

    python benchmarks/sim_speed.py [--quick]
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

import staleness as st
from staleness.tasks import data as task_data
from staleness.tasks import models
from staleness.tasks.registry import classification_task


def tiny_task(num_workers):
    return classification_task("tiny-mlp", models.MLP(hidden=(16,), num_outputs=10), task_data.digits(),
                               batch_size=8, num_workers=num_workers)


def limit_sgd(task, n, lr=0.05, seed=0):
    """Plain SGD, one lax.scan over a precomputed [n, μ] index table (built on the host
    before timing, as a user would precompute their batches)."""
    init_key, data_key = st.engine.keys(seed)
    it = np.arange(n)
    table = task.host_indices(data_key, it % 16, it)          # [n, μ]

    @jax.jit
    def run(task, params, table):
        def step(p, x):
            i, index = x
            g = jax.grad(task.loss)(p, task.batch(index, data_key, i % 16, i))
            return jax.tree.map(lambda a, b: a - lr * b, p, g), None
        return jax.lax.scan(step, params, (jnp.arange(n), table))[0]

    params = task.init_params(init_key)
    jax.block_until_ready(run(task, params, table))
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        jax.block_until_ready(run(task, params, table))
        best = min(best, time.perf_counter() - t0)
    return n / best


def reference_loop(task, sched, lr=0.05, seed=0, max_gradients=None):
    """One jitted grad per gradient, one jitted apply per update, versions in a dict."""
    init_key, data_key = st.engine.keys(seed)
    grad = jax.jit(lambda p, w, i: jax.grad(task.loss)(p, task.minibatch(data_key, w, i)))
    apply = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - lr * b, p, g))
    f = sched.columns
    order = np.argsort(f["apply_version"], kind="stable")
    order = order[f["apply_version"][order] >= 0]
    if max_gradients:
        order = order[:max_gradients]
    versions = {0: task.init_params(init_key)}
    params = versions[0]
    g0 = grad(params, 0, 0)
    jax.block_until_ready(apply(params, g0))
    t0 = time.perf_counter()
    for k in order:
        g = grad(versions[int(f["pull_version"][k])], int(f["worker"][k]), int(f["iteration"][k]))
        params = apply(params, g)
        v = int(f["apply_version"][k]) + 1
        versions[v] = params
        versions.pop(v - 64, None) if v - 64 not in set(f["pull_version"][k:k + 64]) else None
    jax.block_until_ready(params)
    return len(order) / (time.perf_counter() - t0)


def ours(task, policy, cluster, n, seed=0):
    kw = dict(num_updates=n, seed=seed, lr=0.05, eval_every=n // 4, optimizer="sgd")
    st.simulate(task, policy, cluster, **kw)  # compile
    dt = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        r = st.simulate(task, policy, cluster, **kw)
        dt = min(dt, time.perf_counter() - t0)
    sched_t0 = time.perf_counter()
    st.simulate_schedule(policy, cluster, num_updates=n, seed=seed)
    sched_dt = time.perf_counter() - sched_t0
    return r.schedule.num_gradients / dt, sched_dt / dt, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    lam = 16
    cluster = st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1)
    n = {"digits-mlp": 2000 if args.quick else 8000, "tiny-mlp": 4000 if args.quick else 20000,
         "stdlib-lm": 100 if args.quick else 400}
    names = ["digits-mlp", "tiny-mlp"] + (["stdlib-lm"] if "stdlib-lm" in st.tasks.names() else [])
    rows = []
    for name in names:
        if name == "tiny-mlp":
            task = tiny_task(lam)
        elif name == "digits-mlp":
            task = st.tasks.get(name, batch_size=32, num_workers=lam)
        else:
            task = st.tasks.get(name, num_workers=lam)
        lim = limit_sgd(task, n[name])
        for pol in (st.policies.asp(), st.policies.ssp(3)):
            g_s, sched_share, res = ours(task, pol, cluster, n[name])
            ref = reference_loop(task, res.schedule, max_gradients=min(n[name], 2000))
            row = {"task": name, "policy": pol.describe(), "gradients": res.schedule.num_gradients,
                   "ours_grad_per_s": g_s, "limit_grad_per_s": lim, "reference_grad_per_s": ref,
                   "vs_limit": g_s / lim, "vs_reference": g_s / ref, "schedule_share_of_time": sched_share}
            rows.append(row)
            print(f"{name:>10} {pol.describe():>6}: ours {g_s:>9,.0f} grad/s | limit {lim:>9,.0f} "
                  f"({g_s / lim:.2f}x) | reference {ref:>8,.0f} ({g_s / ref:.1f}x) | schedule {sched_share:.0%} of ours")
    met = (all(r["vs_limit"] >= 0.9 for r in rows if r["task"] != "tiny-mlp")
           and all(r["vs_reference"] >= 10 for r in rows if r["task"] == "tiny-mlp"))
    print(f"targets (>= 0.9x limit on digits-mlp and the LM, >= 10x reference on tiny): {'met' if met else 'NOT met'}")
    print(json.dumps({"benchmark": "sim_speed", "workers": lam, "rows": rows, "targets_met": met}))


if __name__ == "__main__":
    main()
