"""Gradients per second of the compiled replay vs plain SGD and a Python event loop.

For ASP and SSP(3) with λ = 16 workers on a jittered 1 : 2.6 cluster, on
`digits-mlp` (μ = 32) and a tiny MLP (digits, 16 hidden units, μ = 8):
  ours       `staleness.simulate` (schedule + compiled replay; compile excluded by a warm-up)
  limit      plain SGD as one jitted `lax.scan` with the same number of gradient
             evaluations and minibatch size (no staleness bookkeeping at all)
  reference  what a researcher would write first: a Python loop over the
             schedule's events, one jitted gradient call per gradient and one
             jitted apply per update, keeping every pulled version in a dict.
Prints ratios measured in this run; ends with one JSON line.
Targets (issue #3): ours >= 0.9x limit on both tasks; >= 10x reference on the tiny MLP.

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
    init_key, data_key = st.engine.keys(seed)

    @jax.jit
    def run(task, params):
        def step(p, i):
            g = jax.grad(task.loss)(p, task.minibatch(data_key, i % 16, i))
            return jax.tree.map(lambda a, b: a - lr * b, p, g), None
        return jax.lax.scan(step, params, jnp.arange(n))[0]

    params = task.init_params(init_key)
    jax.block_until_ready(run(task, params))
    t0 = time.perf_counter()
    jax.block_until_ready(run(task, params))
    return n / (time.perf_counter() - t0)


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
    kw = dict(num_updates=n, seed=seed, lr=0.05, eval_every=n // 4)
    st.simulate(task, policy, cluster, **kw)  # compile
    t0 = time.perf_counter()
    r = st.simulate(task, policy, cluster, **kw)
    dt = time.perf_counter() - t0
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
    n = {"digits-mlp": 2000 if args.quick else 8000, "tiny-mlp": 4000 if args.quick else 20000}
    rows = []
    for name in ("digits-mlp", "tiny-mlp"):
        task = st.tasks.get(name, batch_size=32, num_workers=lam) if name == "digits-mlp" else tiny_task(lam)
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
    met = all(r["vs_limit"] >= 0.9 for r in rows) and all(r["vs_reference"] >= 10 for r in rows if r["task"] == "tiny-mlp")
    print(f"targets (>= 0.9x limit, >= 10x reference on tiny): {'met' if met else 'NOT met'}")
    print(json.dumps({"benchmark": "sim_speed", "workers": lam, "rows": rows, "targets_met": met}))


if __name__ == "__main__":
    main()
