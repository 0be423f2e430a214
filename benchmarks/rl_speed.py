"""Updates per second of the compiled replay of synchronous RL vs a plain on-policy RL loop in JAX
that decodes with a KV cache, and what the cache buys.

`rl_sync` on `rl-digits` (4 actors; a schedule from `st.simulate_schedule` on a
1 : 1 : 1.5 : 3 cluster: every update trains on one rollout of each actor, all generated on the
current version), in two settings: the task's default (completions of at most 8 tokens, median
3) and `long` (completions of exactly 32 tokens: max_digits 32, a constant length rule):
  ours     `st.engine.replay` of that schedule (one compiled chunk: `eval_every` = the number
           of updates), which also builds the initial parameters (the task's supervised warm
           start), evaluates twice (at update 0 and at the end) and records the learner's
           per-update diagnostics (an entropy pass and the probe's KL);
  plain    the loop a user would write: the same model, the task's KV-cached generation
           (`task.generate`) and update in ONE jitted `lax.scan` over updates; per update, for
           each actor a (one after the other, `lax.map`, as separate actors would compute them;
           a `vmap` over actors rounds the sampler's logits differently, and a token that flips
           sends the two runs apart):
               idx     = task.prompt_indices(data_key, a, u)
               rollout = task.generate(params, generation_key(data_key, a, u), idx)
               g_a     = grad of task.loss(params, rollout, stop_gradient(task.logp(params, rollout)))
           the mean of the g_a over actors, one `optax.adam(1e-3)` step (the task's own
           optimizer); timed with the same initial parameters and the same two evaluations;
  uncached ours on the same task built with kv_cache=False (every position recomputes its
           prefix: the engine's path before the cache), for the cache's speed-up.
Compile is excluded: each is run once untimed (the warm-up compiles it), then they are timed
interleaved `--reps` times (the machine is shared: loads change within seconds); a ratio is the
median of the ratios of adjacent pairs, in wall-clock time and in CPU time of the process.
The final parameters of ours and plain are compared and checked. They are the same mathematics
in two programs: the replay averages the slots of an update in the schedule's arrival order and
builds Adam as the task's optimizer spec (a chain with the learning rate in its state), plain
averages in actor order with `optax.adam`; each update rounds differently in float32 and the
difference accumulates over updates (measured: 1 ulp after 1 update, 2.7e-7 to 5.4e-7 of the
largest |parameter| per update at 16 to 80 updates). They are held to 1e-6 x updates x the
largest |parameter|; beyond it the script exits 1 after its JSON line, with one line on stderr.
Target: ours >= 0.8x plain in both settings. Prints ratios measured in this run; ends with one
JSON line.

    python benchmarks/rl_speed.py [--quick] [--reps N] [--updates N] [--settings default,long]
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import staleness as st
from _report import Agreement, difference, finish
from staleness.engine import core
from staleness.engine import run as _run
from staleness.engine.rollout import generation_key

NUM_ACTORS = 4
CLUSTER = [1.0, 1.0, 1.5, 3.0]
RTOL = 1e-6   # ours vs plain final parameters, per update, of the largest |parameter| (see the docstring)
SETTINGS = {"default": {}, "long": {"max_digits": 32, "length_rule": "constant:32"}}


def clock(fn):
    """(wall seconds, CPU seconds of this process) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def make_task(setting: str, kv_cache: bool = True):
    opts = dict(SETTINGS[setting])
    if opts.get("length_rule") == "constant:32":
        opts["length_rule"] = st.tasks.rl.lengths.constant(32)   # every completion 32 tokens
    return st.tasks.get("rl-digits", num_workers=NUM_ACTORS, kv_cache=kv_cache, **opts)


def plain_loop(task, n, seed=0, lr=1e-3):
    """`run()`: initial parameters, an evaluation, the plain loop (one jitted `lax.scan` of n
    updates), an evaluation; returns the final parameters."""
    init_key, data_key = core.keys(seed)
    tx = optax.adam(lr)
    actors = jnp.arange(task.num_workers)

    @jax.jit
    def train(task, params):
        def step(carry, u):
            params, state = carry

            def actor(a):
                idx = task.prompt_indices(data_key, a, u)
                rollout = task.generate(params, generation_key(data_key, a, u), idx)
                prox = lax.stop_gradient(task.logp(params, rollout))
                return jax.value_and_grad(task.loss)(params, rollout, prox)

            losses, grads = lax.map(actor, actors)
            updates, state = tx.update(jax.tree.map(lambda g: g.mean(0), grads), state, params)
            return (optax.apply_updates(params, updates), state), losses.mean()

        (params, _), losses = lax.scan(step, (params, tx.init(params)), jnp.arange(n))
        return params, losses

    def run():
        params = task.init_params(init_key)
        jax.device_get(core.evaluate(task, params))
        params, losses = train(task, params)
        jax.device_get(core.evaluate(task, params))
        return jax.device_get(params)

    return run


