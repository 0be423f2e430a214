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
Ours and the limit are timed interleaved, `--reps` times each (the machine is shared:
loads change within seconds); a ratio is the median of the ratios of adjacent pairs,
in wall-clock time (what a user waits) and in CPU time of the process (what it costs;
steadier on a loaded machine). Where ours' time goes, as shares of its wall time
(medians): the schedule (`simulate_schedule`), the evaluations (`task.evaluate`, one per
chunk plus the initial one) and the compiled chunks; `chunks_vs_limit` is the limit
against ours' compiled chunks alone (replayed by hand, no schedule, no evaluation).
Prints ratios measured in this run; ends with one JSON line.
Targets: ours >= 0.9x limit for ASP and SSP(3) on digits-mlp and the LM (issue #10);
>= 10x reference on the tiny MLP (issue #3); >= 0.8x on digits-mlp and >= 0.9x on the
LM at full size (issue #23, the streamed chunk runner).

    python benchmarks/sim_speed.py [--quick] [--reps N] [--tasks digits-mlp,stdlib-lm]
"""

import argparse
import json
import statistics
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


def clock(fn):
    """(wall seconds, CPU seconds of this process) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def limit_sgd(task, n, lr=0.05, seed=0):
    """Plain SGD, one lax.scan over a precomputed [n, μ] index table (built on the host
    before timing, as a user would precompute their batches). Returns a function that
    runs it (compiled here) and waits for the result."""
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
    return lambda: jax.block_until_ready(run(task, params, table))


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
    """(run: one `st.simulate` (compiled here), its keyword arguments)."""
    kw = dict(num_updates=n, seed=seed, lr=0.05, eval_every=max(1, n // 4), optimizer="sgd")
    st.simulate(task, policy, cluster, **kw)  # compile
    return lambda: st.simulate(task, policy, cluster, **kw), kw


def chunks_only(task, sched, kw):
    """ours' compiled chunks alone, on a prepared plan (inputs built before timing)."""
    from staleness.engine import core, plan as _plan, run as _run

    opt = _run.resolve_optimizer(kw["optimizer"], kw["lr"], sched.num_updates, task)
    plan = _plan.make_plan(sched, kw["eval_every"])
    consts = {"data_key": core.keys(kw["seed"])[1], "rule": jnp.int32(0)}
    xs = [core.pad_chunk(_plan.chunk_inputs(task, plan, k, consts["data_key"]),
                         min(plan.chunk, plan.num_updates - k * plan.chunk)) for k in range(plan.num_chunks)]
    rules = (st.lr.get("constant"),)

    def run():
        carry = core.init_carry(task, kw["seed"], opt, plan.ring)
        jax.block_until_ready(carry)
        t, c = time.perf_counter(), time.process_time()
        for x in xs:
            carry, _ = core.run_chunk(task, carry, x, consts, opt=opt.tx, rules=rules, slot_mode="vmap", local=None,
                                      padded=plan.padded_updates)
        jax.block_until_ready(carry)
        return time.perf_counter() - t, time.process_time() - c

    run()
    return run, plan.num_chunks + 1


def measure(task, pol, cluster, n, reps, lim):
    """Interleaved timings of ours and the limit (see the module docstring)."""
    run, kw = ours(task, pol, cluster, n)
    res = run()
    sched = res.schedule
    chunks, evals = chunks_only(task, sched, kw)
    evaluate = st.engine.core.evaluate
    params = task.init_params(st.engine.keys(0)[0])
    jax.block_until_ready(evaluate(task, params))
    t = {k: [] for k in ("ours", "ours_cpu", "limit", "limit_cpu", "schedule", "evals", "chunks", "chunks_cpu",
                         "chunks_limit", "chunks_limit_cpu")}
    for _ in range(reps):
        w, c = clock(lim)
        t["limit"].append(w)
        t["limit_cpu"].append(c)
        w, c = clock(run)
        t["ours"].append(w)
        t["ours_cpu"].append(c)
        t["schedule"].append(clock(lambda: st.simulate_schedule(pol, cluster, num_updates=n, seed=0))[0])
        t["evals"].append(clock(lambda: [jax.device_get(evaluate(task, params)) for _ in range(evals)])[0])
        for key, value in zip(("chunks", "chunks_cpu", "chunks_limit", "chunks_limit_cpu"), chunks() + clock(lim)):
            t[key].append(value)
    med = statistics.median
    paired = lambda a, b: med([x / y for x, y in zip(t[a], t[b])])  # noqa: E731
    g = sched.num_gradients
    return res, {
        "gradients": g, "reps": reps,
        "ours_grad_per_s": g / med(t["ours"]), "limit_grad_per_s": n / med(t["limit"]),
        "vs_limit": paired("limit", "ours") * g / n, "vs_limit_cpu": paired("limit_cpu", "ours_cpu") * g / n,
        "chunks_vs_limit": paired("chunks_limit", "chunks") * g / n,
        "chunks_vs_limit_cpu": paired("chunks_limit_cpu", "chunks_cpu") * g / n,
        "schedule_share_of_time": med(t["schedule"]) / med(t["ours"]),
        "eval_share_of_time": med(t["evals"]) / med(t["ours"]),
        "chunks_share_of_time": med(t["chunks"]) / med(t["ours"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 3 quick, 5 full)")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of digits-mlp,tiny-mlp,stdlib-lm")
    args = ap.parse_args()
    args.reps = args.reps or (3 if args.quick else 5)
    lam = 16
    cluster = st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1)
    n = {"digits-mlp": 2000 if args.quick else 8000, "tiny-mlp": 4000 if args.quick else 20000,
         "stdlib-lm": 100 if args.quick else 400}
    names = ["digits-mlp", "tiny-mlp"] + (["stdlib-lm"] if "stdlib-lm" in st.tasks.names() else [])
    if args.tasks:
        names = [x for x in args.tasks.split(",") if x in names]
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
            res, row = measure(task, pol, cluster, n[name], args.reps, lim)
            ref = reference_loop(task, res.schedule, max_gradients=min(n[name], 2000))
            row = {"task": name, "policy": pol.describe(), **row, "reference_grad_per_s": ref,
                   "vs_reference": row["ours_grad_per_s"] / ref}
            rows.append(row)
            print(f"{name:>10} {pol.describe():>6}: ours {row['ours_grad_per_s']:>9,.0f} grad/s | limit "
                  f"{row['limit_grad_per_s']:>9,.0f} ({row['vs_limit']:.2f}x wall, {row['vs_limit_cpu']:.2f}x cpu; "
                  f"chunks alone {row['chunks_vs_limit']:.2f}x wall, {row['chunks_vs_limit_cpu']:.2f}x cpu) | reference {ref:>8,.0f} ({row['vs_reference']:.1f}x) | "
                  f"ours' time: schedule {row['schedule_share_of_time']:.0%}, evals {row['eval_share_of_time']:.0%}, "
                  f"chunks {row['chunks_share_of_time']:.0%}")
    met = (all(r["vs_limit"] >= 0.9 for r in rows if r["task"] != "tiny-mlp")
           and all(r["vs_reference"] >= 10 for r in rows if r["task"] == "tiny-mlp"))
    # issue #23 (the streamed chunk runner): >= 0.8x on digits-mlp, >= 0.9x on the LM, at full size
    need = {"digits-mlp": 0.8, "stdlib-lm": 0.9}
    met23 = None if args.quick else all(r["vs_limit"] >= need[r["task"]] for r in rows if r["task"] in need)
    print(f"targets (>= 0.9x limit on digits-mlp and the LM, >= 10x reference on tiny): {'met' if met else 'NOT met'}")
    print("issue #23 targets (>= 0.8x limit on digits-mlp, >= 0.9x on the LM; full size only): "
          + ("not measured (--quick)" if met23 is None else "met" if met23 else "NOT met"))
    print(json.dumps({"benchmark": "sim_speed", "workers": lam, "rows": rows, "targets_met": met,
                      "issue23_targets_met": met23}))


if __name__ == "__main__":
    main()
