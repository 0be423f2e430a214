"""Per built-in task: compile time, gradients per second against the plain-loop limit, peak memory.

Each task runs in a fresh process (so compile caches and peak memory are its own):
  build_s     building the task (data loading/generation, shapes)
  compile_s   first `st.simulate` minus a second identical one (compilation of the replay)
  ours        gradients/s of `st.simulate` after the first (ASP, 8 workers on a jittered 1 : 2.6 cluster,
              schedule included); timed `--reps` times interleaved with the limit, medians
              (vs_limit: the median ratio of adjacent pairs)
  limit       gradients/s of plain SGD as one jitted `lax.scan` over a precomputed index table
              (tasks whose minibatches are drawn on the device: `task.minibatch` inside the scan)
  peak_rss    the process's peak resident memory (GB)
CIFAR tasks run when --cifar-dir (or STALENESS_CIFAR_DIR) points to the python-pickle batches.
Ends with one JSON line.

    python benchmarks/workloads.py [--quick] [--tasks digits-mlp,stdlib-lm] [--cifar-dir DIR]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

UPDATES = {"quadratic": 4000, "linreg": 4000, "digits-mlp": 4000, "digits-cnn": 1000, "mnist1d-mlp": 4000,
           "mnist1d-cnn": 1000, "cifar10-resnet20": 40, "cifar100-resnet20": 40, "stdlib-lm": 200}


def measure(name: str, updates: int, data_dir=None, reps: int = 3) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import staleness as st

    t0 = time.perf_counter()
    kwargs = {"data_dir": data_dir} if "cifar" in name else {}
    task = st.tasks.get(name, num_workers=8, **kwargs)
    jax.block_until_ready(jax.tree.leaves(task.data))
    build_s = time.perf_counter() - t0
    cluster = st.cluster.heterogeneous([1.0] * 4 + [2.6] * 4).jitter(0.1)
    kw = dict(num_updates=updates, seed=0, eval_every=max(1, updates // 2))
    t0 = time.perf_counter()
    st.simulate(task, "asp", cluster, **kw)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = st.simulate(task, "asp", cluster, **kw)
    second = time.perf_counter() - t0

    init_key, data_key = st.engine.keys(0)
    tx = st.engine.optimizer(task.optimizer or "sgd", None if task.optimizer else 0.05).tx
    it = np.arange(updates)
    table = task.host_indices(data_key, it % 8, it) if task.indexed else np.zeros((updates, 1), np.int32)

    @jax.jit
    def run(task, params, state, table):
        def step(carry, x):
            p, s = carry
            i, index = x
            batch = task.batch(index, data_key, i % 8, i) if task.indexed else task.minibatch(data_key, i % 8, i)
            g = jax.grad(task.loss)(p, batch)
            u, s = tx.update(g, s, p)
            return (jax.tree.map(lambda a, b: a + b, p, u), s), None
        return jax.lax.scan(step, (params, state), (jnp.arange(updates), table))[0]

    params = task.init_params(init_key)
    state = tx.init(params)
    jax.block_until_ready(run(task, params, state, table))
    ours_s, limit_s = [second], []
    for rep in range(reps):   # interleaved: the machine's load changes within seconds
        t0 = time.perf_counter()
        jax.block_until_ready(run(task, params, state, table))
        limit_s.append(time.perf_counter() - t0)
        if rep + 1 < reps:
            t0 = time.perf_counter()
            st.simulate(task, "asp", cluster, **kw)
            ours_s.append(time.perf_counter() - t0)
    g = res.schedule.num_gradients
    ours = g / statistics.median(ours_s)
    limit = updates / statistics.median(limit_s)
    vs_limit = statistics.median([lim / o for o, lim in zip(ours_s, limit_s)]) * g / updates
    final = {k: float(v) for k, v in res.final.items() if k not in ("update", "time")}
    return {"task": name, "updates": updates, "build_s": build_s, "compile_s": max(0.0, first - second),
            "ours_grad_per_s": ours, "limit_grad_per_s": limit, "vs_limit": vs_limit, "reps": reps,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "final": final,
            "params": task.param_count}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the updates")
    ap.add_argument("--tasks", default=None, help="comma-separated task names (default: every built-in task)")
    ap.add_argument("--cifar-dir", default=os.environ.get("STALENESS_CIFAR_DIR"))
    ap.add_argument("--reps", type=int, default=3, help="interleaved timings of ours and the limit (median ratio)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)   # child process: one task
    args = ap.parse_args()
    if args.one:
        n = UPDATES.get(args.one, 1000) // (4 if args.quick else 1)
        print(json.dumps(measure(args.one, max(8, n), args.cifar_dir, max(1, args.reps))))
        return
    import staleness as st

    names = args.tasks.split(",") if args.tasks else st.tasks.names()
    rows = []
    for name in names:
        if "cifar" in name and not args.cifar_dir:
            print(f"{name:>18}: skipped (no --cifar-dir)")
            continue
        cmd = [sys.executable, __file__, "--one", name, "--reps", str(args.reps)] + (["--quick"] if args.quick else [])
        if args.cifar_dir:
            cmd += ["--cifar-dir", args.cifar_dir]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            print(f"{name:>18}: failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{name:>18}: build {row['build_s']:5.1f} s | compile {row['compile_s']:5.1f} s | ours "
              f"{row['ours_grad_per_s']:>9,.0f} grad/s | limit {row['limit_grad_per_s']:>9,.0f} "
              f"({row['vs_limit']:.2f}x) | peak {row['peak_rss_gb']:.2f} GB | {row['params']:,} params")
    print(json.dumps({"benchmark": "workloads", "rows": rows}))


if __name__ == "__main__":
    main()