def measure(setting: str, n: int, reps: int) -> tuple[dict, Agreement]:
    task, uncached = make_task(setting), make_task(setting, kv_cache=False)
    policy = st.policies.parse("rl_sync")
    sched = st.simulate_schedule(policy, st.cluster.heterogeneous(CLUSTER), num_updates=n, seed=0,
                                 sizes=_run.work_sizes(task, policy, 0))
    assert sched.num_updates == n and (sched.staleness[sched.applied] == 0).all()
    runs = {"ours": lambda: st.engine.replay(sched, task, eval_every=n).params,
            "plain": plain_loop(task, n),
            "uncached": lambda: st.engine.replay(sched, uncached, eval_every=n).params}
    compile_s = {k: clock(lambda f=f: jax.block_until_ready(f()))[0] for k, f in runs.items()}   # warm-ups
    t = {k: [] for k in ("ours", "ours_cpu", "plain", "plain_cpu", "uncached", "uncached_cpu")}
    params = {}
    for _ in range(reps):
        for name, fn in runs.items():
            w, c = clock(lambda name=name, fn=fn: params.__setitem__(name, fn()))
            t[name].append(w)
            t[name + "_cpu"].append(c)
    med = statistics.median
    paired = lambda a, b: med([x / y for x, y in zip(t[a], t[b])])  # noqa: E731
    diff = difference(params["ours"], params["plain"])
    scale = max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree.leaves(params["plain"]))
    row = {"setting": setting, "max_completion_tokens": task.max_length, "updates": n, "reps": reps,
           "ours_upd_per_s": n / med(t["ours"]), "plain_upd_per_s": n / med(t["plain"]),
           "uncached_upd_per_s": n / med(t["uncached"]),
           "vs_plain": paired("plain", "ours"), "vs_plain_cpu": paired("plain_cpu", "ours_cpu"),
           "cache_speedup": paired("uncached", "ours"), "max_abs_param_diff": diff, "max_abs_param": scale,
           "compile_s": compile_s, "ours_s": t["ours"], "plain_s": t["plain"], "uncached_s": t["uncached"]}
    print(f"{setting} (completions up to {task.max_length} tokens, {n} updates, {reps} reps): ours "
          f"{row['ours_upd_per_s']:.2f} upd/s | plain (KV cache) {row['plain_upd_per_s']:.2f} upd/s | ours/plain "
          f"{row['vs_plain']:.2f}x wall, {row['vs_plain_cpu']:.2f}x cpu | the cache vs recomputing every prefix "
          f"{row['cache_speedup']:.2f}x ({row['uncached_upd_per_s']:.2f} upd/s uncached)")
    check = Agreement(f"the replay ({setting})", "the plain on-policy lax.scan loop", diff, RTOL * n * scale,
                      what="max |final parameter difference|",
                      why=f"{RTOL:g} x {n} updates x max |parameter| {scale:.3g}")
    print(f"  final params: max |ours - plain| = {diff:.3g} (tolerance {check.tolerance:.3g}: "
          f"{'within' if check.ok else 'BEYOND'})")
    return row, check


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 2 quick, 5 full)")
    ap.add_argument("--updates", type=int, default=None, help="updates (default 8 quick, 40 full)")
    ap.add_argument("--settings", default="default,long", help="comma-separated subset of " + ",".join(SETTINGS))
    args = ap.parse_args()
    reps = args.reps or (2 if args.quick else 5)
    n = args.updates or (8 if args.quick else 40)
    t0 = time.perf_counter()
    rows, checks = [], []
    for setting in args.settings.split(","):
        row, check = measure(setting, n, reps)
        rows.append(row)
        checks.append(check)
    ok = all(r["vs_plain"] >= 0.8 for r in rows)
    print(f"target ours >= 0.8x plain (KV cache) in every setting: {'met' if ok else 'NOT met'}; "
          f"total {time.perf_counter() - t0:.0f} s")
    finish({"benchmark": "rl_speed", "task": "rl-digits", "policy": "rl_sync", "actors": NUM_ACTORS,
            "rows": rows, "target": 0.8, "target_met": ok}, checks)


if __name__ == "__main__":
    main()
